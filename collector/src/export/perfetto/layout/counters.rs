//! Counters computed from the requests: in-flight requests, engine queue depth,
//! tokens/s at each observation point, and the recording's ring-buffer drops.

use std::collections::BTreeMap;

use super::requests::request_end;
use super::{owned, Builder, TrackKind, RATE_WINDOW_NS};
use crate::stitch::{PointKind, Request};

impl Builder {
    /// The samples of each series that fall in this window, under a "tokenscope" group.
    pub(super) fn derived_counters(&mut self, series: &[(String, Vec<(u64, f64)>)]) {
        let group = self.track(None, "tokenscope".into(), TrackKind::Plain);
        for (name, samples) in series {
            let mine = owned(samples, |s| s.0, &self.own.clone());
            if mine.is_empty() {
                continue;
            }
            let t = self.track(Some(group), name.clone(), TrackKind::Counter { unit: None });
            for &(ts, v) in mine {
                self.counter(t, ts, v);
            }
        }
    }
}

/// In-flight requests, engine queue depth, tokens/s at each observation point, and
/// the recording's ring-buffer drops, over the whole recording.
pub(super) fn series(
    requests: &[Request],
    start: u64,
    end: u64,
    dropped: u64,
) -> Vec<(String, Vec<(u64, f64)>)> {
    let mut series = Vec::new();
    let levels = |mut deltas: Vec<(u64, i64)>| {
        deltas.sort();
        let mut out: Vec<(u64, f64)> = Vec::new();
        let mut level = 0i64;
        let mut i = 0;
        while i < deltas.len() {
            let ts = deltas[i].0;
            while i < deltas.len() && deltas[i].0 == ts {
                level += deltas[i].1;
                i += 1;
            }
            out.push((ts, level as f64));
        }
        out
    };
    let in_flight = requests
        .iter()
        .flat_map(|r| [(r.start_ns, 1), (request_end(r), -1)])
        .collect();
    series.push(("in-flight requests".to_string(), levels(in_flight)));
    let queued = requests
        .iter()
        .filter_map(|r| {
            let first = *r.point(PointKind::EngineWrite)?.token_ns.first()?;
            Some([(r.engine_received_ns?, 1), (first, -1)])
        })
        .flatten()
        .collect();
    series.push(("engine queue depth".to_string(), levels(queued)));
    for kind in [
        PointKind::EngineWrite,
        PointKind::ProxyRead,
        PointKind::ProxyWrite,
        PointKind::ClientRead,
    ] {
        let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
        for t in requests
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
        let samples = (lo..=hi + 1)
            .map(|w| {
                let n = bins.get(&w).copied().unwrap_or(0);
                (
                    start + w * RATE_WINDOW_NS,
                    n as f64 * 1e9 / RATE_WINDOW_NS as f64,
                )
            })
            .collect();
        series.push((format!("tokens/s at {}", kind.label()), samples));
    }
    // The ring buffer's drops are counted per recording, not per moment: the
    // total is shown from the end of the recording.
    series.push((
        "ring-buffer drops".to_string(),
        vec![(start, 0.0), (end, dropped as f64)],
    ));
    series.retain(|(_, s)| !s.is_empty());
    series
}
