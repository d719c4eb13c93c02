//! The reorder window's queue: events waiting to go through in time order. Nearly all
//! come in order already (a recording is written so; live, each CPU's buffer is), and
//! those wait in a plain queue; only the ones older than the newest waiting go in a
//! heap. The earlier of the two fronts goes first: the order a single heap gives, at
//! a queue's cost for most events.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// An event waiting in the reorder window: its order, and where it waits (its batch's
/// slot in `Held` and its index there: the queues move these 24 bytes, not the
/// event's few hundred).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Pending {
    pub(super) ts_ns: u64,
    /// Arrival number: equal times go in arrival order.
    pub(super) seq: u64,
    pub(super) slot: u32,
    pub(super) index: u32,
}

#[derive(Default)]
pub(super) struct Reorder {
    /// In (ts_ns, seq) order.
    in_order: VecDeque<Pending>,
    late: BinaryHeap<Reverse<Pending>>,
}

impl Reorder {
    /// `p.seq` must be greater than every seq pushed before.
    pub(super) fn push(&mut self, p: Pending) {
        match self.in_order.back() {
            Some(last) if p.ts_ns < last.ts_ns => self.late.push(Reverse(p)),
            _ => self.in_order.push_back(p),
        }
    }

    /// The first to go.
    pub(super) fn peek(&self) -> Option<&Pending> {
        match (self.in_order.front(), self.late.peek()) {
            (Some(a), Some(Reverse(b))) => Some(a.min(b)),
            (a, b) => a.or(b.map(|r| &r.0)),
        }
    }

    /// The first to go if it is no later than `through` (what `peek` and `pop` give,
    /// with one look at the fronts: nearly always only the queue's, the heap empty).
    #[inline]
    pub(super) fn pop_through(&mut self, through: u64) -> Option<Pending> {
        if self.late.is_empty() {
            return match self.in_order.front() {
                Some(p) if p.ts_ns <= through => self.in_order.pop_front(),
                _ => None,
            };
        }
        match self.peek() {
            Some(p) if p.ts_ns <= through => self.pop(),
            _ => None,
        }
    }

    pub(super) fn pop(&mut self) -> Option<Pending> {
        let from_late = match (self.in_order.front(), self.late.peek()) {
            (Some(a), Some(Reverse(b))) => b < a,
            (None, _) => true,
            (Some(_), None) => false,
        };
        if from_late {
            self.late.pop().map(|r| r.0)
        } else {
            self.in_order.pop_front()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_what_a_single_heap_gives() {
        // Mostly in order, with late ones, ties, and pops between pushes.
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let mut ours = Reorder::default();
        let mut heap = BinaryHeap::new();
        let mut now = 1_000u64;
        for seq in 0..5_000u64 {
            now += next() % 3;
            let ts_ns = if next() % 10 == 0 {
                now - next() % 50
            } else {
                now
            };
            let p = Pending {
                ts_ns,
                seq,
                slot: seq as u32,
                index: 0,
            };
            ours.push(p);
            heap.push(Reverse(p));
            while next() % 3 == 0 {
                assert_eq!(ours.peek(), heap.peek().map(|r| &r.0), "the same first");
                assert_eq!(ours.pop(), heap.pop().map(|r| r.0), "the same order");
            }
            // What is no later than a time, as the window lets it through.
            let through = now.saturating_sub(next() % 40);
            while let Some(p) = ours.pop_through(through) {
                assert!(p.ts_ns <= through, "nothing later than asked");
                assert_eq!(Some(p), heap.pop().map(|r| r.0), "the same order");
            }
            assert!(
                heap.peek().is_none_or(|r| r.0.ts_ns > through),
                "everything up to the time went"
            );
        }
        while let Some(Reverse(want)) = heap.pop() {
            assert_eq!(ours.pop(), Some(want), "drained in the same order");
        }
        assert_eq!(ours.pop(), None, "nothing left");
    }
}
