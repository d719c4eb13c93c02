//! Views of a recording for people and scripts.

pub mod dump;
pub mod perfetto;
pub mod report;
#[cfg(test)]
mod schema_check;
