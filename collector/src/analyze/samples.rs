//! Samples of one series in bounded memory, so that statistics over a recording an
//! hour long cost what statistics over a minute cost. Exact (every value kept) up to
//! `EXACT_SAMPLES`; past that the values are folded into buckets 1/1024 of their
//! magnitude wide, so a percentile is off by at most 1/2048 of itself (0.05%: 8 us on
//! a 16 ms gap). Count, mean and max stay exact.

use super::{interpolate, rank, summarize, Summary};

/// Values kept one by one before folding (64 KiB per series).
pub const EXACT_SAMPLES: usize = 8192;
/// Values below this are their own bucket; above, buckets keep this many significant
/// bits' worth (1024 per power of two).
const EXACT_BELOW: u64 = 2048;
const PER_OCTAVE: u64 = 1024;

#[derive(Clone, Debug, Default)]
pub struct Samples {
    exact: Vec<u64>,
    /// Counts per bucket once folded (`exact` is then empty): page `b / PER_OCTAVE`,
    /// made on first use, holds buckets `b` of one octave (a few pages per series, as
    /// its values span a few powers of two).
    pages: Vec<Option<Box<[u64; PER_OCTAVE as usize]>>>,
    folded: bool,
    count: usize,
    sum: u128,
    max: u64,
}

impl Extend<u64> for Samples {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, values: I) {
        for v in values {
            self.push(v);
        }
    }
}

impl Samples {
    /// Inlined (2.4 M calls in a 20 s bench replay's statistics: its call was 45
    /// instructions, a third of them saving and restoring registers), with the fold
    /// out of line.
    #[inline]
    pub fn push(&mut self, v: u64) {
        self.count += 1;
        self.sum += u128::from(v);
        self.max = self.max.max(v);
        if self.folded {
            self.count_in_bucket(v);
        } else if self.exact.len() < EXACT_SAMPLES {
            self.exact.push(v);
        } else {
            self.fold(v);
        }
    }

    /// `push` of each of `values`, with the count, sum and max taken over the slice in
    /// one pass (each request adds its gaps per point to four groups, nearly all of them
    /// folded: pushing them one by one was 6% of a replay's instructions).
    pub fn extend_from_slice(&mut self, values: &[u64]) {
        if !self.folded && values.len() > EXACT_SAMPLES - self.exact.len() {
            // The slice that folds the series: once per series.
            values.iter().for_each(|&v| self.push(v));
            return;
        }
        self.count += values.len();
        let (mut sum, mut max) = (0u128, self.max);
        for &v in values {
            sum += u128::from(v);
            max = max.max(v);
        }
        self.sum += sum;
        self.max = max;
        if self.folded {
            values.iter().for_each(|&v| self.count_in_bucket(v));
        } else {
            self.exact.extend_from_slice(values);
        }
    }

    /// Every value kept so far, and `v`, into buckets: from here on only counts.
    #[cold]
    #[inline(never)]
    fn fold(&mut self, v: u64) {
        self.fold_kept();
        self.count_in_bucket(v);
    }

    /// Every value kept so far into buckets: from here on only counts.
    fn fold_kept(&mut self) {
        for kept in std::mem::take(&mut self.exact) {
            self.count_in_bucket(kept);
        }
        self.folded = true;
    }

