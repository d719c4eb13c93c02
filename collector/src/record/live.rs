//! A live recording on its own thread, for the views that watch as it happens (`top`,
//! `agent`): events are taken in batches, the recording is always stopped (probes
//! detached) when the handle goes, panics included.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{RecordObserver, RecordOptions, RecordSessionError};
use crate::ingest::record::FileHeader;
use crate::ingest::spares::SpareBatches;
use crate::ingest::Event;
use crate::probes::Probes;

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("starting the recording thread: {0}")]
    Spawn(std::io::Error),
    #[error(transparent)]
    Session(#[from] RecordSessionError),
    #[error("the recording ended before it started")]
    EndedEarly,
    #[error("probes not attached after {0:?}")]
    NotAttached(Duration),
    #[error("the recording did not stop within 30 s; its probes go when this process exits")]
    NoStop,
    #[error("the recording thread panicked")]
    Panicked,
}

impl LiveError {
    /// The kernel (or this process) cannot run the probes.
    pub fn is_unsupported_kernel(&self) -> bool {
        matches!(self, LiveError::Session(s) if s.is_unsupported_kernel())
    }
}

/// Room of a batch for events handed over one at a time (`RecordObserver::event`).
const SINGLE_BATCH: usize = 1024;

/// What the recording thread shares with its watcher.
#[derive(Default)]
struct Shared {
    /// Events not yet taken, a batch per drain: a watcher that takes them less often
    /// than drains come gets them as they were decoded, not appended into one vector
    /// that grows by doubling (each step a copy of every event, and the old room
    /// freed into the allocator's arena).
    events: Mutex<Vec<Vec<Event>>>,
    notes: Mutex<Vec<String>>,
    /// Probes attached (and the signal handlers that stop the recording installed).
    started: Mutex<Option<(usize, usize)>>,
    /// What the probes said once attached: the I/O source, then each probe skipped and why.
    lines: Mutex<Vec<String>>,
    /// Ring-buffer drops so far, as the recorder last read them.
    dropped: Mutex<Option<u64>>,
    /// Batches handed back by the watcher (`Live::give_back`), refilled at the next
    /// drains instead of new ones.
    spares: Mutex<SpareBatches>,
}

struct Observer {
    shared: Arc<Shared>,
    /// Events decoded since the last hand-over (`RecordObserver::batch`).
    batch: Vec<Event>,
}

impl RecordObserver for Observer {
    fn started(&mut self, probes: &Probes) {
        let mut lines = vec![probes.io_source_line()];
        lines.extend(probes.skipped.iter().map(|s| format!("probe skipped: {s}")));
        *lock(&self.shared.lines) = lines;
        *lock(&self.shared.started) = Some((probes.attached.len(), probes.skipped.len()));
    }

    fn event(&mut self, event: &Event) {
        // Into the last batch while it has room (never grown), else a new one.
        let mut batches = lock(&self.shared.events);
        match batches.last_mut().filter(|b| b.len() < b.capacity()) {
            Some(b) => b.push(event.clone()),
            None => {
                let mut b = Vec::with_capacity(SINGLE_BATCH);
                b.push(event.clone());
                batches.push(b);
            }
        }
    }

    fn batch(&mut self) -> Option<&mut Vec<Event>> {
        Some(&mut self.batch)
    }

    /// One lock per drain: the batch is moved over whole. The next batch starts with
    /// this one's room, not grown from nothing (each doubling copies every event).
    fn took(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let room = self.batch.len();
        let next = lock(&self.shared.spares)
            .take(room)
            .unwrap_or_else(|| Vec::with_capacity(room));
        let batch = std::mem::replace(&mut self.batch, next);
        lock(&self.shared.events).push(batch);
    }

    fn note(&mut self, line: &str) {
        lock(&self.shared.notes).push(line.to_string());
    }

    fn drain_every(&self) -> Duration {
        super::DRAIN_LIVE
    }

    fn counters(&mut self, _submitted: u64, dropped: u64) {
        *lock(&self.shared.dropped) = Some(dropped);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `record::run` on a thread. Dropping it stops the recording (SIGINT, which
/// `record::run` handles by detaching its probes) and waits.
pub struct Live {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Result<FileHeader, RecordSessionError>>>,
}

impl Live {
    pub fn start(opts: RecordOptions) -> Result<Live, LiveError> {
        let shared = Arc::new(Shared::default());
        let mut observer = Observer {
            shared: Arc::clone(&shared),
            batch: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name("tokenscope-record".into())
            .spawn(move || super::run(&opts, &mut observer))
            .map_err(LiveError::Spawn)?;
        Ok(Live {
            shared,
            thread: Some(thread),
        })
    }

    /// Waits until the probes are attached, or returns the error that stopped the
    /// recording. The attached and skipped probe counts.
    pub fn wait_started(&mut self, limit: Duration) -> Result<(usize, usize), LiveError> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(counts) = *lock(&self.shared.started) {
                return Ok(counts);
            }
            if self.finished() {
                return match self.join() {
                    Some(Err(e)) => Err(e),
                    _ => Err(LiveError::EndedEarly),
                };
            }
            if Instant::now() > deadline {
                return Err(LiveError::NotAttached(limit));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Once started: the I/O source line, then a line per probe skipped (why).
    pub fn probe_lines(&self) -> Vec<String> {
        lock(&self.shared.lines).clone()
    }

    /// The events recorded since the last call, in the batches they were drained in
    /// (in order: one after the other they are the recording's order).
    pub fn take_batches(&self) -> Vec<Vec<Event>> {
        std::mem::take(&mut *lock(&self.shared.events))
    }

    /// A batch taken and done with, emptied, for the recorder to fill again (a batch
    /// per drain otherwise: fresh pages every 50 ms, each a fault). Kept only while
    /// fewer than a few wait.
    pub fn give_back(&self, batch: Vec<Event>) {
        lock(&self.shared.spares).keep(batch);
    }

    /// Ring-buffer drops so far (None until the recorder has read its counters).
    pub fn dropped(&self) -> Option<u64> {
        *lock(&self.shared.dropped)
    }

    pub fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.shared.notes))
    }

    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops the recording and returns how it ended (None: already joined).
    pub fn stop(&mut self) -> Option<Result<FileHeader, LiveError>> {
        self.thread.as_ref()?;
        if !self.finished() && lock(&self.shared.started).is_some() {
            request_stop();
        }
        self.join()
    }

    fn join(&mut self) -> Option<Result<FileHeader, LiveError>> {
        let thread = self.thread.take()?;
        // Attaching may still be under way: the recording installs its SIGINT
        // handler before it attaches, so keep asking until it ends.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !thread.is_finished() && Instant::now() < deadline {
            if lock(&self.shared.started).is_some() {
                request_stop();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !thread.is_finished() {
            return Some(Err(LiveError::NoStop));
        }
        Some(match thread.join() {
            Ok(r) => r.map_err(LiveError::from),
            Err(_) => Err(LiveError::Panicked),
        })
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A flag SIGINT and SIGTERM set, for the loops that watch a live recording (`top`,
/// `agent`); signal-hook chains handlers, so `record::run`'s own still stop it.
pub fn quit_flag() -> std::io::Result<Arc<std::sync::atomic::AtomicBool>> {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag))?;
    }
    Ok(flag)
}

/// `record::run` stops on SIGINT; raising it in-process reaches its handler.
fn request_stop() {
    // SAFETY: raise(2) with a valid signal number; the handlers are installed.
    unsafe {
        libc::raise(libc::SIGINT);
    }
}
