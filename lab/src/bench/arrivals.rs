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
    /// process (exponential gaps), as vllm bench serve sends them.
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
        if self.limit.is_some_and(|l| i >= l) || self.deadline_ns.is_some_and(|d| at_ns >= d) {
            return None;
        }
        let now = monotonic_ns();
        if at_ns > now {
            tokio::time::sleep(Duration::from_nanos(at_ns - now)).await;
        }
        Some(i)
    }
}