    /// Adds every value of `other`: the same series as pushing them one by one (count,
    /// sum, max and, exact or folded, the same percentiles), at the cost of `other`'s
    /// kept values or buckets rather than of every value it saw. A group's statistics
    /// are summed from its parts this way (`Breakdown`).
    pub fn merge(&mut self, other: &Samples) {
        if !other.folded {
            self.extend_from_slice(&other.exact);
            return;
        }
        // `other` saw more than `EXACT_SAMPLES` values: so has the sum.
        if !self.folded {
            self.fold_kept();
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
        if self.pages.len() < other.pages.len() {
            self.pages.resize(other.pages.len(), None);
        }
        for (mine, theirs) in self.pages.iter_mut().zip(&other.pages) {
            let Some(theirs) = theirs else { continue };
            match mine {
                Some(mine) => mine
                    .iter_mut()
                    .zip(theirs.iter())
                    .for_each(|(m, t)| *m += t),
                None => *mine = Some(theirs.clone()),
            }
        }
    }

    /// Inlined, with the page's first use out of line: every value of a long recording
    /// comes here (2.3 M calls in a 20 s bench replay).
    #[inline]
    fn count_in_bucket(&mut self, v: u64) {
        let b = bucket(v);
        let (page, at) = ((b / PER_OCTAVE) as usize, (b % PER_OCTAVE) as usize);
        match self.pages.get_mut(page) {
            Some(Some(counts)) => counts[at] += 1,
            _ => self.count_in_new_page(page, at),
        }
    }

    #[cold]
    fn count_in_new_page(&mut self, page: usize, at: usize) {
        if self.pages.len() <= page {
            self.pages.resize(page + 1, None);
        }
        self.pages[page].get_or_insert_with(|| Box::new([0; PER_OCTAVE as usize]))[at] += 1;
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Percentiles by the rule `summarize` uses: exactly while every value is kept,
    /// from the buckets' middles (never above the max) once folded.
    pub fn summary(&self) -> Option<Summary> {
        if !self.folded {
            return summarize(&self.exact);
        }
        let at = |permille: usize| {
            let (lo, frac) = rank(self.count, permille);
            let below = self.value_at(lo);
            let above = if frac > 0.0 {
                self.value_at(lo + 1)
            } else {
                below
            };
            interpolate(below, above, frac)
        };
        Some(Summary {
            count: self.count,
            p50_ns: at(500),
            p90_ns: at(900),
            p95_ns: at(950),
            p99_ns: at(990),
            p999_ns: at(999),
            max_ns: self.max,
            mean_ns: (self.sum / self.count as u128) as u64,
        })
    }

    /// The value of rank `k` (0-based, ascending), from its bucket.
    fn value_at(&self, k: usize) -> u64 {
        let mut seen = 0u64;
        for (page, counts) in self.pages.iter().enumerate() {
            let Some(counts) = counts else { continue };
            for (at, &n) in counts.iter().enumerate() {
                seen += n;
                if seen > k as u64 {
                    return middle(page as u64 * PER_OCTAVE + at as u64).min(self.max);
                }
            }
        }
        self.max
    }
}

/// Monotonic in `v`: values below `EXACT_BELOW` are their own bucket; above, octave `s`
/// (v >> s in [1024, 2048)) has 1024 buckets of width 2^s.
fn bucket(v: u64) -> u64 {
    if v < EXACT_BELOW {
        return v;
    }
    let shift = u64::from(63 - v.leading_zeros()) - 10;
    shift * PER_OCTAVE + (v >> shift)
}

fn middle(b: u64) -> u64 {
    if b < EXACT_BELOW {
        return b;
    }
    let shift = b / PER_OCTAVE - 1;
    let mantissa = b - shift * PER_OCTAVE;
    (mantissa << shift) + ((1u64 << shift) >> 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_up_to_the_cap() {
        let v: Vec<u64> = (0..EXACT_SAMPLES as u64)
            .map(|i| (i * 7919) % 100_003 * 1_000)
            .collect();
        let mut s = Samples::default();
        s.extend(v.iter().copied());
        assert_eq!(
            s.summary(),
            summarize(&v),
            "every value kept: the same figures"
        );
        assert_eq!(Samples::default().summary(), None);
    }

    #[test]
    fn slices_add_what_their_values_add_one_by_one() {
        // Slices before, across and after the fold, and values past u64 sums.
        let v: Vec<u64> = (0..3 * EXACT_SAMPLES as u64)
            .map(|i| (i * 7919) % 100_003 * 1_000 + if i % 501 == 0 { u64::MAX / 3 } else { 0 })
            .collect();
        let (mut one, mut slices) = (Samples::default(), Samples::default());
        v.iter().for_each(|&x| one.push(x));
        for chunk in v.chunks(1000) {
            slices.extend_from_slice(chunk);
        }
        assert_eq!(slices.summary(), one.summary());
        assert_eq!((slices.len(), slices.sum), (one.len(), one.sum));
    }

    #[test]
    fn merged_parts_read_as_the_whole() {
        // Parts exact and folded, merged into exact and folded sums, in either order.
        let v: Vec<u64> = (0..5 * EXACT_SAMPLES as u64)
            .map(|i| (i * 7919) % 100_003 * 1_000 + if i % 501 == 0 { u64::MAX / 3 } else { 0 })
            .collect();
        let whole = |values: &[u64]| {
            let mut s = Samples::default();
            values.iter().for_each(|&x| s.push(x));
            s
        };
        let cuts = [
            (0, 100, 200),
            (0, 4000, 8000),
            (0, 9000, 9100),
            (0, 100, 3 * EXACT_SAMPLES),
            (0, 2 * EXACT_SAMPLES, 5 * EXACT_SAMPLES),
            (EXACT_SAMPLES, EXACT_SAMPLES + 1, 5 * EXACT_SAMPLES),
        ];
        for (a, b, c) in cuts {
            let (first, second) = (whole(&v[a..b]), whole(&v[b..c]));
            let want = whole(&v[a..c]);
            for (x, y) in [(&first, &second), (&second, &first)] {
                let mut got = x.clone();
                got.merge(y);
                assert_eq!(got.summary(), want.summary(), "{a}..{b}..{c}");
                assert_eq!(
                    (got.len(), got.sum, got.max, got.folded),
                    (want.len(), want.sum, want.max, want.folded),
                    "{a}..{b}..{c}"
                );
            }
        }
        let mut empty = Samples::default();
        empty.merge(&Samples::default());
        assert_eq!(empty.summary(), None, "nothing merged into nothing");
    }

    #[test]
    fn folded_percentiles_stay_within_a_twentieth_of_a_percent() {
        // ITL-like gaps (ms with us noise) and a long tail, 30x the cap.
        let v: Vec<u64> = (0..(30 * EXACT_SAMPLES) as u64)
            .map(|i| {
                15_000_000
                    + (i * 104_729) % 9_000_000
                    + if i % 997 == 0 { 2_000_000_000 } else { 0 }
            })
            .collect();
        let mut s = Samples::default();
        s.extend(v.iter().copied());
        let (got, want) = (s.summary().unwrap(), summarize(&v).unwrap());
        assert_eq!(
            (got.count, got.max_ns, got.mean_ns),
            (want.count, want.max_ns, want.mean_ns)
        );
        for (g, w) in [
            (got.p50_ns, want.p50_ns),
            (got.p90_ns, want.p90_ns),
            (got.p95_ns, want.p95_ns),
            (got.p99_ns, want.p99_ns),
            (got.p999_ns, want.p999_ns),
        ] {
            let err = g.abs_diff(w) as f64 / w as f64;
            assert!(err <= 1.0 / 2048.0, "{g} against {w}: {err}");
        }
        // Memory: a page per octave the values span, not one per value.
        let pages = s.pages.iter().flatten().count();
        assert!(pages <= 12, "{pages} pages of {PER_OCTAVE} counts");
    }

    #[test]
    fn buckets_are_ordered_and_hold_their_values() {
        let mut last = 0;
        for v in (0..200_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last, "monotonic at {v}");
            last = b;
            let m = middle(b);
            assert!(
                m.abs_diff(v) as f64 <= v as f64 / 2048.0 + 0.5,
                "{v}: middle {m}"
            );
        }
    }
}
