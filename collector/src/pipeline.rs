//! One pipeline for every view: events in (live or replayed, put in time order
//! within a bounded reorder window), finished requests with their GPU share, GPU
//! steps, the NVML and CUPTI series and the protocol tally out. Incremental: a
//! request leaves the stitcher once it settled (see `stitch::stitcher`), and what
//! the stitcher let go is never read again. `report`, `top` and the agent read
//! what it produces; none of them rebuilds a chain.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::analyze::protocols::{ProtocolTally, Protocols};
use crate::gpu::GpuStep;
use crate::ingest::model::{event::Body, GpuActivityKind, NvmlSample};
use crate::ingest::Event;
use crate::stitch::{attribution, Request, Settle, Settled, Stitcher};

/// How the pipeline holds and lets go (event time throughout).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Events may arrive this much out of time order (per-CPU ring buffers, batches);
    /// later ones are still used, and counted in `Output::late_events`.
    pub reorder_ns: u64,
    /// How often (in event time) settled requests are let go.
    pub advance_every_ns: u64,
    pub settle: Settle,
    /// What the output keeps of finished requests and steps.
    pub keep: Keep,
    /// Join GPU steps to requests once, over everything, at the end (a replay that
    /// keeps everything anyway): the attribution then knows each engine's habits
    /// (chunked prefill, rows copied per request) from the whole recording, as the
    /// requests of its first seconds need. Otherwise each request is attributed when
    /// finalised, with recent neighbours.
    pub gpu_at_end: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Everything (a report lists every request).
    All,
    /// Those that ended within this long of the newest event (a live view's window).
    Recent(u64),
}

impl Config {
    /// Replaying a recording for a report: everything kept, numbered as one batch.
    pub fn replay() -> Config {
        Config {
            reorder_ns: 1_000_000_000,
            advance_every_ns: 1_000_000_000,
            settle: Settle::default(),
            keep: Keep::All,
            gpu_at_end: true,
        }
    }

    /// A live view that shows the last `window_ns`.
    pub fn live(window_ns: u64) -> Config {
        Config {
            reorder_ns: 100_000_000,
            advance_every_ns: 250_000_000,
            settle: Settle::default(),
            keep: Keep::Recent(window_ns),
            gpu_at_end: false,
        }
    }
}

/// A CUPTI activity record: device time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuptiSpan {
    pub kind: GpuActivityKind,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// What the pipeline produced so far.
#[derive(Debug, Default)]
pub struct Output {
    /// Finished requests, in the order they finished (`Pipeline::finish` numbers and
    /// orders them by where their chains start, as one batch would).
    pub requests: Vec<Request>,
    pub steps: Vec<GpuStep>,
    /// NVML samples with their time, in time order.
    pub nvml: Vec<(u64, NvmlSample)>,
    pub cupti: Vec<CuptiSpan>,
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

struct Pending {
    ts_ns: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Pending {
    fn eq(&self, o: &Self) -> bool {
        (self.ts_ns, self.seq) == (o.ts_ns, o.seq)
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pending {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.ts_ns, self.seq).cmp(&(o.ts_ns, o.seq))
    }
}

pub struct Pipeline {
    cfg: Config,
    pending: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    /// The newest event time pushed, and the time of the last event let through.
    newest_ns: u64,
    released_ns: u64,
    next_advance_ns: Option<u64>,
    stitcher: Stitcher,
    out: Output,
}

impl Pipeline {
    /// `dropped`: the recording already lost events (every request is marked).
    pub fn new(cfg: Config, dropped: bool) -> Pipeline {
        Pipeline {
            cfg,
            pending: BinaryHeap::new(),
            seq: 0,
            newest_ns: 0,
            released_ns: 0,
            next_advance_ns: None,
            stitcher: Stitcher::new(cfg.settle, dropped, !cfg.gpu_at_end),
            out: Output::default(),
        }
    }

