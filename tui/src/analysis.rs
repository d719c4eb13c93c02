//! The pipeline side of top: events in, at most once a second a snapshot of the
//! window out. It runs on its own thread (see `worker`); the screen only draws
//! snapshots and answers keys, so a slow pass never holds a key back. Pure like
//! `update`: time arrives as arguments, so tests drive it directly.

use std::collections::VecDeque;
use std::sync::Arc;

use collector::diagnose::Diagnosis;
use collector::gpu::GpuStep;
use collector::ingest::fast_hash::{FastMap, FastSet};
use collector::ingest::model::NvmlSample;
use collector::ingest::Event;
use collector::pipeline::{Config, Open, Pipeline};
use collector::stitch::Request;

use crate::findings::{Findings, Shown};
use crate::routes::{RouteGaps, RouteItl};
use crate::rows::{self, GpuReading, Row, RowKey, TtftWindow};

const SECOND_NS: u64 = 1_000_000_000;
/// Width of the TTFT-over-time windows.
pub const TTFT_WINDOW_NS: u64 = SECOND_NS;

/// Everything the screen shows of the window, as of one pass.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Event time the pass was made at.
    pub clock_ns: u64,
    /// Finished requests in the window and those still in flight, in the order they
    /// started; `rows[i].index` points here. Shared with the window: a finished
    /// request is not copied per pass.
    pub requests: Vec<Arc<Request>>,
    /// The requests' GPU shares as of the last making of the findings (see
    /// `findings`); `diagnoses` are that making's, numbered as `rows` are.
    pub findings: Shown,
    /// The recording lost events: any request may miss some.
    pub events_dropped: bool,
    pub rows: Vec<Row>,
    pub routes: Vec<RouteItl>,
    pub ttft_windows: Vec<TtftWindow>,
    pub gpu: Vec<GpuReading>,
    pub gpu_steps: usize,
    pub unparsed_ios: u64,
    /// The window's diagnoses, the largest saving first.
    pub diagnoses: Vec<Diagnosis>,
    pub events_total: u64,
    /// Events in the last second of event time.
    pub events_per_s: u64,
    /// Events whose time falls in the window.
    pub events_in_window: u64,
    /// Older finished requests were let go before the window's start (`max_requests`).
    pub window_capped: bool,
    /// Events later than the reorder window (used, out of order).
    pub late_events: u64,
    /// Wall time the pass took (set by the thread that made it; 0: not measured).
    pub pass_ns: u64,
}

pub struct Analysis {
    pipeline: Pipeline,
    /// How far back finished requests, steps and samples are kept (event time).
    pub window_ns: u64,
    /// Past this many finished requests the oldest go, whatever the window.
    pub max_requests: usize,
    done: VecDeque<Done>,
    findings: Findings,
    /// The finished requests' token gaps per route, kept as they come and go.
    routes: RouteGaps,
    /// One string per route, client and client address for the finished requests'
    /// rows (and their route's pool); one nothing holds any more is let go at
    /// eviction. Shared, a row's text is the same few cache lines for every row: a
    /// pass copies every row, and the screen drops the last pass's copies.
    names: FastSet<Arc<str>>,
    steps: VecDeque<GpuStep>,
    nvml: VecDeque<(u64, NvmlSample)>,
    /// Event counts per second of event time (the window's count).
    per_second: VecDeque<(u64, u64)>,
    /// Times of the events in the newest second seen (the ev/s figure).
    recent: VecDeque<u64>,
    /// Requests the last pass showed: an empty table fills without waiting a second.
    shown: usize,
    events_total: u64,
    late_events: u64,
    unparsed_ios: u64,
    clock_ns: u64,
    last_pass_wall_ns: Option<u64>,
    dirty: bool,
    capped: bool,
    /// The recording lost events: every request is marked.
    dropped: bool,
}

impl Analysis {
    /// `cfg`: `Config::sorted()` for a recording, `Config::live()` for live events.
    pub fn new(window_ns: u64, cfg: Config) -> Analysis {
        Analysis {
            // Drops are known as they happen (`set_dropped`), not up front. Requests in
            // flight are read only by a pass, right after its tick.
            pipeline: Pipeline::new(
                Config {
                    open: Open::AtTick,
                    ..cfg
                },
                false,
            ),
            window_ns,
            max_requests: 100_000,
            done: VecDeque::new(),
            findings: Findings::default(),
            routes: RouteGaps::default(),
            names: FastSet::default(),
            steps: VecDeque::new(),
            nvml: VecDeque::new(),
            per_second: VecDeque::new(),
            recent: VecDeque::new(),
            shown: 0,
            events_total: 0,
            late_events: 0,
            unparsed_ios: 0,
            clock_ns: 0,
            last_pass_wall_ns: None,
            dirty: false,
            capped: false,
            dropped: false,
        }
    }

