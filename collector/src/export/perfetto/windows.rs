//! Cuts what the pipeline hands over into export windows as the replay goes, so that
//! what is held is what is still in flight, not the recording. Window W = [ws, we) is
//! written once the pipeline's event time is `cut::LATENESS_NS` past we and no request
//! the stitcher still holds can start before we (a long stream holds its window
//! back, up to `cut::MAX_HOLD_NS`). Its requests (those that began before we) are then
//! numbered in the order their chains start, continuing the windows before, and
//! joined to the GPU steps around them; its diagnoses are its own.

use super::layout::{self, Conn, Running, Trace};
use crate::diagnose;
use crate::ingest::model::NvmlSample;
use crate::ingest::record::FileHeader;
use crate::pipeline::cut::Cutter;
use crate::pipeline::{CuptiSpan, Output, Pipeline};

pub(super) struct Windows {
    width: u64,
    start_monotonic_ns: u64,
    start_realtime_ns: u64,
    header_end_ns: u64,
    dropped: u64,
    /// The trace's origin, fixed when the first window is written.
    origin: Option<u64>,
    first_event_ns: Option<u64>,
    last_event_ns: u64,
    /// Requests and steps handed over, not yet written.
    cutter: Cutter,
    cupti: Vec<CuptiSpan>,
    nvml: Vec<(u64, NvmlSample)>,
    /// Ring-buffer drop readings (time, drops so far) not written yet.
    drops: Vec<(u64, u64)>,
    connections: Vec<Conn>,
    counters: Option<Running>,
    /// Windows before this one (by number from the origin) are written.
    next_window: u64,
    pub(super) late_events: u64,
}

impl Windows {
    pub(super) fn new(header: &FileHeader, width: u64) -> Windows {
        Windows {
            width: width.max(1),
            start_monotonic_ns: header.start_monotonic_ns,
            start_realtime_ns: header.start_realtime_ns,
            header_end_ns: header.end_monotonic_ns,
            dropped: header.counters.map_or(0, |c| c.dropped),
            origin: None,
            first_event_ns: None,
            last_event_ns: 0,
            cutter: Cutter::default(),
            cupti: Vec::new(),
            nvml: Vec::new(),
            drops: Vec::new(),
            connections: Vec::new(),
            counters: None,
            next_window: 0,
            late_events: 0,
        }
    }

    /// Takes what the pipeline finished since the last take.
    pub(super) fn take(&mut self, p: &mut Pipeline) {
        let out: Output = p.take();
        self.first_event_ns = out.first_event_ns;
        self.last_event_ns = out.last_event_ns;
        self.late_events = out.late_events;
        self.cutter.add(out.requests, out.steps);
        self.cupti.extend(out.cupti);
        self.nvml.extend(out.nvml);
        self.drops.extend(out.drops);
        self.connections
            .extend(out.connections.into_iter().map(Conn::new));
    }

    fn origin(&self) -> u64 {
        let header = FileHeader {
            start_monotonic_ns: self.start_monotonic_ns,
            ..Default::default()
        };
        self.origin
            .unwrap_or_else(|| crate::export::start_ns(&header, self.first_event_ns))
    }

