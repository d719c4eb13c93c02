//! One pipeline for every view: events in (live or replayed, put in time order
//! within a bounded reorder window), finished requests with their GPU share, GPU
//! steps, the NVML and CUPTI series and the protocol tally out. Incremental: a
//! request leaves the stitcher once it settled (see `stitch::stitcher`), and what
//! the stitcher let go is never read again. `report` and `export` take what it
//! produced as they go and cut it into windows once nothing held can still start in
//! them (`cut`): the report sums each window up and lets its requests go, the export
//! writes it (connections included); `top` takes it as it goes and keeps a window of
//! it. `finish` hands over everything at once (tests compare it with the batch stitch).

pub mod cut;
mod held;
mod reorder;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use held::Held;
use reorder::{Pending, Reorder};

use crate::analyze::protocols::{ProtocolTally, Protocols};
use crate::gpu::{GpuStep, StepTimer, StepTracker};
use crate::ingest::model::{event::Body, GpuActivityKind, NvmlSample};
use crate::ingest::record::FileHeader;
use crate::ingest::Event;
use crate::stitch::{
    attribution, ConnectionSpan, ExchangeSpan, Request, Settle, Settled, Stitcher,
};

/// How the pipeline holds and lets go (event time throughout).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Events may arrive this much out of time order (per-CPU ring buffers, batches);
    /// later ones are still used, and counted in `Output::late_events`.
    pub reorder_ns: u64,
    /// How often (in event time) settled requests are let go.
    pub advance_every_ns: u64,
    pub settle: Settle,
    /// Hand over each released connection with every exchange it carried
    /// (`Output::connections`), for views that draw connections.
    pub connections: bool,
    /// When the requests still held are built as they stand (`Pipeline::open`), for
    /// views of what is in flight.
    pub open: Open,
}

/// When the pipeline builds the requests it still holds (`Pipeline::open`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Open {
    /// Never (a report wants finished requests only; the agent counts requests in
    /// flight from `Pipeline::serving`).
    Never,
    /// At `Pipeline::tick` only: `top` shows them once a pass (a second), and advances
    /// come four times a second; building every stream in flight at each of them was
    /// most of the allocation churn of top's pipeline thread.
    AtTick,
}

impl Config {
    /// Replaying a recording for a report.
    pub fn replay() -> Config {
        Config {
            reorder_ns: 1_000_000_000,
            advance_every_ns: 1_000_000_000,
            settle: Settle::default(),
            connections: false,
            open: Open::Never,
        }
    }

    /// Replaying the recording `header` heads: its events held no longer than they
    /// came out of order in it (`FileHeader::disorder_ns`, known once it completed),
    /// at most the default second. The events are then fed in the same order as with
    /// the second (an event let through at T - window had every event older than it
    /// already in: one coming after would be more out of order than the file's
    /// most), and held a few microseconds in a recording whose recorder sorted its
    /// drains, so each is still in the cache when it is fed: a tenth less time.
    pub fn replay_of(header: &FileHeader) -> Config {
        let mut cfg = Config::replay();
        if let Some(d) = header.disorder_ns.filter(|_| header.complete) {
            cfg.reorder_ns = cfg.reorder_ns.min(d);
        }
        cfg
    }

    /// Replaying a recording for the Perfetto export (connections drawn too).
    pub fn export_of(header: &FileHeader) -> Config {
        Config {
            connections: true,
            ..Config::replay_of(header)
        }
    }

    /// Events as a live recording hands them over: per-CPU buffers read in batches,
    /// every 50 ms (`record::DRAIN_LIVE`) or sooner: the window holds four drains, so
    /// an event read a drain late (the recorder's thread not scheduled at once on a
    /// busy host) is still in time. Settled once a second: the view's tick (once a
    /// second too) settles what it shows, and each settling walks every exchange held
    /// (at 250 ms, a tenth of `top`'s CPU at 4k tokens/s).
    pub fn live() -> Config {
        Config {
            reorder_ns: 200_000_000,
            advance_every_ns: 1_000_000_000,
            settle: Settle::default(),
            connections: false,
            open: Open::AtTick,
        }
    }

