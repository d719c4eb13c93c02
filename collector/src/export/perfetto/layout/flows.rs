//! Flow ids: a token's flow across its points numbered as trace processor reads
//! them, an id reused once its flow has ended.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Builder;

/// Flow ids as written, shared by the export's windows. Trace processor reads packets
/// sorted by time (TraceSorter) and frees a flow id once an event ends its flow
/// (`terminating_flow_ids`: FlowTracker::End with close_flow, from
/// TrackEventEventImporter::MaybeParseTrackEventFlows); the next event to name the id
/// begins a new flow. So a flow takes the smallest id whose last flow ended before it
/// starts: ids stay as few as the flows in flight at once, a one-byte varint while
/// they are under 128 (a token's flow id costs 2 B where numbering every flow of the
/// export cost 4). Windows overlap in time, hence the end times kept per id. The
/// `flow` table's `trace_id` is then the reused id, shared by flows apart in time: the
/// UI (FlowManager) and `directly_connected_flow` follow a flow by its edges
/// (`slice_out`, `slice_in`), which stay each token's own.
#[derive(Default)]
pub(super) struct FlowIds {
    /// By id - 1: when the last flow on that id ends.
    ends: Vec<u64>,
    /// The ids (index = id - 1) in use at the last flow's start, by end; the rest are
    /// in `free`. Within a window flows start in time order, so an id only moves from
    /// `busy` to `free`; a window starts over from `ends`.
    busy: BinaryHeap<Reverse<(u64, u32)>>,
    free: BinaryHeap<Reverse<u32>>,
}

impl FlowIds {
    /// Before a window's flows: they may start before the last window's flows ended.
    fn window(&mut self) {
        self.free.clear();
        self.busy = (0..)
            .zip(&self.ends)
            .map(|(i, &end)| Reverse((end, i)))
            .collect();
    }

    /// An id for a flow from `start` to `end`, flows taken in order of start: the
    /// smallest whose last flow ended before `start`, else a new one. Logarithmic in
    /// the ids in use, which are the flows in flight at once (a proxy that holds a
    /// whole response keeps each of its tokens' flows in flight).
    fn take(&mut self, start: u64, end: u64) -> u64 {
        while let Some(&Reverse((e, i))) = self.busy.peek() {
            if e >= start {
                break;
            }
            self.busy.pop();
            self.free.push(Reverse(i));
        }
        let i = match self.free.pop() {
            Some(Reverse(i)) => i,
            None => {
                self.ends.push(0);
                u32::try_from(self.ends.len() - 1).expect("fewer than 2^32 flows in flight")
            }
        };
        self.ends[i as usize] = end;
        self.busy.push(Reverse((end, i)));
        u64::from(i) + 1
    }
}

impl Builder {
    /// `n` new flow ids of this window; the first of them (the rest follow it).
    pub(super) fn flows(&mut self, n: usize) -> u64 {
        let first = self.flows_handed + 1;
        self.flows_handed += n as u64;
        first
    }

    /// Renumbers the window's flows (ops in time order) with the export's `FlowIds`,
    /// each from its first event to its last.
    pub(super) fn number_flows(&mut self) {
        let n = self.flows_handed as usize;
        if n == 0 {
            return;
        }
        let mut ends = vec![0; n];
        for op in &self.plan.ops {
            if let Some(id) = op.flow_id() {
                ends[id as usize - 1] = op.ts;
            }
        }
        let mut wire = vec![0; n];
        self.uuids.flows.window();
        for op in &mut self.plan.ops {
            if let Some(id) = op.flow_id() {
                let k = id as usize - 1;
                if wire[k] == 0 {
                    wire[k] = self.uuids.flows.take(op.ts, ends[k]);
                }
                op.aux = wire[k];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_takes_the_smallest_id_free_at_its_start_across_windows() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |m: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % m
        };
        let mut ids = FlowIds::default();
        // Brute force: an id's flows, each (start, end).
        let mut held: Vec<Vec<(u64, u64)>> = Vec::new();
        let mut most = 0;
        for window in 0..4u64 {
            ids.window();
            // Windows overlap in time: each starts before the last one's flows end.
            let mut start = window * 5_000;
            for _ in 0..2_000 {
                start += next(10);
                let long = next(8) == 0;
                let end = start + next(if long { 3_000 } else { 100 });
                let want = held
                    .iter()
                    .position(|f| f.iter().all(|&(_, e)| e < start))
                    .unwrap_or(held.len());
                let got = ids.take(start, end);
                assert_eq!(got, want as u64 + 1, "the smallest id free at {start}");
                if want == held.len() {
                    held.push(Vec::new());
                }
                held[want].push((start, end));
                most = most.max(held.len());
            }
        }
        assert!(
            (10..200).contains(&most),
            "ids are reused, as many as the flows in flight at once: {most}"
        );
    }
}