    pub fn push(&mut self, batch: Vec<Event>) {
        self.dirty |= !batch.is_empty();
        for e in &batch {
            self.events_total += 1;
            let second = e.ts_ns / SECOND_NS;
            match self.per_second.iter_mut().rev().find(|(s, _)| *s == second) {
                Some((_, n)) => *n += 1,
                None => {
                    let at = self.per_second.partition_point(|(s, _)| *s < second);
                    self.per_second.insert(at, (second, 1));
                }
            }
            let newest = self.recent.back().copied().unwrap_or(0).max(e.ts_ns);
            self.recent.push_back(e.ts_ns);
            while self
                .recent
                .front()
                .is_some_and(|&t| t + SECOND_NS <= newest)
            {
                self.recent.pop_front();
            }
        }
        self.pipeline.push_batch(batch);
        self.collect();
    }

    /// Batches done with are kept, emptied, for `take_spare` (a live source refills
    /// them; see `Pipeline::keep_spare_batches`).
    pub fn keep_spare_batches(&mut self) {
        self.pipeline.keep_spare_batches();
    }

    /// An emptied batch to hand back to the source, once asked for.
    pub fn take_spare(&mut self) -> Option<Vec<Event>> {
        self.pipeline.take_spare()
    }

    /// The least time between two makings of the findings (default a second).
    pub fn findings_every(&mut self, ns: u64) {
        self.findings.every_ns = ns;
    }

    pub fn events_total(&self) -> u64 {
        self.events_total
    }

    /// The recording lost events (read live every 200 ms).
    pub fn set_dropped(&mut self, dropped: bool) {
        self.dirty |= dropped != self.dropped;
        self.dropped = dropped;
    }

    /// The source has no more events: everything held is finished now, and the next
    /// tick makes a pass whatever the time since the last.
    pub fn end(&mut self) {
        self.pipeline.flush();
        self.collect();
        self.dirty = true;
        self.last_pass_wall_ns = None;
        self.findings.expire();
    }

    /// `clock_ns`: now on the events' clock (CLOCK_MONOTONIC, or the replay's
    /// position); `wall_ns`: now on any steady clock. A pass at most once a second
    /// and only when something changed, except that an empty table is filled as soon
    /// as a request shows up.
    pub fn tick(&mut self, clock_ns: u64, wall_ns: u64) -> Option<Snapshot> {
        self.clock_ns = self.clock_ns.max(clock_ns);
        let due = self
            .last_pass_wall_ns
            .is_none_or(|last| wall_ns.saturating_sub(last) >= SECOND_NS);
        if !due && self.shown > 0 {
            return None;
        }
        self.pipeline.tick(self.clock_ns);
        self.collect();
        self.evict();
        let first = self.shown == 0 && !(self.done.is_empty() && self.pipeline.open().is_empty());
        if !self.dirty || !(due || first) {
            return None;
        }
        self.last_pass_wall_ns = Some(wall_ns);
        self.dirty = false;
        let snapshot = self.snapshot(wall_ns);
        self.shown = snapshot.requests.len();
        Some(snapshot)
    }

    /// Takes what the pipeline finished since the last call.
    fn collect(&mut self) {
        let out = self.pipeline.take();
        self.dirty |= !out.requests.is_empty() || !out.steps.is_empty() || !out.nvml.is_empty();
        for r in out.requests {
            let done = Done::of(r, &mut self.names);
            self.routes.add(&done.row.route, &done.request);
            self.done.push_back(done);
        }
        self.steps.extend(out.steps);
        self.nvml.extend(out.nvml);
        self.unparsed_ios = out.unparsed_ios;
        self.late_events = out.late_events;
        while self.done.len() > self.max_requests {
            if let Some(d) = self.done.pop_front() {
                self.routes.remove(&d.row.route, &d.request);
            }
            self.capped = true;
        }
    }

    fn evict(&mut self) {
        let cutoff = self.clock_ns.saturating_sub(self.window_ns);
        let before = (self.done.len(), self.steps.len(), self.nvml.len());
        let routes = &mut self.routes;
        self.done.retain(|d| {
            let keep = d.last_ns >= cutoff;
            if !keep {
                routes.remove(&d.row.route, &d.request);
            }
            keep
        });
        self.names.retain(|name| Arc::strong_count(name) > 1);
        self.steps.retain(|s| s.end_ns >= cutoff);
        self.nvml.retain(|(t, _)| *t >= cutoff);
        let first_second = cutoff / SECOND_NS;
        while self
            .per_second
            .front()
            .is_some_and(|(s, _)| *s < first_second)
        {
            self.per_second.pop_front();
        }
        self.dirty |= before != (self.done.len(), self.steps.len(), self.nvml.len());
    }