    /// A recording already in time order, watched as it plays (`top --replay`).
    pub fn sorted() -> Config {
        Config {
            reorder_ns: 0,
            ..Config::live()
        }
    }
}

/// A CUPTI activity record: device time, and where it ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuptiSpan {
    pub kind: GpuActivityKind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub pid: u32,
    /// Shared between the spans that bear them (kernel names repeat).
    pub comm: Arc<str>,
    pub name: Arc<str>,
    pub device: u32,
    pub stream: u32,
}

/// What the pipeline produced: everything, as a report lists every request.
#[derive(Debug, Default)]
pub struct Output {
    /// Finished requests, numbered in the order their chains start (as one batch
    /// would), with their GPU share.
    pub requests: Vec<Request>,
    pub steps: Vec<GpuStep>,
    /// NVML samples with their time, in time order.
    pub nvml: Vec<(u64, NvmlSample)>,
    pub cupti: Vec<CuptiSpan>,
    /// The ring buffer's drops so far, at the times the recorder read them (written
    /// when they moved; empty when nothing was dropped or the recording predates it).
    pub drops: Vec<(u64, u64)>,
    /// Released connections with their exchanges, in the order they were released
    /// (with `Config::connections` only).
    pub connections: Vec<ConnectionSpan>,
    /// The first and last event times pushed.
    pub first_event_ns: Option<u64>,
    pub last_event_ns: u64,
    /// Socket I/Os whose bytes were neither HTTP nor TLS, on released connections.
    pub unparsed_ios: u64,
    pub events: u64,
    /// Events that came later than the reorder window allows (used out of order).
    pub late_events: u64,
    tally: ProtocolTally,
}

impl Output {
    pub fn protocols(&self, tls_untied: u64) -> Protocols {
        self.tally.finish(tls_untied)
    }
}

pub struct Pipeline {
    cfg: Config,
    pending: Reorder,
    /// The events of `pending`, in the batches they came in.
    held: Held,
    seq: u64,
    /// The newest event time pushed, and the time of the last event let through.
    newest_ns: u64,
    released_ns: u64,
    next_advance_ns: Option<u64>,
    stitcher: Stitcher,
    calls: StepTracker,
    /// CUPTI records waiting for the step they time.
    timer: StepTimer,
    out: Output,
    /// The requests still held at the last advance, as they stood.
    open: Vec<Request>,
    /// Exchanges let go before their connection (with `Config::connections`).
    let_go: HashMap<usize, Vec<ExchangeSpan>>,
    names: HashSet<Arc<str>>,
}

impl Pipeline {
    /// `dropped`: the recording already lost events (every request is marked).
    pub fn new(cfg: Config, dropped: bool) -> Pipeline {
        Pipeline {
            cfg,
            pending: Reorder::default(),
            held: Held::default(),
            seq: 0,
            newest_ns: 0,
            released_ns: 0,
            next_advance_ns: None,
            // Requests held are built at a tick only, when `cfg.open` says so.
            stitcher: Stitcher::new(cfg.settle, dropped).with_open(false),
            calls: StepTracker::default(),
            timer: StepTimer::default(),
            out: Output::default(),
            open: Vec::new(),
            let_go: HashMap::new(),
            names: HashSet::new(),
        }
    }

    /// One event, in about time order (see `Config`'s reorder window).
    pub fn push(&mut self, event: Event) {
        let ts_ns = event.ts_ns;
        if !self.admit(ts_ns) {
            self.feed(&event);
            return;
        }
        let (slot, index) = self.held.single(event);
        self.held.wait(slot);
        self.enqueue(ts_ns, slot, index);
    }

    /// Batches whose events all went through are kept for `take_spare`, for a live
    /// source to refill (see `ingest::spares`).
    pub fn keep_spare_batches(&mut self) {
        self.held.keep_spares();
    }

