//! Counters computed from the timeline.

use std::collections::BTreeMap;

use super::requests::request_end;
use super::{Builder, TrackKind, RATE_WINDOW_NS};
use crate::ingest::record::FileHeader;
use crate::ingest::Event;
use crate::stitch::{PointKind, Timeline};

impl Builder {
    /// Counters computed from the timeline: in-flight requests, engine queue depth,
    /// tokens/s at each observation point, and the recording's ring-buffer drops; the
    /// samples in this window, from the requests stitched with it (a windowed export
    /// misses requests that began before the window's lookback).
    pub(super) fn derived_counters(
        &mut self,
        header: &FileHeader,
        tl: &Timeline,
        start: u64,
        events: &[Event],
    ) {
        let group = self.track(None, "tokenscope".into(), TrackKind::Plain);
        let steps = |b: &mut Self, name: &str, mut deltas: Vec<(u64, i64)>| {
            if deltas.is_empty() {
                return;
            }
            deltas.sort();
            let t = b.track(Some(group), name.into(), TrackKind::Counter { unit: None });
            let mut level = 0i64;
            let mut i = 0;
            while i < deltas.len() {
                let ts = deltas[i].0;
                while i < deltas.len() && deltas[i].0 == ts {
                    level += deltas[i].1;
                    i += 1;
                }
                if b.owns(ts) {
                    b.counter(t, ts, level as f64);
                }
            }
        };
        let in_flight = tl
            .requests
            .iter()
            .flat_map(|r| [(r.start_ns, 1), (request_end(r), -1)])
            .collect();
        steps(self, "in-flight requests", in_flight);
        let queued = tl
            .requests
            .iter()
            .filter_map(|r| {
                let first = *r.point(PointKind::EngineWrite)?.token_ns.first()?;
                Some([(r.engine_received_ns?, 1), (first, -1)])
            })
            .flatten()
            .collect();
        steps(self, "engine queue depth", queued);
        for kind in [
            PointKind::EngineWrite,
            PointKind::ProxyRead,
            PointKind::ProxyWrite,
            PointKind::ClientRead,
        ] {
            let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
            for t in tl
                .requests
                .iter()
                .filter_map(|r| r.point(kind))
                .flat_map(|p| &p.token_ns)
            {
                *bins
                    .entry(t.saturating_sub(start) / RATE_WINDOW_NS)
                    .or_default() += 1;
            }
            let (Some(&lo), Some(&hi)) = (bins.keys().next(), bins.keys().next_back()) else {
                continue;
            };
            let name = format!("tokens/s at {}", kind.label());
            let t = self.track(Some(group), name, TrackKind::Counter { unit: None });
            for w in lo..=hi + 1 {
                let ts = start + w * RATE_WINDOW_NS;
                if !self.owns(ts) {
                    continue;
                }
                let n = bins.get(&w).copied().unwrap_or(0);
                let per_s = n as f64 * 1e9 / RATE_WINDOW_NS as f64;
                self.counter(t, ts, per_s);
            }
        }
        // The ring buffer's drops are counted per recording, not per moment: the
        // total is shown from the end of the recording.
        let dropped = header.counters.map_or(0, |c| c.dropped);
        let last = events.iter().map(|e| e.ts_ns).max().unwrap_or(start);
        let end = header.end_monotonic_ns.max(last).max(start);
        let t = self.track(
            Some(group),
            "ring-buffer drops".into(),
            TrackKind::Counter { unit: None },
        );
        for (ts, v) in [(start, 0.0), (end, dropped as f64)] {
            if self.owns(ts) {
                self.counter(t, ts, v);
            }
        }
    }
}
