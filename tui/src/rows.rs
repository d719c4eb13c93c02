//! What the screen shows, derived once per pass over the window: one
//! row per request, ITL per route, TTFT over time, the GPU summary. Render
//! reads these and computes nothing heavy.

use std::collections::BTreeMap;
use std::sync::Arc;

use collector::analyze::{percentiles_in_place, summarize};
use collector::ingest::fast_hash::FastMap;
use collector::ingest::model::NvmlSample;
use collector::stitch::{PointKind, Request};

/// Identifies a request across passes (request ids are positions, which move).
/// Rows are copied out of the window every pass: their text is shared, not copied.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RowKey {
    pub client_addr: Arc<str>,
    pub first_byte_ns: u64,
}

impl RowKey {
    pub fn of(r: &Request) -> RowKey {
        RowKey {
            client_addr: r.client_addr.as_str().into(),
            first_byte_ns: r.first_byte_ns,
        }
    }
}

/// One line of the request table.
#[derive(Clone, Debug)]
pub struct Row {
    pub key: RowKey,
    /// Index into `State::requests`.
    pub index: usize,
    pub start_ns: u64,
    pub route: Arc<str>,
    /// The streaming API (`openai-chat`, `anthropic`, ...; see `Request::api`).
    pub api: Option<&'static str>,
    /// `addr comm` of the client end.
    pub client: Arc<str>,
    pub status: Option<u32>,
    /// TTFT at the first point (the client's read when the client is traced).
    pub ttft_first_ns: Option<u64>,
    pub ttft_engine_ns: Option<u64>,
    /// ITL at the first point.
    pub itl_p50_ns: Option<u64>,
    pub itl_p99_ns: Option<u64>,
    pub tokens: usize,
    /// Decode rate at the first point: (tokens - 1) / (last - first token).
    pub tokens_per_s: Option<f64>,
    pub new_connection: bool,
    pub tls: bool,
    pub coalesced: bool,
    /// Some of its decode gaps at the engine waited on other requests' prefill.
    pub stalled: bool,
    /// One stream of an HTTP/2 connection (filterable as `http2`).
    pub http2: bool,
    /// No end of response yet (live: still streaming; replay: cut off).
    pub open: bool,
}

impl Row {
    pub fn from_request(index: usize, r: &Request) -> Row {
        let first = r.first_point();
        let gaps: Vec<u64> = first.map_or_else(Vec::new, |p| p.itl_ns());
        let itl = summarize(&gaps);
        let tokens = r.tokens();
        let tokens_per_s = first.and_then(|p| {
            let (a, b) = (p.token_ns.first()?, p.token_ns.last()?);
            (b > a).then(|| (p.token_ns.len() - 1) as f64 * 1e9 / (b - a) as f64)
        });
        Row {
            key: RowKey::of(r),
            index,
            start_ns: r.start_ns,
            route: r.route().into(),
            api: r.api,
            client: format!("{} {}", r.client_addr, r.client_comm).into(),
            status: r.status,
            ttft_first_ns: first.and_then(|p| p.ttft_ns),
            ttft_engine_ns: r.point(PointKind::EngineWrite).and_then(|p| p.ttft_ns),
            itl_p50_ns: itl.map(|s| s.p50_ns),
            itl_p99_ns: itl.map(|s| s.p99_ns),
            tokens,
            tokens_per_s,
            new_connection: r.new_connection,
            tls: r.tls,
            coalesced: r.coalesced,
            stalled: r.gpu.as_ref().is_some_and(|g| !g.stalled_by.is_empty()),
            http2: r.http2,
            open: r.truncated,
        }
    }

    /// Four columns: N(ew connection) T(LS) C(oalesced) S(talled); `·` when not.
    pub fn flags(&self) -> String {
        [
            (self.new_connection, 'N'),
            (self.tls, 'T'),
            (self.coalesced, 'C'),
            (self.stalled, 'S'),
        ]
        .iter()
        .map(|&(on, c)| if on { c } else { '·' })
        .collect()
    }

    /// Whether the (lower-case) filter text matches: route, API, client, status or a
    /// flag name.
    pub fn matches(&self, needle: &str) -> bool {
        if needle.is_empty() {
            return true;
        }
        let status = self.status.map_or_else(String::new, |s| s.to_string());
        let flag_words = [
            (self.new_connection, "new-conn"),
            (self.tls, "tls"),
            (self.coalesced, "coalesced"),
            (self.stalled, "stalled"),
            (self.http2, "http2"),
            (self.open, "open"),
        ];
        self.route.to_lowercase().contains(needle)
            || self.api.is_some_and(|a| a.contains(needle))
            || self.client.to_lowercase().contains(needle)
            || status.contains(needle)
            || flag_words
                .iter()
                .any(|(on, word)| *on && word.contains(needle))
    }
}

