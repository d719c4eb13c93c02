//! Views of a recording for people and scripts.

pub mod dump;
pub mod perfetto;
pub mod protocols;
pub mod report;
/// Checks JSON against the committed report schema (the subset of JSON Schema it uses).
pub mod schema_check;
