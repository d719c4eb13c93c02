//! Views of a recording for people and scripts.

pub mod diff;
pub mod dump;
#[cfg(feature = "perfetto")]
pub mod perfetto;
pub mod protocols;
pub mod report;

use crate::ingest::record::FileHeader;

/// A recording's time origin in the trace and the report: the earliest of its start
/// and its first event.
pub(crate) fn start_ns(header: &FileHeader, first_event: Option<u64>) -> u64 {
    match (header.start_monotonic_ns, first_event) {
        (0, first) => first.unwrap_or(0),
        (s, first) => s.min(first.unwrap_or(s)),
    }
}
