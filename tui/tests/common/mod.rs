//! The committed fixture, loaded into a State the way `top --replay --speed 0` does:
//! the worker thread's steps (`Analysis`) and the screen's (`update`), on one thread.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use collector::ingest::Event;
use collector::pipeline::Config;
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use tokenscope_tui::analysis::Analysis;
use tokenscope_tui::feed::Replay;
use tokenscope_tui::{render, update, Action, Meta, State};

/// The lab engine behind untuned nginx (18 requests) plus 6 chat requests
/// straight to the engine, recorded with `tokenscope record`.
pub(crate) fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lab-untuned.tsrec")
}

pub(crate) const WINDOW_NS: u64 = 300 * 1_000_000_000;

/// top's two halves, driven by hand: what the worker thread does and what the screen does.
pub(crate) struct Top {
    pub analysis: Analysis,
    pub state: State,
}

impl Top {
    pub(crate) fn new(meta: Meta, window_ns: u64, cfg: Config) -> Top {
        Top {
            analysis: Analysis::new(window_ns, cfg),
            state: State::new(meta),
        }
    }

    /// The fixture's replay, nothing delivered yet.
    pub(crate) fn replay(window_ns: u64) -> (Top, Replay) {
        let path = fixture();
        let replay = Replay::open(std::slice::from_ref(&path)).expect("fixture readable");
        let top = Top::new(
            replay.meta(std::slice::from_ref(&path), 0.0),
            window_ns,
            Config::sorted(),
        );
        (top, replay)
    }

    pub(crate) fn events(&mut self, batch: Vec<Event>) {
        self.analysis.push(batch);
    }

    /// The worker's tick; a snapshot it makes goes to the screen.
    pub(crate) fn tick(&mut self, clock_ns: u64, wall_ns: u64) {
        if let Some(s) = self.analysis.tick(clock_ns, wall_ns) {
            update(&mut self.state, Action::Snapshot(Box::new(s)));
        }
    }

    pub(crate) fn end(&mut self, why: &str) {
        self.analysis.end();
        update(&mut self.state, Action::SourceEnded(why.into()));
    }
}

/// Every event of the fixture delivered, then one tick at its last event.
pub(crate) fn fixture_top() -> Top {
    let (mut top, mut replay) = Top::replay(WINDOW_NS);
    top.events(replay.due(u64::MAX));
    assert!(replay.finished(), "every fixture event delivered");
    let end = replay.last_ns;
    top.end("replay done");
    top.tick(end, 0);
    top
}

/// The fixture's first and last event times (a replay knows its last only at its end).
pub(crate) fn fixture_span() -> (u64, u64) {
    let mut replay = Replay::open(&[fixture()]).expect("fixture readable");
    let first = replay.first_ns;
    replay.due(u64::MAX);
    (first, replay.last_ns)
}

pub(crate) fn fixture_state() -> State {
    fixture_top().state
}

pub(crate) fn screen(state: &State, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|f| render(f, state))
        .expect("render into the test terminal");
    terminal
}

/// The screen as plain text, one line per row.
pub(crate) fn text(state: &State, width: u16, height: u16) -> String {
    let terminal = screen(state, width, height);
    let buf = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buf.area.height {
        for x in 0..buf.area.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

/// A child's stdout read line by line on its own thread.
pub(crate) struct ChildLines(std::sync::mpsc::Receiver<String>);

impl ChildLines {
    pub(crate) fn of(child: &mut std::process::Child) -> ChildLines {
        use std::io::BufRead;
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("the child's stdout is piped");
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildLines(lines)
    }

    /// Waits (up to 3 minutes) for the next line that starts with `prefix`; the rest of it.
    pub(crate) fn said(&self, prefix: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .0
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("the lab child never said {prefix:?}"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }
}