    /// Batches whose events all went through are kept whole, events and all, for a
    /// recording's reader to write its next frame over (`Source::recycle`).
    pub fn recycle_batches(&mut self) {
        self.held.keep_whole_spares();
    }

    /// A batch let go (empty with room after `keep_spare_batches`, whole after
    /// `recycle_batches`), once one of them was asked for and one was let go.
    pub fn take_spare(&mut self) -> Option<Vec<Event>> {
        self.held.take_spare()
    }

    /// `push` of each event in turn, the batch kept whole while its events wait in the
    /// reorder window (see `held`): no event is moved.
    pub fn push_batch(&mut self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let slot = self.held.batch(events);
        for index in 0..self.held.len(slot) as u32 {
            let ts_ns = self.held.ts_ns(slot, index);
            if self.admit(ts_ns) {
                self.held.wait(slot);
                self.enqueue(ts_ns, slot, index);
            } else {
                self.feed_held(slot, index, false);
            }
        }
        self.held.seal(slot);
    }

    /// Counts an event in; false when it came later than the reorder window allows
    /// (it is fed at once, out of order).
    fn admit(&mut self, ts_ns: u64) -> bool {
        self.out.events += 1;
        let first = self.out.first_event_ns.get_or_insert(ts_ns);
        *first = (*first).min(ts_ns);
        self.out.last_event_ns = self.out.last_event_ns.max(ts_ns);
        if ts_ns < self.released_ns {
            self.out.late_events += 1;
            return false;
        }
        true
    }

    /// Queues the held event at (slot, index) and feeds what is older than the reorder
    /// window now.
    fn enqueue(&mut self, ts_ns: u64, slot: u32, index: u32) {
        self.newest_ns = self.newest_ns.max(ts_ns);
        self.seq += 1;
        self.pending.push(Pending {
            ts_ns,
            seq: self.seq,
            slot,
            index,
        });
        let through = self.newest_ns.saturating_sub(self.cfg.reorder_ns);
        while let Some(p) = self.pending.pop_through(through) {
            self.released_ns = p.ts_ns;
            self.feed_held(p.slot, p.index, true);
            let due = *self
                .next_advance_ns
                .get_or_insert(p.ts_ns + self.cfg.advance_every_ns);
            if p.ts_ns >= due {
                self.advance();
            }
        }
    }

    /// Feeds the held event at (slot, index) where it lies; `queued`: it came through
    /// the queue (its batch may go now), not late.
    fn feed_held(&mut self, slot: u32, index: u32, queued: bool) {
        let events = self.held.take(slot);
        self.feed(&events[index as usize]);
        self.held.put_back(slot, events, queued);
    }

    /// The clock reached `now_ns` (event time): events older than the reorder window
    /// go through, and what settled by then is let go, even if no event came.
    pub fn tick(&mut self, now_ns: u64) {
        let through = now_ns.saturating_sub(self.cfg.reorder_ns);
        while let Some(p) = self.pending.pop_through(through) {
            self.released_ns = p.ts_ns;
            self.feed_held(p.slot, p.index, true);
        }
        self.released_ns = self.released_ns.max(through);
        self.stitcher.pass_time(through);
        if self.cfg.open == Open::AtTick {
            self.stitcher.set_open(true);
            self.advance();
            self.stitcher.set_open(false);
        } else {
            self.advance();
        }
    }

    /// What was produced since the last take (finished requests in the order they
    /// settled, without GPU attribution; steps; NVML; CUPTI). Counters stay.
    pub fn take(&mut self) -> Output {
        Output {
            requests: std::mem::take(&mut self.out.requests),
            steps: std::mem::take(&mut self.out.steps),
            nvml: std::mem::take(&mut self.out.nvml),
            cupti: std::mem::take(&mut self.out.cupti),
            drops: std::mem::take(&mut self.out.drops),
            connections: std::mem::take(&mut self.out.connections),
            first_event_ns: self.out.first_event_ns,
            last_event_ns: self.out.last_event_ns,
            unparsed_ios: self.out.unparsed_ios,
            events: self.out.events,
            late_events: self.out.late_events,
            tally: ProtocolTally::default(),
        }
    }

