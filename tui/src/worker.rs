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

/// How often the thread looks for new events.
const POLL: Duration = Duration::from_millis(50);

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
    }

    /// Stops the thread (and the live recording) and returns how it ended.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
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

fn run(
    mut source: Source,
    window_ns: u64,
    tx: &Sender<Action>,
    paused: &AtomicBool,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let cfg = match source {
        Source::Replay { .. } => Config::sorted(),
        Source::Live(_) => Config::live(),
    };
    let mut analysis = Analysis::new(window_ns, cfg);
    let wall_start = Instant::now();
    let mut last = Instant::now();
    let mut ended = false;
    let mut dropped = None;
    // Replay position, in the recording's own time.
    let mut replay_clock = match &source {
        Source::Replay { replay, .. } => replay.first_ns,
        Source::Live(_) => 0,
    };
    // A screen gone (its receiver dropped) ends the thread like a stop.
    let send = |a: Action| tx.send(a).is_ok();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let dt = now.duration_since(last);
        last = now;
        let clock_ns = match &mut source {
            Source::Replay { replay, speed } => {
                if !paused.load(Ordering::Relaxed) {
                    replay_clock = if *speed == 0.0 {
                        replay.last_ns
                    } else {
                        (replay_clock + (dt.as_nanos() as f64 * *speed) as u64).min(replay.last_ns)
                    };
                    analysis.push(replay.due(replay_clock));
                    if replay.finished() && !ended {
                        ended = true;
                        analysis.end();
                        send(Action::SourceEnded("replay done".into()));
                    }
                }
                replay_clock
            }
            Source::Live(live) => {
                analysis.push(live.take_events());
                if let Some(d) = live.dropped().filter(|&d| dropped != Some(d)) {
                    dropped = Some(d);
                    analysis.set_dropped(d > 0);
                    send(Action::Dropped(d));
                }
                for note in live.take_notes() {
                    send(Action::Note(note));
                }
                if live.finished() && !ended {
                    ended = true;
                    let why = match live.stop() {
                        Some(Err(e)) => format!("recording stopped: {e:#}"),
                        _ => "recording stopped".into(),
                    };
                    analysis.push(live.take_events());
                    analysis.end();
                    send(Action::SourceEnded(why));
                }
                collector::clock::monotonic_ns()
            }
        };
        let wall_ns = now.duration_since(wall_start).as_nanos() as u64;
        let pass = Instant::now();
        if let Some(mut snapshot) = analysis.tick(clock_ns, wall_ns) {
            snapshot.pass_ns = pass.elapsed().as_nanos() as u64;
            if !send(Action::Snapshot(Box::new(snapshot))) {
                break;
            }
        }
        std::thread::sleep(POLL);
    }
    if let Source::Live(mut live) = source {
        if let Some(Err(e)) = live.stop() {
            return Err(e);
        }
    }
    Ok(())
}
