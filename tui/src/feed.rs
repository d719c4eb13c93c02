//! Where events come from: a recording replayed on its own clock, or a live
//! recording on a thread that is always stopped (probes detached) before top
//! returns, panics included.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use collector::ingest::record::{FileHeader, RecordReader};
use collector::ingest::Event;
use collector::probes::Probes;
use collector::record::{RecordObserver, RecordOptions};

use crate::state::Meta;

/// A recording played back: events are due when their time since the first
/// event is at most the replay position.
pub struct Replay {
    pub header: FileHeader,
    events: Vec<Event>,
    next: usize,
    /// Event time of the replay's start and of its last event.
    pub first_ns: u64,
    pub last_ns: u64,
}

impl Replay {
    pub fn open(path: &Path) -> anyhow::Result<Replay> {
        let mut reader = RecordReader::open(path)?;
        let mut events = reader.read_all()?;
        events.sort_by_key(|e| e.ts_ns);
        let header = reader.header;
        let first_ns = events
            .first()
            .map_or(header.start_monotonic_ns, |e| e.ts_ns);
        let last_ns = events.last().map_or(first_ns, |e| e.ts_ns);
        Ok(Replay {
            header,
            events,
            next: 0,
            first_ns,
            last_ns,
        })
    }

    pub fn meta(&self, path: &Path, speed: f64) -> Meta {
        let h = &self.header;
        let name = path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let speed = if speed == 0.0 {
            "at once".to_string()
        } else {
            format!("×{speed}")
        };
        Meta {
            host: h.host.clone(),
            source: format!("replay {name} {speed}"),
            probes_attached: h.probes.len(),
            probes_skipped: h.probes_skipped.len(),
            dropped: h.counters.map(|c| c.dropped),
            start_ns: self.first_ns,
        }
    }

    /// Events due at replay position `clock_ns` (event time), not handed out before.
    pub fn due(&mut self, clock_ns: u64) -> Vec<Event> {
        let end = self.next + self.events[self.next..].partition_point(|e| e.ts_ns <= clock_ns);
        let batch = self.events[self.next..end].to_vec();
        self.next = end;
        batch
    }

    pub fn finished(&self) -> bool {
        self.next >= self.events.len()
    }
}

/// What the recording thread shares with the screen.
#[derive(Default)]
struct Shared {
    events: Mutex<Vec<Event>>,
    notes: Mutex<Vec<String>>,
    /// Probes attached (and the signal handlers that stop the recording installed).
    started: Mutex<Option<(usize, usize)>>,
    /// Ring-buffer drops so far, as the recorder last read them.
    dropped: Mutex<Option<u64>>,
}

struct Observer(Arc<Shared>);

impl RecordObserver for Observer {
    fn started(&mut self, probes: &Probes) {
        *lock(&self.0.started) = Some((probes.attached.len(), probes.skipped.len()));
    }

    fn event(&mut self, event: &Event) {
        lock(&self.0.events).push(event.clone());
    }

    fn note(&mut self, line: &str) {
        lock(&self.0.notes).push(line.to_string());
    }

    fn counters(&mut self, _submitted: u64, dropped: u64) {
        *lock(&self.0.dropped) = Some(dropped);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `collector::record::run` on a thread. Dropping it stops the recording
/// (SIGINT, which `record::run` handles by detaching its probes) and waits.
pub struct Live {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<anyhow::Result<FileHeader>>>,
    /// Removed on drop unless the user asked to keep the recording.
    _temp: Option<tempfile::TempDir>,
    pub output: PathBuf,
}

impl Live {
    pub fn start(mut opts: RecordOptions, keep: Option<PathBuf>) -> anyhow::Result<Live> {
        let (temp, output) = match keep {
            Some(path) => (None, path),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("tokenscope-top-")
                    .tempdir()
                    .context("temporary directory for the live recording")?;
                let path = dir.path().join("live.tsrec");
                (Some(dir), path)
            }
        };
        opts.output = output.clone();
        let shared = Arc::new(Shared::default());
        let mut observer = Observer(Arc::clone(&shared));
        let thread = std::thread::Builder::new()
            .name("tokenscope-record".into())
            .spawn(move || collector::record::run(&opts, &mut observer).context("record"))
            .context("starting the recording thread")?;
        Ok(Live {
            shared,
            thread: Some(thread),
            _temp: temp,
            output,
        })
    }

    /// Waits until the probes are attached, or returns the error that stopped the recording.
    pub fn wait_started(&mut self, limit: Duration) -> anyhow::Result<(usize, usize)> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(counts) = *lock(&self.shared.started) {
                return Ok(counts);
            }
            if self.finished() {
                return match self.join() {
                    Some(Err(e)) => Err(e),
                    _ => Err(anyhow::anyhow!("the recording ended before it started")),
                };
            }
            if Instant::now() > deadline {
                anyhow::bail!("probes not attached after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *lock(&self.shared.events))
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
    pub fn stop(&mut self) -> Option<anyhow::Result<FileHeader>> {
        self.thread.as_ref()?;
        if !self.finished() && lock(&self.shared.started).is_some() {
            request_stop();
        }
        self.join()
    }

    fn join(&mut self) -> Option<anyhow::Result<FileHeader>> {
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
            return Some(Err(anyhow::anyhow!(
                "the recording did not stop within 30 s; its probes go when this process exits"
            )));
        }
        Some(
            thread
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the recording thread panicked"))),
        )
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// `record::run` stops on SIGINT; raising it in-process reaches its handler.
fn request_stop() {
    // SAFETY: raise(2) with a valid signal number; the handlers are installed.
    unsafe {
        libc::raise(libc::SIGINT);
    }
}

/// Installs the quit-flag handlers for SIGINT and SIGTERM (idempotent enough:
/// signal-hook chains handlers, and each sets the same flag).
pub fn install_quit_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&flag)).context("signal handler")?;
    }
    Ok(flag)
}
