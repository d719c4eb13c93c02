//! A fixed task timed on CPU 0 before each moment's replay runs, so that a reader of
//! the table can tell the host's speed from the code's. On these VMs the same `report`
//! build on the same file read 3.5 M events/s in one moment and 2.0 M a few minutes
//! later, and a 64 MiB memory walk on the other CPU alone slowed it by a quarter: the
//! rows' runs at a moment move with whatever else the physical host is doing. The task
//! is nothing of tokenscope's: a walk of dependent loads through a 4 MiB table (past a
//! core's L2, within an idle host's L3) and sequential passes over it, in fresh memory.
//! It is an indicator, not a yardstick: it is steady on an idle host (78-85 ms) and far
//! more sensitive to the memory traffic of others than `report` is (that walk on the
//! other CPU took it to 365-495 ms while `report` went from ~100 to ~125 ms). Printed
//! beside the rows, never part of a target.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The table walked: 4 MiB of u32.
const SLOTS: usize = 1 << 20;
/// Dependent loads: each slot names the next one to read.
const STEPS: usize = 4 << 20;
/// Sequential passes over the table.
const PASSES: usize = 16;

/// The median wall time of three runs of the task on CPU 0, each in fresh memory.
pub(super) fn time_on_cpu0() -> Result<Duration> {
    let mut runs = std::thread::Builder::new()
        .name("host-reference".into())
        .spawn(|| -> Result<Vec<Duration>> {
            super::scaling::pin_to_cpu0().context("pinning to CPU 0")?;
            Ok((0..3).map(|_| timed_task()).collect())
        })
        .context("starting the reference task's thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the reference task panicked"))??;
    runs.sort();
    Ok(runs[runs.len() / 2])
}

fn timed_task() -> Duration {
    let start = Instant::now();
    std::hint::black_box(task());
    start.elapsed()
}

/// `STEPS` of a walk through one cycle over `SLOTS`, then `PASSES` sums: the same work
/// every time.
fn task() -> u64 {
    let next = cycle(SLOTS);
    let mut at = 0u32;
    for _ in 0..STEPS {
        at = next[at as usize];
    }
    let mut sum = u64::from(at);
    for pass in 0..PASSES as u64 {
        sum = next.iter().fold(sum, |s, &v| {
            s.wrapping_mul(31).wrapping_add(u64::from(v) ^ pass)
        });
    }
    sum
}

/// Slot i names the next: one cycle through all `n` in a scrambled order (Sattolo's
/// shuffle by a fixed xorshift), so a walk never settles in a short loop held in cache.
fn cycle(n: usize) -> Vec<u32> {
    let mut next: Vec<u32> = (0..n as u32).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        next.swap(i, (x % i as u64) as usize);
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_visits_one_cycle_through_every_slot() {
        let next = cycle(1024);
        let (mut at, mut steps) = (next[0], 1);
        while at != 0 {
            at = next[at as usize];
            steps += 1;
        }
        assert_eq!(steps, next.len());
    }
}