    fn snapshot(&mut self, wall_ns: u64) -> Snapshot {
        let since = self.clock_ns.saturating_sub(SECOND_NS);
        // Finished requests as kept (with their rows), then those in flight; in start
        // order as `pipeline::renumber` puts them (a stable sort, the same ties).
        // Those in flight were built for this pass (`Open::AtTick`): taken, not copied.
        let open = self.pipeline.take_open();
        let routes = self.routes.itl(open.iter().map(|r| (r.route(), r)));
        let mut held: Vec<(Arc<Request>, Option<&Row>)> = self
            .done
            .iter()
            .map(|d| (Arc::clone(&d.request), Some(&d.row)))
            .chain(open.into_iter().map(|r| (Arc::new(r), None)))
            .collect();
        held.sort_by_key(|(r, _)| r.order);
        let mut rows: Vec<Row> = held
            .iter()
            .enumerate()
            .map(|(i, (r, row))| {
                let mut row = row.cloned().unwrap_or_else(|| Row::from_request(i, r));
                row.index = i;
                row
            })
            .collect();
        let requests: Vec<Arc<Request>> = held.into_iter().map(|(r, _)| r).collect();
        if self.findings.due(wall_ns) {
            let mut steps: Vec<GpuStep> = self.steps.iter().cloned().collect();
            steps.sort_by_key(|s| s.start_ns);
            let nvml: Vec<(u64, NvmlSample)> = self.nvml.iter().cloned().collect();
            let keys = rows.iter().map(|r| r.key.clone());
            self.findings
                .make(&requests, keys, &mut steps, &nvml, wall_ns);
        }
        let position: FastMap<&RowKey, usize> =
            rows.iter().enumerate().map(|(i, r)| (&r.key, i)).collect();
        let findings = self.findings.shown(&position, wall_ns);
        drop(position);
        for row in &mut rows {
            row.stalled = false;
        }
        for i in findings.stalled_rows() {
            rows[i].stalled = true;
        }
        Snapshot {
            clock_ns: self.clock_ns,
            routes,
            ttft_windows: rows::ttft_over_time(&rows, TTFT_WINDOW_NS),
            gpu: rows::latest_gpu(&self.nvml),
            gpu_steps: self.steps.len(),
            unparsed_ios: self.unparsed_ios,
            diagnoses: findings.diagnoses(),
            events_total: self.events_total,
            events_per_s: self
                .recent
                .iter()
                .filter(|&&t| t > since && t <= self.clock_ns)
                .count() as u64,
            events_in_window: self.per_second.iter().map(|(_, n)| n).sum(),
            window_capped: self.capped,
            late_events: self.late_events,
            pass_ns: 0,
            rows,
            requests,
            findings,
            events_dropped: self.dropped,
        }
    }
}

/// A finished request as the window keeps it: shared with the snapshots, its row made
/// once (a finished request no longer changes; its position and stall flag are set
/// per pass).
struct Done {
    request: Arc<Request>,
    row: Row,
    /// `last_moment`: when it leaves the window.
    last_ns: u64,
}

impl Done {
    /// Its row's texts are the strings of `names` that spell them.
    fn of(r: Request, names: &mut FastSet<Arc<str>>) -> Done {
        let mut row = Row::from_request(0, &r);
        for text in [&mut row.route, &mut row.client, &mut row.key.client_addr] {
            match names.get(&**text) {
                Some(known) => *text = Arc::clone(known),
                None => {
                    names.insert(Arc::clone(text));
                }
            }
        }
        Done {
            row,
            last_ns: last_moment(&r),
            request: Arc::new(r),
        }
    }
}

/// The last time anything of the request was seen.
fn last_moment(r: &Request) -> u64 {
    let tokens = r.points.iter().filter_map(|p| p.token_ns.last().copied());
    tokens
        .chain([r.start_ns, r.first_byte_ns])
        .chain(r.end_ns)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::tests::bare_request;

    #[test]
    fn finished_rows_share_their_texts_until_none_holds_them() {
        let mut names = FastSet::default();
        let (mut a, mut b) = (bare_request(), bare_request());
        (a.first_byte_ns, b.first_byte_ns) = (10, 20);
        let (a, b) = (Done::of(a, &mut names), Done::of(b, &mut names));
        for (x, y) in [
            (&a.row.route, &b.row.route),
            (&a.row.client, &b.row.client),
            (&a.row.key.client_addr, &b.row.key.client_addr),
        ] {
            assert_eq!(x, y);
            assert!(Arc::ptr_eq(x, y), "{x:?}: one string for both rows");
        }
        assert_ne!(a.row.key, b.row.key, "their times tell them apart");
        drop((a, b));
        names.retain(|name| Arc::strong_count(name) > 1);
        assert!(names.is_empty(), "let go with the last row: {names:?}");
    }
}
