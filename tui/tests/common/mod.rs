//! The committed fixture, loaded into a State the way `top --replay --speed 0` does.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use tokenscope_tui::feed::Replay;
use tokenscope_tui::{render, update, Action, State};

/// The lab engine behind untuned nginx (18 requests) plus 6 chat requests
/// straight to the engine, recorded with `tokenscope record`.
pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lab-untuned.tsrec")
}

pub const WINDOW_NS: u64 = 300 * 1_000_000_000;

/// Every event of the fixture delivered, then one tick at its last event.
pub fn fixture_state() -> State {
    let path = fixture();
    let mut replay = Replay::open(&path).expect("fixture readable");
    let mut state = State::new(replay.meta(&path, 0.0), WINDOW_NS);
    let end = replay.last_ns;
    update(&mut state, Action::Events(replay.due(end)));
    assert!(replay.finished(), "every fixture event delivered");
    update(&mut state, Action::SourceEnded("replay done".into()));
    update(
        &mut state,
        Action::Tick {
            clock_ns: end,
            wall_ns: 0,
        },
    );
    state
}

pub fn screen(state: &State, width: u16, height: u16) -> Terminal<TestBackend> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|f| render(f, state))
        .expect("render into the test terminal");
    terminal
}

/// The screen as plain text, one line per row.
pub fn text(state: &State, width: u16, height: u16) -> String {
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
