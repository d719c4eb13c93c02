//! What a trace is laid out from: the pipeline's output, put in the order the
//! windows are cut in, with what every window shares (the diagnoses and what they
//! cite, the derived counter series) worked out once.

use std::collections::BTreeSet;
use std::ops::Range;

use super::diagnoses::Cites;
use crate::diagnose::{self, Diagnosis};
use crate::gpu::GpuStep;
use crate::ingest::model::NvmlSample;
use crate::ingest::record::FileHeader;
use crate::pipeline::{CuptiSpan, Output};
use crate::stitch::{ConnectionSpan, Request};

pub(crate) struct Trace {
    /// The trace's time origin (see `layout::start_ns`).
    pub(crate) start_ns: u64,
    pub(crate) start_monotonic_ns: u64,
    pub(crate) start_realtime_ns: u64,
    /// Each list in the order of the time it begins at (its window).
    pub(super) requests: Vec<Request>,
    pub(super) steps: Vec<GpuStep>,
    pub(super) cupti: Vec<CuptiSpan>,
    pub(super) nvml: Vec<(u64, NvmlSample)>,
    pub(super) connections: Vec<Conn>,
    /// The largest saving first.
    pub(super) diagnoses: Vec<Diagnosis>,
    pub(super) cites: Cites,
    /// Counter tracks under "tokenscope": name, samples in time order.
    pub(super) counters: Vec<(String, Vec<(u64, f64)>)>,
    /// The last moment anything was seen (the last window takes everything after).
    pub(crate) end_ns: u64,
}

/// A released connection, its exchanges in the order they began, and its end.
pub(super) struct Conn {
    pub(super) span: ConnectionSpan,
    /// The last moment of the connection or of any of its exchanges.
    pub(super) end_ns: u64,
}

impl Trace {
    pub(crate) fn new(header: &FileHeader, out: Output) -> Trace {
        let start_ns = super::start_ns(header, out.first_event_ns);
        let diagnoses = diagnose::diagnose(&diagnose::Input {
            requests: &out.requests,
            steps: &out.steps,
            nvml: &out.nvml,
        });
        let cites = Cites::of(&diagnoses);
        let dropped = header.counters.map_or(0, |c| c.dropped);
        let end_ns = header.end_monotonic_ns.max(out.last_event_ns).max(start_ns);
        let counters = super::counters::series(&out.requests, start_ns, end_ns, dropped);
        let Output {
            mut requests,
            mut steps,
            mut cupti,
            mut nvml,
            connections,
            ..
        } = out;
        // Stable: ties keep the pipeline's order (requests by id).
        requests.sort_by_key(|r| r.start_ns);
        steps.sort_by_key(|s| s.start_ns);
        cupti.sort_by_key(|s| s.start_ns);
        nvml.sort_by_key(|(ts, _)| *ts);
        let mut connections: Vec<Conn> = connections
            .into_iter()
            .map(|mut span| {
                span.exchanges.sort_by_key(|x| x.request_start_ns);
                let end_ns = span
                    .exchanges
                    .iter()
                    .map(|x| x.end_ns)
                    .fold(span.last_ns.max(span.close_ns.unwrap_or(0)), u64::max);
                Conn { span, end_ns }
            })
            .collect();
        connections.sort_by_key(|c| c.span.first_ns);
        Trace {
            start_ns,
            start_monotonic_ns: header.start_monotonic_ns,
            start_realtime_ns: header.start_realtime_ns,
            requests,
            steps,
            cupti,
            nvml,
            connections,
            diagnoses,
            cites,
            counters,
            end_ns,
        }
    }

    /// The connections with something that begins in `own` (see `Conn::starts`).
    pub(super) fn connections_in(&self, own: &Range<u64>) -> impl Iterator<Item = &Conn> + '_ {
        let own = own.clone();
        self.connections
            .iter()
            .take_while(move |c| c.span.first_ns.min(c.earliest()) < own.end)
            .filter(move |c| c.end_ns.max(c.span.first_ns) >= own.start)
    }
}

impl Conn {
    /// Its handshakes may begin before its first I/O was seen.
    fn earliest(&self) -> u64 {
        let s = &self.span;
        [s.handshake, s.tls_handshake]
            .into_iter()
            .flatten()
            .map(|(a, _)| a)
            .fold(s.first_ns, u64::min)
    }
}

/// The items of `v` (in the order of `key`) whose key lies in `own`.
pub(super) fn owned<'a, T>(v: &'a [T], key: impl Fn(&T) -> u64, own: &Range<u64>) -> &'a [T] {
    let lo = v.partition_point(|x| key(x) < own.start);
    let hi = v.partition_point(|x| key(x) < own.end);
    &v[lo..hi.max(lo)]
}

/// The windows (by index from the origin, `width` long) that something begins in,
/// so that a windowed export skips the empty stretches of a recording.
pub(crate) fn busy_windows(trace: &Trace, width: u64) -> BTreeSet<u64> {
    let at = |ts: u64| ts.saturating_sub(trace.start_ns) / width;
    let mut w = BTreeSet::new();
    w.insert(0);
    w.insert(at(trace.end_ns));
    w.extend(trace.requests.iter().map(|r| at(r.start_ns)));
    w.extend(trace.steps.iter().map(|s| at(s.start_ns)));
    w.extend(trace.cupti.iter().map(|s| at(s.start_ns)));
    w.extend(trace.nvml.iter().map(|(ts, _)| at(*ts)));
    w.extend(trace.diagnoses.iter().map(|d| at(d.evidence.start_ns)));
    for c in &trace.connections {
        w.insert(at(c.span.first_ns));
        w.extend(c.span.exchanges.iter().map(|x| at(x.request_start_ns)));
    }
    for (_, s) in &trace.counters {
        w.extend(s.iter().map(|(ts, _)| at(*ts)));
    }
    w
}
