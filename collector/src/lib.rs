//! tokenscope's collector: everything between the kernel and the front ends.
//! Rooms follow DESIGN.md section 3: `probes` (the only code that touches aya),
//! `ingest` (decoding, record files), `protocol` (payload parsers), `export`.

pub mod analyze;
/// The one clock (CLOCK_MONOTONIC ns) for the front ends and the lab.
pub use tokenscope_clock as clock;
pub mod diagnose;
pub mod duration;
pub mod export;
pub mod gpu;
pub mod ingest;
pub mod pipeline;
pub mod probes;
pub mod protocol;
pub mod record;
pub mod stitch;
