//! ITL per route over the window, kept from pass to pass. A finished request's gaps
//! (at its first point) go into its route's pool once, when it finishes, and out once,
//! when it leaves the window; a pass merges in only what changed since the last and
//! adds the requests still in flight, instead of gathering, bucketing and selecting
//! from the whole window's gaps (a quarter million at 4k tokens/s) every pass. Under
//! the bench's lab load a pass's median time went from 10.5 to 10 ms (20 samples
//! each): most of a pass is the pipeline's tick, not this.

use std::collections::BTreeMap;
use std::sync::Arc;

use collector::analyze::percentile_of_sorted_pair;
use collector::ingest::fast_hash::FastMap;
use collector::stitch::Request;

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

/// The finished requests' gaps per route (see the module's comment).
#[derive(Default)]
pub struct RouteGaps {
    pools: FastMap<Arc<str>, Pool>,
    /// Where a pass gathers and sorts a route's gaps in flight (kept between passes).
    open: Vec<u64>,
}

#[derive(Default)]
struct Pool {
    /// Finished requests of the route in the window.
    requests: usize,
    /// Their gaps as of the last pass, ascending.
    sorted: Vec<u64>,
    /// Gaps of the requests that finished, or left the window, since then.
    added: Vec<u64>,
    removed: Vec<u64>,
    /// Of every gap the pool holds, those added since the last pass included.
    histogram: [u64; 9],
}

impl RouteGaps {
    /// A finished request, its route as its row spells it.
    pub fn add(&mut self, route: &Arc<str>, r: &Request) {
        let pool = match self.pools.get_mut(&**route) {
            Some(pool) => pool,
            None => self.pools.entry(Arc::clone(route)).or_default(),
        };
        pool.requests += 1;
        let from = pool.added.len();
        if let Some(p) = r.first_point() {
            p.itl_into(&mut pool.added);
        }
        for &g in &pool.added[from..] {
            pool.histogram[bucket(g)] += 1;
        }
    }

    /// A finished request `add`ed before leaves the window.
    pub fn remove(&mut self, route: &str, r: &Request) {
        let Some(pool) = self.pools.get_mut(route) else {
            debug_assert!(false, "a request never added to {route}");
            return;
        };
        pool.requests -= 1;
        let from = pool.removed.len();
        if let Some(p) = r.first_point() {
            p.itl_into(&mut pool.removed);
        }
        for &g in &pool.removed[from..] {
            pool.histogram[bucket(g)] -= 1;
        }
    }

    /// Every route's ITL: its finished requests' and those of `open` (requests in
    /// flight, each with its route), in route order.
    pub fn itl<'a>(
        &mut self,
        open: impl IntoIterator<Item = (String, &'a Request)>,
    ) -> Vec<RouteItl> {
        self.pools.retain(|_, pool| {
            pool.settle();
            pool.requests > 0
        });
        let mut routes: BTreeMap<String, Vec<&Request>> = BTreeMap::new();
        for (route, r) in open {
            routes.entry(route).or_default().push(r);
        }
        for name in self.pools.keys() {
            if !routes.contains_key(&**name) {
                routes.insert(name.to_string(), Vec::new());
            }
        }
        let Self { pools, open: gaps } = self;
        routes
            .into_iter()
            .map(|(route, rs)| {
                let pool = pools.get(route.as_str());
                gaps.clear();
                for p in rs.iter().filter_map(|r| r.first_point()) {
                    p.itl_into(gaps);
                }
                let mut histogram = pool.map_or([0; 9], |p| p.histogram);
                for &g in gaps.iter() {
                    histogram[bucket(g)] += 1;
                }
                gaps.sort_unstable();
                let done = pool.map_or(&[][..], |p| &p.sorted);
                let n = done.len() + gaps.len();
                let at =
                    |permille| (n > 0).then(|| percentile_of_sorted_pair(done, gaps, permille));
                RouteItl {
                    requests: rs.len() + pool.map_or(0, |p| p.requests),
                    gaps: n,
                    p50_ns: at(500),
                    p99_ns: at(990),
                    histogram,
                    route,
                }
            })
            .collect()
    }
}

impl Pool {
    /// `sorted` as of now: what was added merged in, what left taken out.
    fn settle(&mut self) {
        if !self.added.is_empty() {
            self.added.sort_unstable();
            merge_sorted(&mut self.sorted, &self.added);
            self.added.clear();
        }
        if !self.removed.is_empty() {
            self.removed.sort_unstable();
            subtract_sorted(&mut self.sorted, &self.removed);
            self.removed.clear();
        }
    }
}

/// A gap's histogram bucket: past the bounds at or below it (each compared, no branch
/// per bound).
fn bucket(gap: u64) -> usize {
    if gap == 0 {
        return 0;
    }
    1 + ITL_BUCKETS_NS[1..]
        .iter()
        .map(|&b| usize::from(b <= gap))
        .sum::<usize>()
}

/// `add` (ascending) merged into `into` (ascending), in place from the back.
fn merge_sorted(into: &mut Vec<u64>, add: &[u64]) {
    let (mut i, mut j) = (into.len(), add.len());
    into.resize(i + j, 0);
    let mut w = into.len();
    while j > 0 {
        w -= 1;
        if i > 0 && into[i - 1] > add[j - 1] {
            into[w] = into[i - 1];
            i -= 1;
        } else {
            into[w] = add[j - 1];
            j -= 1;
        }
    }
}

