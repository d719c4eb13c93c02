//! Views of a recording for people and scripts.

pub mod diff;
pub mod dump;
pub mod perfetto;
pub mod protocols;
pub mod report;
