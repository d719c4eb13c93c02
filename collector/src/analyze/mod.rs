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
    let [p] = percentiles_in_place(v, [permille]);
    p
}

/// `percentile_in_place` of each of `permilles`, which ascend: each selects only among
/// the values the one before left above its rank (a p99 after a p50 looks at half).
pub fn percentiles_in_place<const N: usize>(v: &mut [u64], permilles: [usize; N]) -> [u64; N] {
    debug_assert!(permilles.is_sorted(), "ascending permilles");
    let mut out = [0; N];
    if v.is_empty() {
        return out;
    }
    // Every value below `from` is at most every value from it on.
    let mut from = 0;
    for (o, permille) in out.iter_mut().zip(permilles) {
        let (lo, frac) = rank(v.len(), permille);
        let lo = lo.max(from);
        if v.len() - lo <= TOP_RANKS {
            // A rank among the few highest (a p99 of up to ~700 values): those
            // values found in one pass, no selection (the p99's selection was over a
            // quarter of a request summary's percentile work).
            let top = highest(&v[from..], v.len() - lo);
            let below = top[v.len() - lo - 1];
            let above = if frac > 0.0 {
                top[v.len() - lo - 2]
            } else {
                below
            };
            *o = interpolate(below, above, frac);
            // `v` is left as it was: `from` still holds, and every rank after is
            // higher (found here too).
            continue;
        }
        let (_, &mut below, rest) = v[from..].select_nth_unstable(lo - from);
        // The next rank up is the smallest of what selection left above.
        let above = if frac > 0.0 {
            rest.iter().copied().min().unwrap_or(below)
        } else {
            below
        };
        *o = interpolate(below, above, frac);
        from = lo;
    }
    out
}

/// The most ranks from the top `percentiles_in_place` finds by `highest`.
const TOP_RANKS: usize = 8;

