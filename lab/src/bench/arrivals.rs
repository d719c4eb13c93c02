//! When each request may start: in index order, paced by --rate as a Poisson process and
//! bounded by --requests / --duration.
use std::sync::Mutex;
use std::time::Duration;

use collector::clock::monotonic_ns;

/// Hands out request indices, paced by --rate and bounded by --requests / --duration.
pub(super) struct Dispenser {
    /// (next index, its arrival offset from start in ns, arrival PRNG state)
    pub(super) next: Mutex<(u64, f64, u64)>,
    pub(super) start_ns: u64,
    pub(super) limit: Option<u64>,
    pub(super) deadline_ns: Option<u64>,
    pub(super) rate: Option<f64>,
}

/// Uniform in (0, 1] from a splitmix64 state (fixed seed: runs are reproducible).
fn next_unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
}

impl Dispenser {
    /// Next request index and when it may start. With --rate, arrivals are a Poisson
    /// process (exponential gaps), as vllm bench serve sends them. --duration is a wall
    /// clock deadline: no request starts at or after it, whatever the arrivals (without
    /// --rate they are all at the start; with a large one a backlog builds).
    pub(super) async fn next(&self) -> Option<u64> {
        let (i, at_ns) = {
            let mut n = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let (i, at, _) = *n;
            if let Some(rate) = self.rate.filter(|r| *r > 0.0) {
                let gap_s = -next_unit(&mut n.2).ln() / rate;
                n.1 += gap_s * 1e9;
            }
            n.0 += 1;
            (i, self.start_ns + at as u64)
        };
        let now = monotonic_ns();
        if self.limit.is_some_and(|l| i >= l)
            || self.deadline_ns.is_some_and(|d| at_ns >= d || now >= d)
        {
            return None;
        }
        if at_ns > now {
            tokio::time::sleep(Duration::from_nanos(at_ns - now)).await;
        }
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests handed out until the dispenser says no, and the latest moment one was.
    fn run(rate: Option<f64>, duration: Duration) -> (u64, u64, u64) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let start_ns = monotonic_ns();
        let deadline_ns = start_ns + duration.as_nanos() as u64;
        let d = Dispenser {
            next: Mutex::new((0, 0.0, 1)),
            start_ns,
            limit: None,
            deadline_ns: Some(deadline_ns),
            rate,
        };
        let (mut n, mut last) = (0, 0);
        rt.block_on(async {
            while d.next().await.is_some() {
                n += 1;
                last = monotonic_ns();
                // A request takes a while: the arrivals run ahead of the wall clock.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        (n, last, deadline_ns)
    }

    #[test]
    fn duration_ends_on_the_wall_clock_with_or_without_a_rate() {
        for rate in [None, Some(1e6)] {
            let (n, last, deadline) = run(rate, Duration::from_millis(100));
            assert!(n > 10, "rate {rate:?}: requests were handed out ({n})");
            assert!(
                last < deadline,
                "rate {rate:?}: none starts after the deadline ({} us past)",
                (last - deadline) / 1000
            );
        }
    }
}
