//! Statistics over stitched requests: percentiles of TTFT and ITL per
//! observation point, TPOT, and each breakdown stage, overall, per route and
//! per time window. Pure: it reads requests, nothing else.

pub mod protocols;
mod samples;

pub use samples::{Samples, EXACT_SAMPLES};

use std::collections::BTreeMap;

use serde::Serialize;

use crate::stitch::{PointKind, Request};

/// Percentiles by linear interpolation (numpy's and vllm bench serve's rule), with the
/// count they came from.
/// Never average these across groups: recompute from the samples.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p95_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
}

pub fn summarize(samples: &[u64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_unstable();
    let sum: u128 = v.iter().map(|x| u128::from(*x)).sum();
    Some(Summary {
        count: v.len(),
        p50_ns: percentile_of_sorted(&v, 500),
        p90_ns: percentile_of_sorted(&v, 900),
        p95_ns: percentile_of_sorted(&v, 950),
        p99_ns: percentile_of_sorted(&v, 990),
        p999_ns: percentile_of_sorted(&v, 999),
        max_ns: v[v.len() - 1],
        mean_ns: (sum / v.len() as u128) as u64,
    })
}

/// The `permille` percentile of `samples` in any order, by linear interpolation between
/// the closest ranks (numpy's default, as vllm bench serve), rounded to a whole number;
/// 0 when empty. Linear time: it selects rather than sorts (the diagnoses evaluate it
/// once per subset of fixes).
pub fn percentile(samples: &[u64], permille: usize) -> u64 {
    percentile_in_place(&mut samples.to_vec(), permille)
}

/// `percentile`, reordering `v` (its values stay the same) instead of copying it.
pub fn percentile_in_place(v: &mut [u64], permille: usize) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let (lo, frac) = rank(v.len(), permille);
    let (_, &mut below, rest) = v.select_nth_unstable(lo);
    // The next rank up is the smallest of what selection left above.
    let above = if frac > 0.0 {
        rest.iter().copied().min().unwrap_or(below)
    } else {
        below
    };
    interpolate(below, above, frac)
}

/// `percentile` of samples already sorted ascending.
pub fn percentile_of_sorted(sorted: &[u64], permille: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let (lo, frac) = rank(sorted.len(), permille);
    let hi = if frac > 0.0 { lo + 1 } else { lo };
    interpolate(sorted[lo], sorted[hi], frac)
}

/// The closest rank at or below the `permille` percentile of `len` samples, and how far
/// (0..1) the percentile lies towards the next rank.
fn rank(len: usize, permille: usize) -> (usize, f64) {
    let pos = (permille * (len - 1)) as f64 / 1000.0;
    (pos.floor() as usize, pos - pos.floor())
}

fn interpolate(below: u64, above: u64, frac: f64) -> u64 {
    (below as f64 + (above as f64 - below as f64) * frac).round() as u64
}

/// Statistics of one group of requests.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Stats {
    pub requests: usize,
    pub tokens: usize,
    pub new_connections: usize,
    /// Requests seen only as TLS records.
    pub encrypted: usize,
    pub coalesced: usize,
    pub truncated: usize,
    /// TTFT per observation point (from the request start).
    pub ttft: BTreeMap<&'static str, Summary>,
    /// First token at the first point - first request byte.
    pub ttft_server: Option<Summary>,
    /// Inter-token gaps per point, one sample per gap, pooled over requests.
    pub itl: BTreeMap<&'static str, Summary>,
    pub tpot: Option<Summary>,
    /// Encrypted points: gaps between response TLS application-data records.
    pub record_gap: BTreeMap<&'static str, Summary>,
    pub stages: BTreeMap<&'static str, Summary>,
    /// Token delay between adjacent points (e.g. "engine write -> proxy read").
    pub forward: BTreeMap<String, Summary>,
}

pub fn stats<'a>(requests: impl IntoIterator<Item = &'a Request>) -> Stats {
    let mut b = StatsBuilder::default();
    for r in requests {
        b.add(r);
    }
    b.finish()
}