/// One of `from`'s values (ascending) taken out for each of `gone`'s (ascending).
fn subtract_sorted(from: &mut Vec<u64>, gone: &[u64]) {
    let mut gone = gone.iter().copied().peekable();
    from.retain(|&v| {
        while gone.next_if(|&g| g < v).is_some() {
            debug_assert!(false, "a gap taken out that the pool did not hold");
        }
        gone.next_if_eq(&v).is_none()
    });
    debug_assert!(
        gone.next().is_none(),
        "gaps taken out that the pool did not hold"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::tests::bare_request;
    use collector::analyze::summarize;

    /// Every request in flight: what a pass over the whole window gave.
    fn pooled(requests: &[Request]) -> Vec<RouteItl> {
        RouteGaps::default().itl(requests.iter().map(|r| (r.route(), r)))
    }

    #[test]
    fn a_gap_on_a_bound_goes_above_it() {
        for (i, &bound) in ITL_BUCKETS_NS.iter().enumerate().skip(1) {
            let mut r = bare_request();
            // Gaps: one below the bound, the bound itself.
            r.points[0].token_ns = vec![0, bound - 1, 2 * bound - 1];
            let h = pooled(&[r]);
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
        let h = pooled(&[r]);
        assert_eq!(h.len(), 1, "one route");
        // gaps: 0, 3 ms, 10 ms, 2 s
        assert_eq!(h[0].histogram, [1, 1, 0, 1, 0, 0, 0, 0, 1], "bucketed gaps");
        assert_eq!(h[0].gaps, 4);
        let s = summarize(&[0, 3_000_000, 10_000_000, 2_000_000_000]).expect("samples");
        assert_eq!(h[0].p50_ns, Some(s.p50_ns));
        assert_eq!(h[0].p99_ns, Some(s.p99_ns));
        assert_eq!(
            h[0].p99_ns,
            Some(1_940_300_000),
            "interpolated between the closest ranks"
        );
    }

    fn at(host: Option<&str>, path: &str, token_ns: Vec<u64>) -> Request {
        let mut r = bare_request();
        r.host = host.map(String::from);
        r.path = path.into();
        r.points[0].token_ns = token_ns;
        r
    }

    #[test]
    fn routes_pool_their_requests_and_come_in_route_order() {
        let requests = [
            at(Some("b.example"), "/v1/chat", vec![0, 10]),
            at(None, "/v1/completions", vec![0, 20, 50]),
            at(Some("b.example"), "/v1/chat", vec![0, 40]),
            // Spelled by other parts, the same route as the first two.
            at(None, "b.example/v1/chat", vec![0, 70]),
        ];
        // Two finished (one per route), the rest in flight.
        let mut gaps = RouteGaps::default();
        gaps.add(&requests[0].route().into(), &requests[0]);
        gaps.add(&requests[1].route().into(), &requests[1]);
        let routes = gaps.itl(requests[2..].iter().map(|r| (r.route(), r)));
        assert_eq!(routes, pooled(&requests), "as if pooled in one pass");
        let seen: Vec<(&str, usize, usize)> = routes
            .iter()
            .map(|r| (r.route.as_str(), r.requests, r.gaps))
            .collect();
        assert_eq!(
            seen,
            [("/v1/completions", 1, 2), ("b.example/v1/chat", 3, 3)],
            "sorted by route, each route's requests and gaps pooled"
        );
        let want = summarize(&[10, 40, 70]).expect("samples");
        assert_eq!(
            (routes[1].p50_ns, routes[1].p99_ns),
            (Some(want.p50_ns), Some(want.p99_ns))
        );
    }

    /// Requests finishing, leaving the window and in flight, passes in between: each
    /// pass gives what pooling everything then in the window gives.
    #[test]
    fn kept_pools_give_what_pooling_the_window_gives() {
        let mut state = 3u64;
        let mut next = |m: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            (state >> 33) % m
        };
        let paths = ["/a", "/b", "/c"];
        let requests: Vec<Request> = (0..300)
            .map(|_| {
                let mut t = 0;
                let mut tokens = Vec::new();
                for _ in 0..next(12) {
                    // Few distinct gaps: ties within and across requests.
                    t += next(4) * 5_000_000;
                    tokens.push(t);
                }
                at(None, paths[next(3) as usize], tokens)
            })
            .collect();
        let mut gaps = RouteGaps::default();
        let names: Vec<Arc<str>> = requests.iter().map(|r| r.route().into()).collect();
        // Finished: [gone, done); in flight: [done, started).
        let (mut gone, mut done, mut started) = (0, 0, 0);
        while gone < requests.len() {
            started = (started + next(20) as usize).min(requests.len());
            let finish = (done + next(15) as usize).min(started);
            for i in done..finish {
                gaps.add(&names[i], &requests[i]);
            }
            done = finish;
            let leave = (gone + next(12) as usize).min(done);
            for i in gone..leave {
                gaps.remove(&names[i], &requests[i]);
            }
            gone = leave;
            let open = requests[done..started].iter().map(|r| (r.route(), r));
            let got = gaps.itl(open);
            assert_eq!(
                got,
                pooled(&requests[gone..started]),
                "[{gone}, {done}, {started})"
            );
        }
        assert!(gaps.itl([]).is_empty(), "every pool let go");
    }
}
