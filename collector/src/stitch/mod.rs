//! Events -> per-request timelines (pure: no I/O, no clocks, no aya; live and
//! replay run the same code). Connections -> exchanges -> hop chains -> requests.

pub mod attribution;
pub mod chain;
pub mod conn;
pub mod request;
pub mod spans;
pub mod stitcher;
pub mod wire;

pub use conn::{Connection, Conns, Exchange, Role};
pub use request::{Point, PointKind, Request};
pub use spans::{ChainSpans, ConnectionSpan, ExchangeSpan};
pub use stitcher::{Settle, Settled, Stitcher};

use crate::ingest::Event;

/// Everything stitched from one recording (or one live window).
#[derive(Debug)]
pub struct Timeline {
    pub connections: Conns,
    pub requests: Vec<Request>,
    /// GPU steps rebuilt from libcuda calls (empty without GPU probes).
    pub steps: Vec<crate::gpu::GpuStep>,
    /// Socket I/Os whose bytes were neither HTTP nor TLS, or that lost their stream.
    pub unparsed_ios: u64,
}

/// Stitches events (any order; they are sorted by time here). `dropped` marks
/// every request when the recording lost events.
pub fn stitch(events: &[Event], dropped: bool) -> Timeline {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| e.ts_ns);
    let connections = conn::connections(&sorted);
    drop(sorted);
    let links = chain::link(&connections);
    let chains = chain::chains(&connections, &links);
    let mut requests: Vec<Request> = chains
        .iter()
        .enumerate()
        .map(|(id, ch)| request::build(id, &connections, ch, &links, dropped))
        .collect();
    let mut steps = crate::gpu::steps(events);
    attribution::attribute(&mut requests, &mut steps);
    let unparsed_ios = connections.values().map(|c| c.unparsed_ios).sum();
    Timeline {
        connections,
        requests,
        steps,
        unparsed_ios,
    }
}

#[cfg(test)]
pub(crate) mod testnet;
#[cfg(test)]
mod tests;