/// `Stats` of a group fed one request at a time, in memory that does not grow with the
/// group (see `Samples`): what a replay keeps per group once its requests are gone.
#[derive(Clone, Debug, Default)]
pub struct StatsBuilder {
    requests: usize,
    tokens: usize,
    new_connections: usize,
    encrypted: usize,
    coalesced: usize,
    truncated: usize,
    ttft: BTreeMap<&'static str, Samples>,
    ttft_server: Samples,
    itl: BTreeMap<&'static str, Samples>,
    tpot: Samples,
    record_gap: BTreeMap<&'static str, Samples>,
    stages: BTreeMap<&'static str, Samples>,
    forward: BTreeMap<String, Samples>,
}

/// What one request adds to a group's statistics, its per-token series computed once
/// however many groups it goes to (`Breakdown` adds each request to four).
pub struct Measured<'r> {
    r: &'r Request,
    /// Per point: its key, ITL gaps and TLS record gaps.
    points: Vec<(&'static str, Vec<u64>, Vec<u64>)>,
    ttft_server: Option<u64>,
    tpot: Option<u64>,
    /// Per hop: its label and every token's delay over it.
    forward: Vec<(String, Vec<u64>)>,
}

impl<'r> Measured<'r> {
    pub fn of(r: &'r Request) -> Measured<'r> {
        Measured {
            r,
            points: r
                .points
                .iter()
                .map(|p| {
                    let mut itl = Vec::new();
                    p.itl_into(&mut itl);
                    (point_key(p.kind), itl, gaps(&p.record_ns).collect())
                })
                .collect(),
            ttft_server: r.ttft_server_ns(),
            tpot: r.tpot_ns(),
            forward: r
                .forward
                .iter()
                .map(|f| (f.label(), f.delays(&r.points).collect()))
                .collect(),
        }
    }
}

impl StatsBuilder {
    pub fn add(&mut self, r: &Request) {
        self.add_measured(&Measured::of(r));
    }

    pub fn add_measured(&mut self, m: &Measured) {
        let r = m.r;
        self.requests += 1;
        self.tokens += r.tokens();
        self.new_connections += usize::from(r.new_connection);
        self.encrypted += usize::from(r.encrypted);
        self.coalesced += usize::from(r.coalesced);
        self.truncated += usize::from(r.truncated);
        for (p, (key, itl, records)) in r.points.iter().zip(&m.points) {
            if let Some(t) = p.ttft_ns {
                self.ttft.entry(key).or_default().push(t);
            }
            self.itl.entry(key).or_default().extend_from_slice(itl);
            self.record_gap
                .entry(key)
                .or_default()
                .extend_from_slice(records);
        }
        self.ttft_server.extend(m.ttft_server);
        self.tpot.extend(m.tpot);
        let st = &r.stages;
        for (name, v) in [
            ("connect", st.connect_ns),
            ("tls", st.tls_ns),
            ("upload", st.upload_ns),
            ("gateway", st.gateway_ns),
            ("subrequests", st.subrequest_ns),
            ("upstream_wait", st.upstream_wait_ns),
            ("gateway_ttft", st.gateway_ttft_ns),
        ] {
            if let Some(v) = v {
                self.stages.entry(name).or_default().push(v);
            }
        }
        for (label, delays) in &m.forward {
            entry(&mut self.forward, label).extend_from_slice(delays);
        }
    }

    pub fn finish(&self) -> Stats {
        Stats {
            requests: self.requests,
            tokens: self.tokens,
            new_connections: self.new_connections,
            encrypted: self.encrypted,
            coalesced: self.coalesced,
            truncated: self.truncated,
            ttft: summaries(&self.ttft),
            ttft_server: self.ttft_server.summary(),
            itl: summaries(&self.itl),
            tpot: self.tpot.summary(),
            record_gap: summaries(&self.record_gap),
            stages: summaries(&self.stages),
            forward: summaries(&self.forward),
        }
    }
}

/// The summary of each series that has samples.
pub fn summaries<K: Ord + Clone>(m: &BTreeMap<K, Samples>) -> BTreeMap<K, Summary> {
    m.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.summary()?)))
        .collect()
}

/// `map[key]`, made empty if absent; the key copied only then.
fn entry<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_string(), V::default());
    }
    map.get_mut(key).expect("inserted")
}

fn gaps(times: &[u64]) -> impl Iterator<Item = u64> + '_ {
    times.windows(2).map(|w| w[1] - w[0])
}