/// The `n` (1..=`TOP_RANKS`) highest of `v` (at least `n` values), highest first, in
/// one pass: a value goes in only when above the lowest kept, rare after the first few
/// in any order but ascending.
#[inline]
fn highest(v: &[u64], n: usize) -> [u64; TOP_RANKS] {
    debug_assert!((1..=TOP_RANKS).contains(&n) && n <= v.len());
    let mut top = [0u64; TOP_RANKS];
    let (first, rest) = v.split_at(n);
    top[..n].copy_from_slice(first);
    top[..n].sort_unstable_by(|a, b| b.cmp(a));
    for &x in rest {
        if x > top[n - 1] {
            let mut k = n - 1;
            while k > 0 && top[k - 1] < x {
                top[k] = top[k - 1];
                k -= 1;
            }
            top[k] = x;
        }
    }
    top
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

/// `percentile_of_sorted` of the values of two sorted (ascending) slices together,
/// without merging them: each of the two closest ranks is found by a binary search
/// over how many of it come from `b` (top keeps a window's pooled gaps sorted from
/// pass to pass and adds those of the requests in flight).
pub fn percentile_of_sorted_pair(a: &[u64], b: &[u64], permille: usize) -> u64 {
    let len = a.len() + b.len();
    if len == 0 {
        return 0;
    }
    let (lo, frac) = rank(len, permille);
    let below = nth_of_sorted_pair(a, b, lo);
    let above = if frac > 0.0 {
        nth_of_sorted_pair(a, b, lo + 1)
    } else {
        below
    };
    interpolate(below, above, frac)
}

/// The value at rank `k` (from 0, ascending) of two sorted slices together; `k` is
/// below their total length.
fn nth_of_sorted_pair(a: &[u64], b: &[u64], k: usize) -> u64 {
    // The first k + 1 values are a[..k + 1 - i] and b[..i] for the least i whose next
    // value of `b` is not below the last of those taken from `a`.
    let (mut lo, mut hi) = ((k + 1).saturating_sub(a.len()), (k + 1).min(b.len()));
    while lo < hi {
        let i = (lo + hi) / 2;
        if b[i] < a[k - i] {
            lo = i + 1;
        } else {
            hi = i;
        }
    }
    let from_a = (k + 1 - lo).checked_sub(1).map(|j| a[j]);
    let from_b = lo.checked_sub(1).map(|i| b[i]);
    from_a.max(from_b).expect("k below the total length")
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

impl StatsBuilder {
    pub fn add(&mut self, r: &Request) {
        self.requests += 1;
        self.tokens += r.tokens();
        self.new_connections += usize::from(r.new_connection);
        self.encrypted += usize::from(r.encrypted);
        self.coalesced += usize::from(r.coalesced);
        self.truncated += usize::from(r.truncated);
        // Each series goes in as a slice (one pass for its count, sum and max).
        let mut series = Vec::new();
        for p in &r.points {
            let key = point_key(p.kind);
            if let Some(t) = p.ttft_ns {
                self.ttft.entry(key).or_default().push(t);
            }
            series.clear();
            p.itl_into(&mut series);
            self.itl.entry(key).or_default().extend_from_slice(&series);
            series.clear();
            series.extend(gaps(&p.record_ns));
            (self.record_gap.entry(key).or_default()).extend_from_slice(&series);
        }
        self.ttft_server.extend(r.ttft_server_ns());
        self.tpot.extend(r.tpot_ns());
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
        for f in &r.forward {
            series.clear();
            series.extend(f.delays(&r.points));
            entry(&mut self.forward, &f.label()).extend_from_slice(&series);
        }
    }

    /// Adds every request `other` saw, as if each had been added here too.
    pub fn merge(&mut self, other: &StatsBuilder) {
        self.requests += other.requests;
        self.tokens += other.tokens;
        self.new_connections += other.new_connections;
        self.encrypted += other.encrypted;
        self.coalesced += other.coalesced;
        self.truncated += other.truncated;
        merge_series(&mut self.ttft, &other.ttft);
        self.ttft_server.merge(&other.ttft_server);
        merge_series(&mut self.itl, &other.itl);
        self.tpot.merge(&other.tpot);
        merge_series(&mut self.record_gap, &other.record_gap);
        merge_series(&mut self.stages, &other.stages);
        for (label, samples) in &other.forward {
            entry(&mut self.forward, label).merge(samples);
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

fn merge_series(
    mine: &mut BTreeMap<&'static str, Samples>,
    theirs: &BTreeMap<&'static str, Samples>,
) {
    for (key, samples) in theirs {
        mine.entry(key).or_default().merge(samples);
    }
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
///
/// Each request is added once, to its window's group of its route and process; a
/// sealed window's groups are then summed into the window, the routes, the processes
/// and the whole (`StatsBuilder::merge`: the same figures as adding every request to
/// each, at the cost of each group's kept values or buckets rather than of every gap of
/// every request four times: that was a twelfth of a report's instructions).
#[derive(Debug)]
pub struct Breakdown {
    overall: StatsBuilder,
    routes: BTreeMap<String, StatsBuilder>,
    processes: BTreeMap<String, StatsBuilder>,
    width_ns: u64,
    /// Per open window: per route, per process.
    open: BTreeMap<u64, Groups>,
    sealed: BTreeMap<u64, Stats>,
}

type Groups = BTreeMap<String, BTreeMap<String, StatsBuilder>>;

/// What a `Breakdown` summed up: overall, per route, per process and per window (keyed
/// by the window's start).
#[derive(Debug, Default)]
pub struct BreakdownStats {
    pub overall: Stats,
    pub routes: BTreeMap<String, Stats>,
    pub processes: BTreeMap<String, Stats>,
    pub windows: BTreeMap<u64, Stats>,
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
        let process = r.points.last().map_or_else(
            || "-".into(),
            |p| format!("{}/{}", p.comm, crate::ingest::hosts::pid_label(p.pid)),
        );
        let w = r.start_ns / self.width_ns * self.width_ns;
        let routes = self.open.entry(w).or_default();
        entry(entry(routes, &r.route()), &process).add(r);
    }

    /// Every request that starts before `end_ns` was added: windows that end by then
    /// are summed up and their samples let go.
    pub fn seal(&mut self, end_ns: u64) {
        while let Some(entry) = self.open.first_entry() {
            if entry.key().saturating_add(self.width_ns) > end_ns {
                break;
            }
            let (start, groups) = entry.remove_entry();
            let window = self.sum_up(groups);
            self.sealed.insert(start, window.finish());
        }
    }

    /// A window's groups into its own statistics, and into its routes', its processes'
    /// and the whole's.
    fn sum_up(&mut self, groups: Groups) -> StatsBuilder {
        let mut window = StatsBuilder::default();
        for (route, processes) in groups {
            let mut of_route = StatsBuilder::default();
            for (process, b) in processes {
                entry(&mut self.processes, &process).merge(&b);
                of_route.merge(&b);
            }
            entry(&mut self.routes, &route).merge(&of_route);
            window.merge(&of_route);
        }
        self.overall.merge(&window);
        window
    }

    /// Every window sealed, and everything summed up.
    pub fn finish(mut self) -> BreakdownStats {
        self.seal(u64::MAX);
        BreakdownStats {
            overall: self.overall.finish(),
            routes: self
                .routes
                .iter()
                .map(|(k, b)| (k.clone(), b.finish()))
                .collect(),
            processes: (self.processes.iter())
                .map(|(k, b)| (k.clone(), b.finish()))
                .collect(),
            windows: self.sealed,
        }
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
    fn a_breakdown_sums_up_what_each_group_alone_reads() {
        // Requests over four 1 s windows, two routes and two serving processes.
        let mut net = Net::default();
        for i in 0..8u16 {
            let t0 = 1_000 * MS + u64::from(i) * 450 * MS;
            proxied(&mut net, t0, 40000 + i, 50000 + i, &format!("req-{i}"));
        }
        let mut requests = stitch(&net.events, false).requests;
        assert_eq!(requests.len(), 8);
        for (i, r) in requests.iter_mut().enumerate() {
            r.path = if i % 3 == 0 { "/a" } else { "/b" }.into();
            r.points.last_mut().expect("a point").pid = 30 + (i % 2) as u32;
        }
        let mut b = Breakdown::new(1_000 * MS);
        for r in &requests {
            b.add(r);
            b.seal(r.start_ns.saturating_sub(500 * MS));
        }
        let got = b.finish();
        let of = |keep: &dyn Fn(&Request) -> bool| {
            format!("{:?}", stats(requests.iter().filter(|r| keep(r))))
        };
        assert_eq!(format!("{:?}", got.overall), of(&|_| true), "the whole");
        assert_eq!(got.routes.len(), 2);
        for (route, s) in &got.routes {
            assert_eq!(format!("{s:?}"), of(&|r| &r.route() == route), "{route}");
        }
        assert_eq!(got.processes.len(), 2);
        for (process, s) in &got.processes {
            let pid: u32 = process.rsplit('/').next().unwrap().parse().unwrap();
            let serves = |r: &Request| r.points.last().is_some_and(|p| p.pid == pid);
            assert_eq!(format!("{s:?}"), of(&serves), "{process}");
        }
        assert_eq!(got.windows.len(), 4);
        for (&start, s) in &got.windows {
            let within = |r: &Request| (start..start + 1_000 * MS).contains(&r.start_ns);
            assert_eq!(format!("{s:?}"), of(&within), "window at {start}");
            assert!(s.requests > 0);
        }
    }

    #[test]
    fn percentiles_of_a_sorted_pair_are_those_of_the_values_merged() {
        let mut state = 5u64;
        let mut next = |m: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            (state >> 40) % m
        };
        for (la, lb) in [
            (0, 1),
            (1, 0),
            (1, 1),
            (2, 9),
            (9, 2),
            (100, 3),
            (3, 100),
            (500, 501),
        ] {
            // Few distinct values: ties across the two slices.
            let mut a: Vec<u64> = (0..la).map(|_| next(40)).collect();
            let mut b: Vec<u64> = (0..lb).map(|_| next(40)).collect();
            a.sort_unstable();
            b.sort_unstable();
            let mut all = [a.clone(), b.clone()].concat();
            all.sort_unstable();
            for (k, &want) in all.iter().enumerate() {
                assert_eq!(nth_of_sorted_pair(&a, &b, k), want, "rank {k} of {la}+{lb}");
            }
            for p in [0, 500, 900, 990, 999, 1000] {
                assert_eq!(
                    percentile_of_sorted_pair(&a, &b, p),
                    percentile_of_sorted(&all, p),
                    "p{p} of {la}+{lb}"
                );
            }
        }
        assert_eq!(percentile_of_sorted_pair(&[], &[], 990), 0);
    }

    #[test]
    fn percentiles_selected_in_turn_are_those_of_the_sorted_values() {
        // Lengths whose high ranks are found by selection and by `highest` (a p99 is
        // among the top eight up to ~700 values), in any order, ascending (each value
        // goes in) and descending, with repeats.
        let mut state = 11u64;
        let permilles = [500, 900, 950, 990, 999, 1000];
        for (len, range) in [1, 2, 3, 7, 8, 9, 66, 100, 270, 701, 1001]
            .into_iter()
            .flat_map(|len| [(len, 50), (len, 1 << 40)])
        {
            let random: Vec<u64> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 20) % range
                })
                .collect();
            let mut ascending = random.clone();
            ascending.sort_unstable();
            let descending: Vec<u64> = ascending.iter().rev().copied().collect();
            for v in [random, ascending.clone(), descending] {
                let want = permilles.map(|p| percentile_of_sorted(&ascending, p));
                let mut w = v.clone();
                assert_eq!(
                    percentiles_in_place(&mut w, permilles),
                    want,
                    "{len} values"
                );
                w.sort_unstable();
                assert_eq!(w, ascending, "the same values, reordered");
                assert_eq!(percentile_in_place(&mut v.clone(), 990), want[3]);
                assert_eq!(
                    percentiles_in_place(&mut v.clone(), [500, 990]),
                    [want[0], want[3]],
                    "a request summary's pair"
                );
            }
        }
        assert_eq!(percentiles_in_place(&mut [], [500, 990]), [0, 0]);
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
