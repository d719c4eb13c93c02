//! A window's ops in time order.

use super::Op;

/// Orders ops by time, keeping their order among equal times (each track's events
/// were pushed in begin/end order). Few ops: a stable sort. Many: a least significant
/// digit radix sort of their times (`radix`), where the stable comparison sort merged
/// its runs of ops ~18 times over and was ~600 instructions an op (18% of an export's
/// main thread). A window's worth (`HALVES` ops or more) is first dealt stably into
/// those before and those from a time near the middle, and each part sorted on a
/// thread of its own: the radix sort is memory-bound (17-20 ms for the bench
/// recording's window on one core, while the other idled). Scratch: as many ops again.
pub(super) fn sort_by_time(ops: &mut Vec<Op>) {
    const SMALL: usize = 4096;
    const HALVES: usize = 1 << 16;
    if ops.len() <= SMALL {
        ops.sort_by_key(|op| op.ts);
        return;
    }
    let (min, max) = ops
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), op| (lo.min(op.ts), hi.max(op.ts)));
    if min == max {
        return;
    }
    if ops.len() < HALVES {
        let mut scratch = ops.clone();
        radix(ops, &mut scratch, min);
        return;
    }
    let middle = middle_time(ops, min, max);
    let mut dealt = Vec::with_capacity(ops.len());
    dealt.extend(ops.iter().filter(|op| op.ts < middle));
    let before = dealt.len();
    dealt.extend(ops.iter().filter(|op| op.ts >= middle));
    // `ops` is now the scratch of both parts.
    let (early, late) = dealt.split_at_mut(before);
    let (early_scratch, late_scratch) = ops.split_at_mut(before);
    let (sorted_later, ()) = crate::export::perfetto::beside(
        "tokenscope-sort",
        || radix(late, late_scratch, middle),
        || radix(early, early_scratch, min),
    );
    if sorted_later.is_none() {
        // No thread to be had: sorted here.
        radix(&mut dealt[before..], &mut ops[before..], middle);
    }
    *ops = dealt;
}

/// A time with about half the ops before it (from a histogram of their times' top
/// 12 bits), above `min`.
fn middle_time(ops: &[Op], min: u64, max: u64) -> u64 {
    const BUCKETS: usize = 4096;
    let bits = 64 - (max - min).leading_zeros();
    let shift = bits.saturating_sub(BUCKETS.ilog2());
    let mut counts = vec![0usize; BUCKETS];
    for op in ops {
        counts[((op.ts - min) >> shift) as usize] += 1;
    }
    let mut seen = 0;
    for (b, n) in counts.iter().enumerate() {
        seen += n;
        if seen * 2 >= ops.len() {
            // The next bucket's start: at least half the ops are before it. (Past the
            // last bucket, max + 1 at most: saturated, every op is before it.)
            return (b as u64 + 1)
                .checked_shl(shift)
                .filter(|&d| d >> shift == b as u64 + 1)
                .map_or(u64::MAX, |d| min.saturating_add(d));
        }
    }
    max
}

/// `ops` (every time at or above `min`) sorted by time, stably, by an LSD radix sort:
/// a window's ops span about 2^36 ns, so three passes of 12-bit digits, each a
/// scatter between `ops` and `scratch` (as long); the result ends in `ops`.
fn radix(ops: &mut [Op], scratch: &mut [Op], min: u64) {
    const DIGIT_BITS: u32 = 11;
    let Some(max) = ops.iter().map(|op| op.ts).max() else {
        return;
    };
    let bits = 64 - (max - min).leading_zeros();
    if bits == 0 {
        return;
    }
    let passes = bits.div_ceil(DIGIT_BITS);
    let width = bits.div_ceil(passes);
    let buckets = 1usize << width;
    let mask = (buckets - 1) as u64;
    let digit = |ts: u64, pass: u32| ((ts - min) >> (pass * width) & mask) as usize;
    // Every pass's histogram in one read of the ops.
    let mut counts = vec![0usize; buckets * passes as usize];
    for op in ops.iter() {
        for pass in 0..passes {
            counts[pass as usize * buckets + digit(op.ts, pass)] += 1;
        }
    }
    let (mut from, mut to) = (ops, scratch);
    let mut swapped = false;
    for (pass, starts) in (0..passes).zip(counts.chunks_exact_mut(buckets)) {
        // A digit every op shares leaves the order as it is.
        if starts.contains(&from.len()) {
            continue;
        }
        let mut at = 0;
        for n in starts.iter_mut() {
            (*n, at) = (at, at + *n);
        }
        for op in from.iter() {
            let d = digit(op.ts, pass);
            to[starts[d]] = *op;
            starts[d] += 1;
        }
        std::mem::swap(&mut from, &mut to);
        swapped = !swapped;
    }
    if swapped {
        // The sorted ops are in the scratch: back where the caller holds them.
        to.copy_from_slice(from);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Flow, OpKind};
    use super::*;

    #[test]
    fn ops_sort_by_time_keeping_their_order_at_equal_times() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        // Few ops (the comparison sort); many over few times (ties), over a window's
        // span of times (three digits), over any u64 (six), and already in order.
        // Past 2^16 ops, in two parts on two threads; most ops at the top of u64's range
        // (the middle saturates), span 1 below.
        for (n, span) in [
            (3_000, 300),
            (20_000, 300),
            (20_000, 60_000_000_000),
            (20_000, u64::MAX),
            (20_000, 0),
            (100_000, 300),
            (100_000, 60_000_000_000),
            (100_000, u64::MAX),
            (100_000, 0),
            (100_000, 1),
        ] {
            let mut ops: Vec<Op> = (0..n)
                .map(|k| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let ts = match span {
                        0 => u64::from(k) * 3,
                        1 if rng.is_multiple_of(5) => (1 << 63) + rng % (1 << 62),
                        1 => u64::MAX - rng % 3,
                        u64::MAX => rng,
                        span => 5_000 + rng % span,
                    };
                    // The name records the push order.
                    Op::new(ts, 1, OpKind::Instant, k, 0, Flow::None, 0)
                })
                .collect();
            let mut want = ops.clone();
            want.sort_by_key(|op| op.ts);
            sort_by_time(&mut ops);
            let key = |ops: &[Op]| ops.iter().map(|op| (op.ts, op.name)).collect::<Vec<_>>();
            assert!(
                key(&ops) == key(&want),
                "{n} ops over {span} ns: as a stable sort by time orders them"
            );
        }
    }
}