    /// How TLS and HTTP/2 were read on the connections released so far.
    pub fn protocols(&self, tls_untied: u64) -> Protocols {
        self.out.protocols(tls_untied)
    }

    /// The requests still held at the last advance, as they stood then (empty unless
    /// `Config::open` built them then: with `Open::AtTick`, after a tick).
    pub fn open(&self) -> &[Request] {
        &self.open
    }

    /// Requests being served now, one `(pid, comm)` per request, at the process that
    /// accepted it (a proxy and its engine each serve the same stream), as of the
    /// events let through the reorder window.
    pub fn serving(&self) -> impl Iterator<Item = (u32, &str)> + '_ {
        self.stitcher.serving()
    }

    /// `open`, handed over (a view that keeps them need not copy them).
    pub fn take_open(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.open)
    }

    /// The time of the last event let through the reorder window: what happened
    /// before it has reached the stitcher (but for late events).
    pub fn released_ns(&self) -> u64 {
        self.released_ns
    }

    /// The earliest start of a request not yet handed over (see
    /// `Stitcher::oldest_held_ns`); None: none is held.
    pub fn oldest_held_ns(&self) -> Option<u64> {
        self.stitcher.oldest_held_ns()
    }

    /// The input ended but the reader goes on: everything held is let go now.
    pub fn flush(&mut self) {
        while let Some(p) = self.pending.pop() {
            self.released_ns = p.ts_ns;
            self.feed_held(p.slot, p.index, true);
        }
        self.held.seal_open();
        self.advance();
        let last = self.stitcher.finish();
        self.absorb(last);
    }

    /// Lets go what settled (also called on its own as event time passes).
    pub fn advance(&mut self) {
        self.next_advance_ns = Some(self.released_ns + self.cfg.advance_every_ns);
        let settled = self.stitcher.advance();
        self.absorb(settled);
    }

    /// The input ended: everything held is let go, requests are numbered in the order
    /// their chains start, and GPU steps are joined to them. Joined once, over
    /// everything: the first requests need the engine's habits (chunked prefill, rows
    /// copied per request) that later steps show.
    pub fn finish(mut self) -> Output {
        self.flush();
        renumber(&mut self.out.requests);
        self.out.steps.sort_by_key(|s| s.start_ns);
        attribution::attribute(&mut self.out.requests, &mut self.out.steps);
        self.out
    }

    fn feed(&mut self, event: &Event) {
        match &event.body {
            Some(Body::Nvml(s)) => self.out.nvml.push((event.ts_ns, s.clone())),
            Some(Body::Gpu(g)) => {
                if crate::gpu::steps::device_work(g.kind()) {
                    self.timer.record(
                        event.pid,
                        (g.device, g.stream),
                        (g.start_ns, g.end_ns),
                        &mut self.out.steps,
                    );
                }
                let span = CuptiSpan {
                    kind: g.kind(),
                    start_ns: g.start_ns,
                    end_ns: g.end_ns,
                    pid: event.pid,
                    comm: self.intern(&event.comm),
                    name: self.intern(&g.name),
                    device: g.device,
                    stream: g.stream,
                };
                self.out.cupti.push(span);
            }
            Some(Body::Ring(r)) => self.out.drops.push((event.ts_ns, r.dropped)),
            Some(Body::Cuda(_)) => {
                if let Some(mut step) = self.calls.push(event) {
                    self.timer.time(&mut step);
                    self.out.steps.push(step);
                }
            }
            _ => self.stitcher.push(event),
        }
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n: Arc<str> = s.into();
        self.names.insert(n.clone());
        n
    }

    fn absorb(&mut self, s: Settled) {
        for c in &s.connections {
            self.out.unparsed_ios += c.unparsed_ios;
            self.out.tally.add(c);
        }
        if self.cfg.connections {
            for (c, x) in &s.exchanges {
                self.let_go.entry(*c).or_default().push(ExchangeSpan::of(x));
            }
            for c in &s.connections {
                let earlier = self.let_go.remove(&c.id).unwrap_or_default();
                self.out.connections.push(ConnectionSpan::of(c, earlier));
            }
        }
        self.out.requests.extend(s.requests);
        self.open = s.open;
    }
}

