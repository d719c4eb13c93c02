//! Counters computed from the requests: in-flight requests, engine queue depth,
//! tokens/s at each observation point, and the recording's ring-buffer drops. Run
//! across the windows of an export: a request adds its changes when its window is
//! written, and each window takes the samples that fall before its end.

use std::collections::BTreeMap;

use super::{Builder, TrackKind, RATE_WINDOW_NS};
use crate::stitch::{PointKind, Request};

impl Builder {
    /// A window's samples of each series, under a "tokenscope" group.
    pub(super) fn derived_counters(&mut self, series: &[(String, Vec<(u64, f64)>)]) {
        let group = self.track(None, "tokenscope".into(), TrackKind::Plain);
        for (name, samples) in series {
            if samples.is_empty() {
                continue;
            }
            let t = self.track(Some(group), name.clone(), TrackKind::Counter { unit: None });
            for &(ts, v) in samples {
                self.counter(t, ts, v);
            }
        }
    }
}

/// The derived series as they run across windows.
pub(crate) struct Running {
    start: u64,
    in_flight: Levels,
    queued: Levels,
    /// Tokens/s per observation point.
    rates: [Rate; 4],
    started: bool,
}

const RATE_POINTS: [PointKind; 4] = [
    PointKind::EngineWrite,
    PointKind::ProxyRead,
    PointKind::ProxyWrite,
    PointKind::ClientRead,
];

/// Tokens per `RATE_WINDOW_NS` bin (by bin number from the origin), sampled every
/// bin from the first token's through the one after the last token's.
#[derive(Default)]
struct Rate {
    bins: BTreeMap<u64, u64>,
    /// The last bin with a token (None: no token yet), and the next bin to sample
    /// (None: none sampled yet, the first token's bin).
    hi: Option<u64>,
    next: Option<u64>,
}

/// A level that steps at times (requests begin and end), sampled at each step.
#[derive(Default)]
struct Levels {
    deltas: BTreeMap<u64, i64>,
    level: i64,
}

impl Levels {
    fn add(&mut self, ts: u64, delta: i64) {
        *self.deltas.entry(ts).or_default() += delta;
    }

    /// The samples before `until`.
    fn take(&mut self, until: u64) -> Vec<(u64, f64)> {
        let later = self.deltas.split_off(&until);
        let now = std::mem::replace(&mut self.deltas, later);
        now.into_iter()
            .map(|(ts, d)| {
                self.level += d;
                (ts, self.level as f64)
            })
            .collect()
    }
}

impl Running {
    /// `start`: the trace's origin (rate bins are counted from it).
    pub(crate) fn new(start: u64) -> Running {
        Running {
            start,
            in_flight: Levels::default(),
            queued: Levels::default(),
            rates: Default::default(),
            started: false,
        }
    }

    /// A window's requests (none begins before an earlier window's end).
    pub(crate) fn add(&mut self, requests: &[Request]) {
        for r in requests {
            self.in_flight.add(r.start_ns, 1);
            self.in_flight.add(r.last_seen_ns(), -1);
            let first = r
                .point(PointKind::EngineWrite)
                .and_then(|p| p.token_ns.first());
            if let (Some(received), Some(&first)) = (r.engine_received_ns, first) {
                self.queued.add(received, 1);
                self.queued.add(first, -1);
            }
            for (kind, rate) in RATE_POINTS.iter().zip(&mut self.rates) {
                // A point's tokens come in time order: one count per run of tokens in
                // the same bin (a map entry per token was a third of a window's cut).
                let mut run: Option<(u64, u64)> = None;
                for t in r.point(*kind).iter().flat_map(|p| &p.token_ns) {
                    let bin = t.saturating_sub(self.start) / RATE_WINDOW_NS;
                    match &mut run {
                        Some((b, n)) if *b == bin => *n += 1,
                        _ => {
                            if let Some((b, n)) = run.replace((bin, 1)) {
                                *rate.bins.entry(b).or_default() += n;
                            }
                            rate.hi = rate.hi.max(Some(bin));
                        }
                    }
                }
                if let Some((b, n)) = run {
                    *rate.bins.entry(b).or_default() += n;
                }
            }
        }
    }

    /// The samples before `until` (all of them when `last`, the recording's `end` and
    /// its drops in all included). Tokens/s is sampled every bin from the first token
    /// on, through the bin after the last (at the last window). `drops`: the window's
    /// ring-buffer readings (time, drops so far).
    pub(crate) fn take(
        &mut self,
        until: u64,
        last: Option<(u64, u64)>,
        drops: &[(u64, u64)],
    ) -> Vec<(String, Vec<(u64, f64)>)> {
        let until = if last.is_some() { u64::MAX } else { until };
        let mut series = vec![
            ("in-flight requests".to_string(), self.in_flight.take(until)),
            ("engine queue depth".to_string(), self.queued.take(until)),
        ];
        let start = self.start;
        let at = |bin: u64| start.saturating_add(bin.saturating_mul(RATE_WINDOW_NS));
        for (kind, rate) in RATE_POINTS.iter().zip(&mut self.rates) {
            let Some(hi) = rate.hi else { continue };
            let to = if last.is_some() { hi + 1 } else { u64::MAX };
            let first = rate.bins.keys().next().copied();
            let mut bin = rate.next.or(first).unwrap_or(hi);
            // A token later than a bin already sampled counts in the next one.
            let mut late: u64 = rate.bins.range(..bin).map(|(_, n)| n).sum();
            rate.bins = rate.bins.split_off(&bin);
            let mut samples = Vec::new();
            while bin <= to && at(bin) < until {
                let n = rate.bins.remove(&bin).unwrap_or(0) + std::mem::take(&mut late);
                samples.push((at(bin), n as f64 * 1e9 / RATE_WINDOW_NS as f64));
                bin += 1;
            }
            rate.next = Some(bin);
            series.push((format!("tokens/s at {}", kind.label()), samples));
        }
        // Drops so far: 0 from the start, each reading the recorder wrote when they
        // moved (recordings before those readings have none), the total at the end.
        let mut samples = Vec::new();
        if !self.started {
            self.started = true;
            samples.push((start, 0.0));
        }
        samples.extend(drops.iter().map(|&(t, d)| (t, d as f64)));
        if let Some((end, dropped)) = last {
            samples.push((end, dropped as f64));
        }
        series.push(("ring-buffer drops".to_string(), samples));
        series
    }
}
