//! What one window of a trace is laid out from: the requests that begin in it (ids,
//! GPU share and diagnoses already worked out), the GPU steps, CUPTI spans and NVML
//! samples of its time, the connections that end in it (whole), and its stretch of
//! the running counter series. Cut by `export::perfetto::windows`.

use super::diagnoses::Cites;
use crate::diagnose::Diagnosis;
use crate::gpu::GpuStep;
use crate::ingest::model::NvmlSample;
use crate::pipeline::CuptiSpan;
use crate::stitch::{ConnectionSpan, Request};

pub(crate) struct Trace {
    /// The trace's time origin (see `export::start_ns`).
    pub(crate) start_ns: u64,
    pub(crate) start_monotonic_ns: u64,
    pub(crate) start_realtime_ns: u64,
    /// Each list in the order of the time it begins at.
    pub(crate) requests: Vec<Request>,
    pub(crate) steps: Vec<GpuStep>,
    pub(crate) cupti: Vec<CuptiSpan>,
    pub(crate) nvml: Vec<(u64, NvmlSample)>,
    pub(crate) connections: Vec<Conn>,
    /// The window's, the largest saving first.
    pub(crate) diagnoses: Vec<Diagnosis>,
    pub(crate) cites: Cites,
    /// Counter tracks under "tokenscope": name, this window's samples in time order.
    pub(crate) counters: Vec<(String, Vec<(u64, f64)>)>,
}

/// A released connection, its exchanges in the order they began, and its end.
pub(crate) struct Conn {
    pub(crate) span: ConnectionSpan,
    /// The last moment of the connection or of any of its exchanges.
    pub(crate) end_ns: u64,
}

impl Conn {
    pub(crate) fn new(mut span: ConnectionSpan) -> Conn {
        span.exchanges.sort_by_key(|x| x.request_start_ns);
        let end_ns = span
            .exchanges
            .iter()
            .map(|x| x.end_ns)
            .fold(span.last_ns.max(span.close_ns.unwrap_or(0)), u64::max);
        Conn { span, end_ns }
    }
}