/// Numbers requests from 0 in the order their chains start (a stitch of the whole
/// recording at once numbers them so).
pub fn renumber(requests: &mut [Request]) {
    requests.sort_by_key(|r| r.order);
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stitch::testnet::*;

    #[test]
    fn a_replay_holds_events_as_long_as_its_complete_recording_says_they_came_late() {
        let done = FileHeader {
            complete: true,
            disorder_ns: Some(45),
            ..Default::default()
        };
        assert_eq!(Config::replay_of(&done).reorder_ns, 45);
        assert!(
            Config::export_of(&done).connections,
            "the export's, with connections"
        );
        assert_eq!(Config::export_of(&done).reorder_ns, 45);
        for (complete, disorder) in [(false, Some(45)), (true, None)] {
            let h = FileHeader {
                complete,
                disorder_ns: disorder,
                ..done.clone()
            };
            assert_eq!(
                Config::replay_of(&h).reorder_ns,
                Config::replay().reorder_ns,
                "a recording cut off, or older than the field: the default second"
            );
        }
        let slow = FileHeader {
            disorder_ns: Some(5_000_000_000),
            ..done
        };
        assert_eq!(
            Config::replay_of(&slow).reorder_ns,
            1_000_000_000,
            "never more than the default"
        );
    }

    const T0: u64 = 1_000 * MS;

    /// A streaming request from the bench to the engine at 1 s: its head, then a token
    /// at each of `token_at`; `end` closes its response (no connection close). Its
    /// events in time order, split at `split_at`.
    fn streamed(token_at: &[u64], end: Option<u64>, split_at: u64) -> (Vec<Event>, Vec<Event>) {
        let mut net = Net::default();
        let a = net.connect(T0, (BENCH, "bench", 40000), (ENGINE, "engine", 9000));
        net.send(T0 + MS, BENCH, a, &request_bytes("p"), 100_000);
        let e = net.peer_of(a);
        net.send(T0 + 50 * MS, ENGINE, e, HEAD, 50_000);
        for (i, &at) in token_at.iter().enumerate() {
            net.send(at, ENGINE, e, &token("r", i), 100_000);
        }
        if let Some(end) = end {
            net.send(end, ENGINE, e, &chunk("data: [DONE]\n\n"), 100_000);
            net.send(end + MS, ENGINE, e, b"0\r\n\r\n", 100_000);
        }
        let mut events = net.events;
        events.sort_by_key(|e| e.ts_ns);
        let later = events.split_off(events.partition_point(|e| e.ts_ns < split_at));
        (events, later)
    }

    /// A streaming request still open: its head and six tokens 100 ms apart from 1.1 s,
    /// then six more from 2.1 s (no end, no close); split at 2 s.
    fn in_flight() -> (Vec<Event>, Vec<Event>) {
        let at: Vec<u64> = (0..12)
            .map(|i| T0 + (100 + 100 * i) * MS + if i >= 6 { 400 * MS } else { 0 })
            .collect();
        streamed(&at, None, 2_000 * MS)
    }

    /// Requests in flight as each mode builds them: only at ticks (not at the advances
    /// pushes make), or never.
    #[test]
    fn requests_in_flight_are_built_when_the_mode_says() {
        let (first, later) = in_flight();
        let tick_at = 1_900 * MS;
        let open_counts = |open: Open| {
            // Advances between ticks: more often than the later pushes span.
            let mut p = Pipeline::new(
                Config {
                    open,
                    advance_every_ns: 250 * MS,
                    ..Config::live()
                },
                false,
            );
            first.iter().cloned().for_each(|e| p.push(e));
            p.tick(tick_at);
            let after_tick = p.open().len();
            later.iter().cloned().for_each(|e| p.push(e));
            // Pushes moved the clock past an advance, not a tick.
            assert!(p.released_ns() > tick_at + p.cfg.advance_every_ns);
            (after_tick, p.open().len())
        };
        assert_eq!(open_counts(Open::AtTick), (1, 0));
        assert_eq!(open_counts(Open::Never), (0, 0));
    }

    /// Batches pushed whole give what their events pushed one by one give, late events
    /// included, and every batch is let go once its events went through.
    #[test]
    fn a_batch_pushed_whole_is_its_events_pushed_in_turn() {
        let mut net = Net::default();
        for i in 0..12u16 {
            let t0 = T0 + u64::from(i) * 70 * MS;
            proxied(&mut net, t0, 40_000 + i, 50_000 + i, &format!("r{i}"));
        }
        let mut events = net.events;
        events.sort_by_key(|e| e.ts_ns);
        // Out of order as per-CPU buffers drain: some a little late (within the
        // reorder window), every 97th far later than it allows.
        for i in (0..events.len() - 5).step_by(11) {
            events.swap(i, i + 5);
        }
        for i in (200..events.len()).step_by(97) {
            events[i].ts_ns -= 900 * MS;
        }
        let cfg = Config {
            reorder_ns: 50 * MS,
            ..Config::live()
        };
        let outcome = |p: Pipeline| {
            let out = p.finish();
            let requests = serde_json::to_string(&out.requests).expect("serialize");
            (requests, out.events, out.late_events)
        };
        let mut one_by_one = Pipeline::new(cfg, false);
        events.iter().cloned().for_each(|e| one_by_one.push(e));
        let mut batched = Pipeline::new(cfg, false);
        let mut rest = events.as_slice();
        for size in [1, 7, 300, 2, 64].into_iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (batch, after) = rest.split_at(size.min(rest.len()));
            batched.push_batch(batch.to_vec());
            rest = after;
        }
        batched.push_batch(Vec::new());
        let (requests, pushed, late) = outcome(one_by_one);
        assert_eq!(pushed, events.len() as u64);
        assert!(late > 0, "some events came later than the reorder window");
        assert!(requests.len() > 1_000, "requests were stitched: {requests}");
        assert_eq!(outcome(batched), (requests, pushed, late));
        // Once flushed, nothing is held: neither a batch nor the singles' open batch.
        let mut whole = Pipeline::new(cfg, false);
        whole.push_batch(events.clone());
        let mut singles = Pipeline::new(cfg, false);
        events.iter().cloned().for_each(|e| singles.push(e));
        for mut p in [whole, singles] {
            assert!(p.held.events() > 0, "events wait in the reorder window");
            p.flush();
            assert_eq!(p.held.events(), 0, "flushed: nothing held");
        }
    }

    /// A request is served (in flight, at the engine that accepted it) from its arrival
    /// until its response ends, not for the settle it is held after that, and whether or
    /// not the pipeline builds the requests it holds.
    #[test]
    fn a_request_is_served_until_its_response_ends() {
        // Six tokens 100 ms apart from 1.1 s, the end at 1.8 s; split at 1.7 s.
        let at: Vec<u64> = (0..6).map(|i| T0 + (100 + 100 * i) * MS).collect();
        let end = T0 + 800 * MS;
        let (events, later) = streamed(&at, Some(end), T0 + 700 * MS);

        let mut p = Pipeline::new(
            Config {
                open: Open::Never,
                ..Config::live()
            },
            false,
        );
        let serving = |p: &Pipeline| {
            p.serving()
                .map(|(pid, comm)| (pid, comm.to_string()))
                .collect::<Vec<_>>()
        };
        events.into_iter().for_each(|e| p.push(e));
        p.tick(T0 + 750 * MS);
        assert_eq!(
            serving(&p),
            [(ENGINE, "engine".to_string())],
            "streaming, before its end"
        );
        later.into_iter().for_each(|e| p.push(e));
        p.tick(end + 500 * MS);
        assert_eq!(p.take().requests.len(), 0, "held for the settle");
        assert_eq!(serving(&p), [], "ended: no longer served");
    }
}
