//! The exporter's own thread and the bounded queue it drains. The agent's side only
//! ever takes the queue's lock for a push (never held across I/O), so a collector that
//! is slow, down, or a black hole costs it nothing; past `queue_spans` waiting spans a
//! request's spans are dropped whole and counted. The thread keeps one batch outside
//! the queue and sends it again, with back-off, until it is taken: memory is bounded by
//! the queue plus that batch however long the collector stays away.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prost::Message;

use super::http::{post, Endpoint, Outcome};
use super::proto::{
    ExportTraceServiceRequest, InstrumentationScope, KeyValue, Resource, ResourceSpans, ScopeSpans,
    Span,
};
use super::OtlpStats;

/// Back-off after a failed export: doubles from the first to the last, with jitter.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

pub(crate) struct Settings {
    pub(crate) endpoint: Endpoint,
    pub(crate) queue_spans: usize,
    pub(crate) batch_spans: usize,
    pub(crate) batch_delay: Duration,
    pub(crate) timeout: Duration,
    pub(crate) resource: Vec<KeyValue>,
}

/// A span waiting, and whether it is its request's root (requests are counted by them).
struct Queued {
    span: Span,
    root: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// Spans the thread holds in the batch it is sending.
    in_flight: usize,
    /// Shutdown began: send what is queued until then.
    closing: Option<Instant>,
    /// The thread is done.
    finished: bool,
    /// Shutdown stopped waiting for the thread and counted what it held as dropped.
    abandoned: bool,
}

#[derive(Default)]
struct Counters {
    requests_exported: AtomicU64,
    spans_exported: AtomicU64,
    spans_dropped: AtomicU64,
    export_failures: AtomicU64,
}

pub(crate) struct Shared {
    settings: Settings,
    state: Mutex<State>,
    /// The thread waits on it: spans arrived, or shutdown began.
    wake: Condvar,
    /// Shutdown waits on it: the thread finished.
    finished: Condvar,
    counters: Counters,
    last_error: Mutex<Option<String>>,
}

impl Shared {
    pub(crate) fn new(settings: Settings) -> Shared {
        Shared {
            settings,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            finished: Condvar::new(),
            counters: Counters::default(),
            last_error: Mutex::new(None),
        }
    }

    /// A poisoned lock only means a panic elsewhere; the queue itself stays consistent.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn count(&self, c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Queues one request's spans (root first), or drops them all when they do not fit.
    pub(crate) fn push(&self, spans: Vec<Span>) {
        let n = spans.len();
        let mut st = self.lock();
        if st.closing.is_some() || st.queue.len() + n > self.settings.queue_spans {
            drop(st);
            self.count(&self.counters.spans_dropped, n);
            return;
        }
        let was_empty = st.queue.is_empty();
        st.queue.extend(
            spans
                .into_iter()
                .enumerate()
                .map(|(i, span)| Queued { span, root: i == 0 }),
        );
        let full = st.queue.len() >= self.settings.batch_spans;
        drop(st);
        // The thread waits for a first span (then for its batch delay), or for a full batch.
        if was_empty || full {
            self.wake.notify_one();
        }
    }