/// ITL histogram bucket upper bounds (ns); the first bucket is gap 0 (coalesced).
pub const ITL_BUCKETS_NS: [u64; 8] = [
    0,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];
/// Labels of the buckets above, plus the overflow bucket.
pub const ITL_BUCKET_LABELS: [&str; 9] =
    ["0", "<5", "<10", "<25", "<50", "<100", "<250", "<1s", "≥1s"];

/// ITL at the first point, pooled over one route's requests.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteItl {
    pub route: String,
    pub requests: usize,
    pub gaps: usize,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub histogram: [u64; 9],
}

/// `items`: each request with its route as its row spells it. Rows of finished
/// requests share one string per route (`Analysis` interns them), so requests are
/// grouped by the string's address, not by hashing it (a full window's 3,600 requests
/// each pass); groups that spell the same route are then merged.
/// `scratch`: where a route's gaps are pooled, kept by the caller from pass to pass (a
/// full window's quarter million gaps are 2 MB: fresh pages every second otherwise).
pub fn itl_by_route<'a>(
    items: impl IntoIterator<Item = (&'a Arc<str>, &'a Request)>,
    scratch: &mut Vec<u64>,
) -> Vec<RouteItl> {
    let mut by_string: FastMap<*const u8, (&str, Vec<&Request>)> = FastMap::default();
    for (route, r) in items {
        by_string
            .entry(route.as_ptr())
            .or_insert_with(|| (route, Vec::new()))
            .1
            .push(r);
    }
    // In route order; two copies of one route's string make one row.
    let mut routes: BTreeMap<&str, Vec<&Request>> = BTreeMap::new();
    for (_, (route, mut rs)) in by_string {
        routes.entry(route).or_default().append(&mut rs);
    }
    routes
        .into_iter()
        .map(|(route, rs)| {
            let gaps = &mut *scratch;
            gaps.clear();
            let points = || rs.iter().filter_map(|r| r.first_point());
            gaps.reserve(points().map(|p| p.token_ns.len().saturating_sub(1)).sum());
            for p in points() {
                p.itl_into(gaps);
            }
            let mut histogram = [0u64; 9];
            for g in gaps.iter() {
                let bucket = if *g == 0 {
                    0
                } else {
                    // Past the bounds at or below it (each compared, no branch per
                    // bound: a quarter million gaps each pass).
                    1 + ITL_BUCKETS_NS[1..]
                        .iter()
                        .map(|b| usize::from(b <= g))
                        .sum::<usize>()
                };
                histogram[bucket] += 1;
            }
            // Selected, not sorted: a full window holds a quarter million gaps at 4k
            // tokens/s, and this runs every pass.
            let (p50_ns, p99_ns) = if gaps.is_empty() {
                (None, None)
            } else {
                let [p50, p99] = percentiles_in_place(gaps, [500, 990]);
                (Some(p50), Some(p99))
            };
            RouteItl {
                route: route.to_string(),
                requests: rs.len(),
                gaps: gaps.len(),
                p50_ns,
                p99_ns,
                histogram,
            }
        })
        .collect()
}

/// TTFT (first point) percentiles of the requests that started in one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtftWindow {
    pub start_ns: u64,
    pub count: usize,
    pub p50_ns: u64,
    pub p99_ns: u64,
}

pub fn ttft_over_time(rows: &[Row], width_ns: u64) -> Vec<TtftWindow> {
    let mut groups: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in rows {
        if let Some(t) = r.ttft_first_ns {
            groups
                .entry(r.start_ns / width_ns * width_ns)
                .or_default()
                .push(t);
        }
    }
    groups
        .into_iter()
        .filter_map(|(start_ns, v)| {
            let s = summarize(&v)?;
            Some(TtftWindow {
                start_ns,
                count: s.count,
                p50_ns: s.p50_ns,
                p99_ns: s.p99_ns,
            })
        })
        .collect()
}

/// The latest NVML reading of one device.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReading {
    pub device: u32,
    pub ts_ns: u64,
    pub util_pct: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub power_mw: Option<u32>,
}