pub fn point_key(kind: PointKind) -> &'static str {
    match kind {
        PointKind::EngineWrite => "engine_write",
        PointKind::ProxyRead => "proxy_read",
        PointKind::ProxyWrite => "proxy_write",
        PointKind::ClientRead => "client_read",
    }
}

/// Statistics overall, per route (host + path), per serving process (the last point
/// of each request: its engine, or the furthest hop traced, keyed `comm/pid`) and per
/// time window (requests by their start), fed a request at a time. A window's figures
/// are fixed once `seal` says no request can still start in it.
#[derive(Debug)]
pub struct Breakdown {
    pub overall: StatsBuilder,
    pub routes: BTreeMap<String, StatsBuilder>,
    pub processes: BTreeMap<String, StatsBuilder>,
    width_ns: u64,
    open: BTreeMap<u64, StatsBuilder>,
    sealed: BTreeMap<u64, Stats>,
}

impl Breakdown {
    pub fn new(window_ns: u64) -> Breakdown {
        Breakdown {
            overall: StatsBuilder::default(),
            routes: BTreeMap::new(),
            processes: BTreeMap::new(),
            width_ns: window_ns.max(1),
            open: BTreeMap::new(),
            sealed: BTreeMap::new(),
        }
    }

    pub fn add(&mut self, r: &Request) {
        let m = Measured::of(r);
        self.overall.add_measured(&m);
        self.routes.entry(r.route()).or_default().add_measured(&m);
        let process = r.points.last().map_or_else(
            || "-".into(),
            |p| format!("{}/{}", p.comm, crate::ingest::hosts::pid_label(p.pid)),
        );
        self.processes.entry(process).or_default().add_measured(&m);
        let w = r.start_ns / self.width_ns * self.width_ns;
        self.open.entry(w).or_default().add_measured(&m);
    }

    /// Every request that starts before `end_ns` was added: windows that end by then
    /// are summed up and their samples let go.
    pub fn seal(&mut self, end_ns: u64) {
        while let Some(entry) = self.open.first_entry() {
            if entry.key().saturating_add(self.width_ns) > end_ns {
                break;
            }
            let (start, b) = entry.remove_entry();
            self.sealed.insert(start, b.finish());
        }
    }

    /// Per-window stats keyed by the window's start.
    pub fn windows(&mut self) -> BTreeMap<u64, Stats> {
        self.seal(u64::MAX);
        std::mem::take(&mut self.sealed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stitch::stitch;
    use crate::stitch::testnet::{proxied, Net, MS};

    #[test]
    fn gaps_are_pooled_per_point_of_a_stitched_request() {
        let mut net = Net::default();
        proxied(&mut net, 1_000 * MS, 40000, 50000, "req-a");
        let tl = stitch(&net.events, false);
        let stats = stats(&tl.requests);
        assert_eq!(
            stats.itl["engine_write"].count, 5,
            "six tokens written one per I/O make five gaps"
        );
        assert_eq!(
            stats.itl["client_read"].p50_ns, 0,
            "coalesced tokens arrive with gap 0"
        );
    }

    #[test]
    fn interpolated_percentiles() {
        let v: Vec<u64> = (1..=1000).collect();
        let s = summarize(&v).expect("non-empty");
        assert_eq!(
            (s.count, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns),
            (1000, 501, 900, 990, 999, 1000)
        );
        assert_eq!(s.mean_ns, 500);
        let one = summarize(&[7]).expect("one sample");
        assert_eq!((one.p50_ns, one.p999_ns, one.max_ns), (7, 7, 7));
        assert_eq!(summarize(&[]), None);
    }

    #[test]
    fn selection_and_sorted_percentiles_agree() {
        // Unsorted, with repeats, at ranks that fall between samples and on them.
        let v: Vec<u64> = (0..997u64).map(|i| (i * 7919) % 613).collect();
        let mut sorted = v.clone();
        sorted.sort_unstable();
        for permille in [0, 1, 250, 500, 900, 950, 990, 999, 1000] {
            assert_eq!(
                percentile(&v, permille),
                percentile_of_sorted(&sorted, permille),
                "p{permille}‰ by selection equals the sorted one"
            );
        }
        assert_eq!(
            percentile(&[10, 20], 500),
            15,
            "the median of two interpolates"
        );
        assert_eq!(percentile(&[], 500), 0, "no samples read as 0");
    }
}
