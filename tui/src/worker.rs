//! top's pipeline thread, as bpftop keeps its collection off the screen's thread:
//! it reads the source (a recording replayed on its own clock, or the live
//! recording), runs `Analysis` and sends the screen what it needs as actions. The
//! screen never waits on it; it is stopped (and the live recording with it) when
//! `Worker` is dropped, panics included.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use collector::pipeline::Config;

use crate::analysis::Analysis;
use crate::feed::{Live, Replay};
use crate::state::Action;

/// How often the thread takes new events in: the live reorder window's length (an
/// event waits that long for older ones anyway, and a pass is at most once a second).
/// Larger batches are cheaper per event: the connections they touch are still in
/// cache from the batch's earlier events. The thread is parked, not asleep: stopping
/// and pausing wake it at once.
const POLL: Duration = Duration::from_millis(200);
/// A replay shown all at once goes through this many events at a time (about a second
/// of issue 17's load), between looks at the stop flag.
const AT_ONCE_PER_POLL: usize = 20_000;

pub enum Source {
    Replay { replay: Box<Replay>, speed: f64 },
    Live(Live),
}

pub struct Worker {
    actions: Receiver<Action>,
    /// The screen is paused: a replay's clock stops with it.
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

impl Worker {
    pub fn start(source: Source, window_ns: u64) -> anyhow::Result<Worker> {
        let (tx, actions) = mpsc::channel();
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let flags = (Arc::clone(&paused), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("tokenscope-pipeline".into())
            .spawn(move || run(source, window_ns, &tx, &flags.0, &flags.1))
            .context("starting the pipeline thread")?;
        Ok(Worker {
            actions,
            paused,
            stop,
            thread: Some(thread),
        })
    }

    /// What the thread sent since the last call; never blocks.
    pub fn actions(&self) -> impl Iterator<Item = Action> + '_ {
        self.actions.try_iter()
    }

    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
        self.wake();
    }

    fn wake(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// Stops the thread (and the live recording) and returns how it ended.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.wake();
        match self.thread.take() {
            None => Ok(()),
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("top's pipeline thread panicked"))),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The thread's state between polls.
struct Feeder<'a> {
    analysis: Analysis,
    tx: &'a Sender<Action>,
    ended: bool,
    /// Ring-buffer drops last sent (live).
    dropped: Option<u64>,
    /// Replay position, in the recording's own time.
    replay_clock: u64,
}

impl Feeder<'_> {
    /// False once the screen is gone (its receiver dropped): the thread ends.
    fn send(&self, action: Action) -> bool {
        self.tx.send(action).is_ok()
    }

    /// Feeds what a replay has due after `dt` of wall time; returns the replay position.
    /// All at once (`speed` 0) is `AT_ONCE_PER_POLL` events at a time, as fast as they
    /// are stitched: memory stays that of the window, not the recording's.
    fn replay(&mut self, replay: &mut Replay, speed: f64, dt: Duration) -> u64 {
        let advanced = self.replay_clock + (dt.as_nanos() as f64 * speed) as u64;
        let events = if speed == 0.0 {
            replay.due_at_most(u64::MAX, AT_ONCE_PER_POLL)
        } else {
            replay.due(advanced)
        };
        self.analysis.push(events);
        // Never past the last event: the window would empty out after the end.
        self.replay_clock = if speed == 0.0 || replay.finished() {
            replay.last_ns
        } else {
            advanced
        };
        if replay.finished() && !self.ended {
            self.ended = true;
            self.analysis.end();
            let why = match replay.error() {
                Some(e) => format!("replay stopped: {e}"),
                None => "replay done".into(),
            };
            self.send(Action::SourceEnded(why));
        }
        self.replay_clock
    }

    /// Feeds what the live recording read; returns now on the events' clock.
    fn live(&mut self, live: &mut Live) -> u64 {
        for batch in live.take_batches() {
            self.analysis.push(batch);
        }
        while let Some(spare) = self.analysis.take_spare() {
            live.give_back(spare);
        }
        if let Some(d) = live.dropped().filter(|&d| self.dropped != Some(d)) {
            self.dropped = Some(d);
            self.analysis.set_dropped(d > 0);
            self.send(Action::Dropped(d));
        }
        for note in live.take_notes() {
            self.send(Action::Note(note));
        }
        if live.finished() && !self.ended {
            self.ended = true;
            let why = match live.stop() {
                Some(Err(e)) => format!("recording stopped: {e:#}"),
                _ => "recording stopped".into(),
            };
            for batch in live.take_batches() {
                self.analysis.push(batch);
            }
            self.analysis.end();
            self.send(Action::SourceEnded(why));
        }
        collector::clock::monotonic_ns()
    }
}

fn run(
    mut source: Source,
    window_ns: u64,
    tx: &Sender<Action>,
    paused: &AtomicBool,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let (cfg, replay_clock) = match &source {
        Source::Replay { replay, .. } => (Config::sorted(), replay.first_ns),
        Source::Live(_) => (Config::live(), 0),
    };
    let mut feeder = Feeder {
        analysis: Analysis::new(window_ns, cfg),
        tx,
        ended: false,
        dropped: None,
        replay_clock,
    };
    if matches!(source, Source::Live(_)) {
        // Its batches go back to the recorder to be refilled.
        feeder.analysis.keep_spare_batches();
    }
    let wall_start = Instant::now();
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let dt = now.duration_since(last);
        last = now;
        let clock_ns = match &mut source {
            // Paused: the replay's clock stops with the screen.
            Source::Replay { .. } if paused.load(Ordering::Relaxed) => feeder.replay_clock,
            Source::Replay { replay, speed } => feeder.replay(replay, *speed, dt),
            Source::Live(live) => feeder.live(live),
        };
        // All at once: the next events straight away, and the first pass once every
        // event went in (one snapshot of the whole recording, as when it was read whole).
        // Paused, nothing goes in: pass and sleep as usual, not spin.
        let at_once_unfinished = matches!(&source, Source::Replay { replay, speed }
            if *speed == 0.0 && !replay.finished());
        if at_once_unfinished && !paused.load(Ordering::Relaxed) {
            continue;
        }
        let wall_ns = now.duration_since(wall_start).as_nanos() as u64;
        let pass = Instant::now();
        if let Some(mut snapshot) = feeder.analysis.tick(clock_ns, wall_ns) {
            snapshot.pass_ns = pass.elapsed().as_nanos() as u64;
            if !feeder.send(Action::Snapshot(Box::new(snapshot))) {
                break;
            }
            // A pass frees what it built over the window in this thread's arena:
            // released once a pass, so top's resident memory follows what it holds.
            collector::probes::give_back_freed_memory();
        }
        // Woken early by `Worker::stop` and `set_paused` (or spuriously: a poll early).
        std::thread::park_timeout(POLL);
    }
    if let Source::Live(mut live) = source {
        if let Some(Err(e)) = live.stop() {
            return Err(e.into());
        }
    }
    Ok(())
}