    fn window_of(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.origin()) / self.width
    }

    /// The first window with something not yet written (None: nothing is pending).
    fn next_busy(&self) -> Option<u64> {
        let at = |ts: u64| self.window_of(ts);
        let first = [
            self.cutter.first_pending_ns().map(at),
            self.cupti.iter().map(|s| at(s.start_ns)).min(),
            self.nvml.first().map(|(ts, _)| at(*ts)),
            self.connections.iter().map(|c| at(c.end_ns)).min(),
        ]
        .into_iter()
        .flatten()
        .min()?;
        Some(first.max(self.next_window))
    }

    /// The next window that can be written now (see the module doc), if any.
    pub(super) fn ready(&mut self, p: &Pipeline) -> Option<Trace> {
        let k = self.next_busy()?;
        let end = self
            .origin()
            .saturating_add((k + 1).saturating_mul(self.width));
        Cutter::ready(p, end).then(|| self.cut(k, end, false))
    }

    /// The replay ended (`Pipeline::flush`ed and taken): the next window, the last
    /// one taking everything left; None once it is written.
    pub(super) fn rest(&mut self) -> Option<Trace> {
        if self.next_window == u64::MAX {
            return None;
        }
        let end_ns = self.header_end_ns.max(self.last_event_ns);
        let last = self.window_of(end_ns).max(self.next_window);
        let k = self.next_busy().unwrap_or(last);
        if k >= last {
            return Some(self.cut(k, u64::MAX, true));
        }
        let end = self
            .origin()
            .saturating_add((k + 1).saturating_mul(self.width));
        Some(self.cut(k, end, false))
    }

    /// Window `k`: what begins before `end` (connections: what ends before it).
    fn cut(&mut self, k: u64, end: u64, last: bool) -> Trace {
        let origin = self.origin();
        self.origin = Some(origin);
        let before = |ts: u64| ts < end;
        let crate::pipeline::cut::Cut {
            mut requests,
            steps,
        } = self.cutter.cut(end);
        let mut nvml = std::mem::take(&mut self.nvml);
        self.nvml = nvml.split_off(nvml.partition_point(|(ts, _)| before(*ts)));
        // The diagnoses on a thread of their own while the rest of the cut is made
        // (the counters' pass over every token, the spans split): with one window this
        // all runs after the last event, when the reading thread's core is idle.
        let steps_so_far = self.cutter.steps();
        let diagnose = || {
            diagnose::diagnose(&diagnose::Input {
                requests: requests.iter().collect(),
                steps: steps_so_far,
                nvml: &nvml,
                shares: &[],
            })
        };
        let (diagnosed, rest) = super::beside("tokenscope-diagnose", diagnose, || {
            let (mut cupti, later): (Vec<CuptiSpan>, Vec<CuptiSpan>) =
                std::mem::take(&mut self.cupti)
                    .into_iter()
                    .partition(|s| before(s.start_ns));
            self.cupti = later;
            cupti.sort_by_key(|s| s.start_ns);
            let (mut connections, later): (Vec<Conn>, Vec<Conn>) =
                std::mem::take(&mut self.connections)
                    .into_iter()
                    .partition(|c| before(c.end_ns));
            self.connections = later;
            connections.sort_by_key(|c| c.span.first_ns);
            let mut drops = std::mem::take(&mut self.drops);
            // Readings come through the pipeline in time order.
            let keep = drops.partition_point(|&(t, _)| last || before(t));
            self.drops = drops.split_off(keep);
            let counters = self.counters.get_or_insert_with(|| Running::new(origin));
            counters.add(&requests);
            let end_ns = self.header_end_ns.max(self.last_event_ns).max(origin);
            let counters = counters.take(end, last.then_some((end_ns, self.dropped)), &drops);
            (cupti, connections, counters)
        });
        // No thread to be had: made here.
        let diagnoses = diagnosed.unwrap_or_else(diagnose);
        let (cupti, connections, counters) = rest;
        // Stable: ties keep the order of ids.
        requests.sort_by_key(|r| r.start_ns);
        self.cutter.forget_steps(end);
        self.next_window = if last { u64::MAX } else { k + 1 };
        Trace {
            start_ns: origin,
            start_monotonic_ns: self.start_monotonic_ns,
            start_realtime_ns: self.start_realtime_ns,
            cites: layout::Cites::of(&diagnoses),
            requests,
            steps,
            cupti,
            nvml,
            connections,
            diagnoses,
            counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stitch::testnet::{proxied, Net, MS};

    #[test]
    fn windows_are_written_as_the_replay_goes_with_ids_running_across_them() {
        // A request every 310 ms for 37 s, in 1 s windows.
        let mut net = Net::default();
        for k in 0..120u16 {
            proxied(
                &mut net,
                1_000 * MS + u64::from(k) * 310 * MS,
                20000 + k,
                30000 + k,
                "r",
            );
        }
        let mut events = net.events;
        events.sort_by_key(|e| e.ts_ns);
        let header = FileHeader::default();
        let mut p = super::super::pipeline(&header);
        let mut windows = Windows::new(&header, 1_000 * MS);
        let (mut ids, mut early, mut held) = (Vec::new(), 0, 0);
        for batch in events.chunks(64) {
            for e in batch {
                p.push(e.clone());
            }
            windows.take(&mut p);
            held = held.max(windows.cutter.held());
            while let Some(t) = windows.ready(&p) {
                early += 1;
                ids.extend(t.requests.iter().map(|r| r.id));
            }
        }
        p.flush();
        windows.take(&mut p);
        while let Some(t) = windows.rest() {
            ids.extend(t.requests.iter().map(|r| r.id));
        }
        println!("{early} windows written as the replay went, at most {held} requests held");
        assert!(
            early >= 25,
            "most windows are written before the replay ends: {early}"
        );
        assert!(
            held <= 20,
            "what is held is what the last seconds finished, not the recording: {held}"
        );
        assert_eq!(
            ids,
            (0..120).collect::<Vec<_>>(),
            "ids in start order, across windows"
        );
    }
}