    /// The probes lost events: requests finalised from now on are marked.
    pub fn note_dropped(&mut self) {
        self.stitcher.set_dropped();
    }

    pub fn push(&mut self, event: Event) {
        self.out.events += 1;
        if event.ts_ns < self.released_ns {
            self.out.late_events += 1;
            self.feed(event);
            return;
        }
        self.newest_ns = self.newest_ns.max(event.ts_ns);
        self.seq += 1;
        self.pending.push(Reverse(Pending {
            ts_ns: event.ts_ns,
            seq: self.seq,
            event,
        }));
        let through = self.newest_ns.saturating_sub(self.cfg.reorder_ns);
        while self.pending.peek().is_some_and(|p| p.0.ts_ns <= through) {
            let Reverse(p) = self.pending.pop().expect("peeked");
            self.released_ns = p.ts_ns;
            self.feed(p.event);
            let due = *self
                .next_advance_ns
                .get_or_insert(p.ts_ns + self.cfg.advance_every_ns);
            if p.ts_ns >= due {
                self.advance();
            }
        }
    }

    /// Lets go what settled (also called on its own as event time passes).
    pub fn advance(&mut self) {
        self.next_advance_ns = Some(self.released_ns + self.cfg.advance_every_ns);
        let settled = self.stitcher.advance();
        self.absorb(settled);
    }

    /// What was produced so far (live views read it between pushes).
    pub fn output(&self) -> &Output {
        &self.out
    }

    /// Connections the stitcher holds now (open, or with requests in flight).
    pub fn held_connections(&self) -> usize {
        self.stitcher.held_connections()
    }

    /// The input ended: everything held is let go, and requests are numbered in the
    /// order their chains start.
    pub fn finish(mut self) -> Output {
        while let Some(Reverse(p)) = self.pending.pop() {
            self.feed(p.event);
        }
        self.advance();
        let last = self.stitcher.finish();
        self.absorb(last);
        renumber(&mut self.out.requests);
        self.out.steps.sort_by_key(|s| s.start_ns);
        if self.cfg.gpu_at_end {
            attribution::attribute(&mut self.out.requests, &[], &mut self.out.steps);
        }
        self.out
    }

    fn feed(&mut self, event: Event) {
        match &event.body {
            Some(Body::Nvml(s)) => self.out.nvml.push((event.ts_ns, s.clone())),
            Some(Body::Gpu(g)) => self.out.cupti.push(CuptiSpan {
                kind: g.kind(),
                start_ns: g.start_ns,
                end_ns: g.end_ns,
            }),
            _ => self.stitcher.push(&event),
        }
    }

    fn absorb(&mut self, s: Settled) {
        for c in &s.connections {
            self.out.unparsed_ios += c.unparsed_ios;
            self.out.tally.add(c);
        }
        self.out.requests.extend(s.requests);
        self.out.steps.extend(s.steps);
        if let Keep::Recent(window) = self.cfg.keep {
            let from = self.newest_ns.saturating_sub(window);
            self.out
                .requests
                .retain(|r| r.end_ns.unwrap_or(r.start_ns) >= from);
            self.out.steps.retain(|s| s.end_ns >= from);
            self.out.nvml.retain(|(t, _)| *t >= from);
            self.out.cupti.retain(|c| c.end_ns >= from);
        }
    }
}

/// Numbers requests from 0 in the order their chains start (a stitch of the whole
/// recording at once numbers them so), and the requests their stalls name with them.
fn renumber(requests: &mut [Request]) {
    requests.sort_by_key(|r| r.order);
    let new_id: std::collections::HashMap<usize, usize> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    for (i, r) in requests.iter_mut().enumerate() {
        r.id = i;
        for s in r.gpu.iter_mut().flat_map(|g| &mut g.stalled_by) {
            s.requests = s
                .requests
                .iter()
                .filter_map(|j| new_id.get(j).copied())
                .collect();
            s.requests.sort_unstable();
        }
    }
}