    pub(crate) fn stats(&self) -> OtlpStats {
        let c = &self.counters;
        OtlpStats {
            requests_exported: c.requests_exported.load(Ordering::Relaxed),
            spans_exported: c.spans_exported.load(Ordering::Relaxed),
            spans_dropped: c.spans_dropped.load(Ordering::Relaxed),
            export_failures: c.export_failures.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Begins shutdown (sending what is queued until `until`); true once the thread has
    /// finished within `grace` after `until`, else what it still holds is counted as
    /// dropped and it is left to exit on its own.
    pub(crate) fn close(&self, until: Instant, grace: Duration) -> bool {
        let mut st = self.lock();
        if st.closing.is_none() {
            st.closing = Some(until);
        }
        self.wake.notify_all();
        let give_up = until + grace;
        while !st.finished {
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .finished
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        if st.finished {
            return true;
        }
        st.abandoned = true;
        let held = st.queue.len() + st.in_flight;
        st.queue.clear();
        st.in_flight = 0;
        drop(st);
        self.count(&self.counters.spans_dropped, held);
        false
    }

    /// Asks the thread to stop now (the exporter was dropped without a shutdown).
    pub(crate) fn stop_soon(&self) {
        let mut st = self.lock();
        if st.closing.is_none() {
            st.closing = Some(Instant::now());
        }
        self.wake.notify_all();
    }
}

/// The thread: batches of at most `batch_spans`, each sent until taken or refused.
pub(crate) fn run(shared: &Shared) {
    while let Some(batch) = next_batch(shared) {
        send(shared, batch);
    }
    let mut st = shared.lock();
    if !st.abandoned {
        let left = st.queue.len();
        st.queue.clear();
        shared.count(&shared.counters.spans_dropped, left);
    }
    st.finished = true;
    shared.finished.notify_all();
}

/// Waits until a batch is due (full, `batch_delay` after its first span, or shutdown),
/// and takes it; None once shut down and empty (or past the shutdown deadline).
fn next_batch(shared: &Shared) -> Option<Vec<Queued>> {
    let s = &shared.settings;
    let mut st = shared.lock();
    let mut first_seen: Option<Instant> = None;
    loop {
        if st.abandoned {
            return None;
        }
        if let Some(until) = st.closing {
            if st.queue.is_empty() || Instant::now() >= until {
                return None;
            }
        }
        if st.queue.is_empty() {
            first_seen = None;
            st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            continue;
        }
        let since = *first_seen.get_or_insert_with(Instant::now);
        let due = since + s.batch_delay;
        let now = Instant::now();
        if st.queue.len() >= s.batch_spans || now >= due || st.closing.is_some() {
            let n = st.queue.len().min(s.batch_spans);
            let batch: Vec<Queued> = st.queue.drain(..n).collect();
            st.in_flight = batch.len();
            return Some(batch);
        }
        st = shared
            .wake
            .wait_timeout(st, due - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

fn encode(s: &Settings, batch: Vec<Queued>) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: s.resource.clone(),
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "tokenscope".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                spans: batch.into_iter().map(|q| q.span).collect(),
            }],
            schema_url: String::new(),
        }],
    }
    .encode_to_vec()
}

/// Sends one batch until it is taken, refused, or shutdown's deadline passes.
fn send(shared: &Shared, batch: Vec<Queued>) {
    let s = &shared.settings;
    let (spans, roots) = (batch.len(), batch.iter().filter(|q| q.root).count());
    let body = encode(s, batch);
    let mut backoff = BACKOFF_FIRST;
    loop {
        let closing = shared.lock().closing;
        let mut timeout = s.timeout;
        if let Some(until) = closing {
            timeout = timeout.min(until.saturating_duration_since(Instant::now()));
            if timeout.is_zero() {
                settle(shared, |c| shared.count(&c.spans_dropped, spans));
                return;
            }
        }
        let outcome = post(&s.endpoint, &body, timeout);
        let (after, why) = match outcome {
            Outcome::Accepted { rejected } => {
                let rejected = usize::try_from(rejected).unwrap_or(spans).min(spans);
                settle(shared, |c| {
                    shared.count(&c.spans_exported, spans - rejected);
                    shared.count(&c.spans_dropped, rejected);
                    shared.count(&c.requests_exported, roots);
                });
                return;
            }
            Outcome::Refused { why } => {
                remember(shared, why);
                settle(shared, |c| {
                    shared.count(&c.export_failures, 1);
                    shared.count(&c.spans_dropped, spans);
                });
                return;
            }
            Outcome::Retry { after, why } => (after, why),
        };
        remember(shared, why);
        shared.count(&shared.counters.export_failures, 1);
        let wait = jitter(backoff).max(after.unwrap_or_default());
        backoff = (backoff * 2).min(BACKOFF_MAX);
        if !pause(shared, wait) {
            return;
        }
    }
}

/// Counts a batch's outcome and frees its slot, unless shutdown already counted it.
fn settle(shared: &Shared, count: impl FnOnce(&Counters)) {
    let mut st = shared.lock();
    if st.abandoned {
        return;
    }
    count(&shared.counters);
    st.in_flight = 0;
}

fn remember(shared: &Shared, why: String) {
    *shared.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
}

/// Sleeps `wait` before a retry, cut short by shutdown (whose deadline also caps it);
/// false when shutdown gave up on this thread.
fn pause(shared: &Shared, wait: Duration) -> bool {
    let start = Instant::now();
    let mut st = shared.lock();
    let was_closing = st.closing.is_some();
    loop {
        if st.abandoned {
            return false;
        }
        // Shutdown began during the pause: try again at once, within its deadline.
        if st.closing.is_some() && !was_closing {
            return true;
        }
        let mut end = start + wait;
        if let Some(until) = st.closing {
            end = end.min(until);
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        st = shared
            .wake
            .wait_timeout(st, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Somewhere in [d/2, d]: exporters that failed together do not retry together.
fn jitter(d: Duration) -> Duration {
    let r: [u8; 4] = super::ids::random();
    let frac = f64::from(u32::from_le_bytes(r)) / f64::from(u32::MAX);
    d.mul_f64(0.5 + 0.5 * frac)
}