/// Latest NVML sample per device, if the recording has any.
pub fn latest_gpu<'a>(samples: impl IntoIterator<Item = &'a (u64, NvmlSample)>) -> Vec<GpuReading> {
    let mut latest: BTreeMap<u32, GpuReading> = BTreeMap::new();
    for (ts_ns, s) in samples {
        if latest.get(&s.device).is_some_and(|g| g.ts_ns > *ts_ns) {
            continue;
        }
        latest.insert(
            s.device,
            GpuReading {
                device: s.device,
                ts_ns: *ts_ns,
                util_pct: s.gpu_util_pct,
                sm_clock_mhz: s.sm_clock_mhz,
                mem_used_bytes: s.mem_used_bytes,
                power_mw: s.power_mw,
            },
        );
    }
    latest.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_on_a_bound_goes_above_it() {
        for (i, &bound) in ITL_BUCKETS_NS.iter().enumerate().skip(1) {
            let mut r = bare_request();
            // Gaps: one below the bound, the bound itself.
            r.points[0].token_ns = vec![0, bound - 1, 2 * bound - 1];
            let h = itl_by_route([(&Arc::from(r.route()), &r)], &mut Vec::new());
            let mut want = [0u64; 9];
            want[i] += 1;
            want[i + 1] += 1;
            assert_eq!(h[0].histogram, want, "gaps of {} and {bound} ns", bound - 1);
        }
    }

    #[test]
    fn itl_buckets_put_zero_gaps_apart_and_overflow_last() {
        let mut r = bare_request();
        r.points[0].token_ns = vec![0, 0, 3_000_000, 13_000_000, 2_013_000_000];
        let h = itl_by_route([(&Arc::from(r.route()), &r)], &mut Vec::new());
        assert_eq!(h.len(), 1, "one route");
        // gaps: 0, 3 ms, 10 ms, 2 s
        assert_eq!(h[0].histogram, [1, 1, 0, 1, 0, 0, 0, 0, 1], "bucketed gaps");
        assert_eq!(h[0].gaps, 4);
        // Selected in place, the same percentiles as a sorted summary.
        let s = summarize(&[0, 3_000_000, 10_000_000, 2_000_000_000]).expect("samples");
        assert_eq!(h[0].p50_ns, Some(s.p50_ns));
        assert_eq!(h[0].p99_ns, Some(s.p99_ns));
        assert_eq!(
            h[0].p99_ns,
            Some(1_940_300_000),
            "interpolated between the closest ranks"
        );
    }

    #[test]
    fn filter_matches_route_status_and_flag_names() {
        let mut r = bare_request();
        r.status = Some(200);
        r.coalesced = true;
        let row = Row::from_request(0, &r);
        assert!(row.matches("completions"), "route");
        assert!(row.matches("200"), "status");
        assert!(row.matches("coal"), "flag name");
        assert!(!row.matches("stalled"), "a flag it does not have");
        assert_eq!(row.flags(), "··C·");
    }

    #[test]
    fn routes_pool_their_requests_and_come_in_route_order() {
        let at = |host: Option<&str>, path: &str, token_ns: Vec<u64>| {
            let mut r = bare_request();
            r.host = host.map(String::from);
            r.path = path.into();
            r.points[0].token_ns = token_ns;
            r
        };
        let requests = [
            at(Some("b.example"), "/v1/chat", vec![0, 10]),
            at(None, "/v1/completions", vec![0, 20, 50]),
            at(Some("b.example"), "/v1/chat", vec![0, 40]),
            // Spelled by other parts, the same route as the first two.
            at(None, "b.example/v1/chat", vec![0, 70]),
        ];
        // Each with a string of its own (as rows in flight have).
        let named: Vec<Arc<str>> = requests.iter().map(|r| r.route().into()).collect();
        let routes = itl_by_route(named.iter().zip(&requests), &mut Vec::new());
        let seen: Vec<(&str, usize, usize)> = routes
            .iter()
            .map(|r| (r.route.as_str(), r.requests, r.gaps))
            .collect();
        assert_eq!(
            seen,
            [("/v1/completions", 1, 2), ("b.example/v1/chat", 3, 3)],
            "sorted by route, each route's requests and gaps pooled"
        );
        let pooled = summarize(&[10, 40, 70]).expect("samples");
        assert_eq!(
            (routes[1].p50_ns, routes[1].p99_ns),
            (Some(pooled.p50_ns), Some(pooled.p99_ns))
        );
    }

    pub(crate) fn bare_request() -> Request {
        Request::at_point(0, PointKind::ClientRead, 1, "bench", Vec::new())
    }
}
