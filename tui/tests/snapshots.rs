//! The screens, rendered through ratatui's TestBackend on the committed
//! fixture at 80x24 and 120x40, compared with committed insta snapshots.
#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

mod common;

use common::{fixture_state, text};
use tokenscope_tui::{update, Action, SortKey, State, View};

const SIZES: [(u16, u16); 2] = [(80, 24), (120, 40)];

fn snapshot_all(name: &str, state: &State) {
    for (w, h) in SIZES {
        insta::assert_snapshot!(format!("{name}_{w}x{h}"), text(state, w, h));
    }
}

#[test]
fn request_table() {
    let state = fixture_state();
    assert_eq!(state.shown.rows.len(), 24, "the fixture's 24 requests");
    snapshot_all("table", &state);
}

#[test]
fn request_table_sorted_by_ttft_and_filtered() {
    let mut state = fixture_state();
    update(&mut state, Action::CycleSort);
    assert_eq!(state.sort, SortKey::Ttft);
    update(&mut state, Action::FilterStart);
    for c in "chat".chars() {
        update(&mut state, Action::FilterInput(c));
    }
    update(&mut state, Action::FilterApply);
    assert_eq!(state.visible.len(), 6, "the six chat requests");
    snapshot_all("table_ttft_chat", &state);
}

#[test]
fn request_detail_of_the_slowest_proxied_request() {
    let mut state = fixture_state();
    update(&mut state, Action::CycleSort);
    update(&mut state, Action::Open);
    assert_eq!(state.view, View::Detail);
    let r = state.selected_request().expect("a request is selected");
    assert_eq!(
        r.points.len(),
        4,
        "the slowest request went client -> nginx -> engine"
    );
    snapshot_all("detail", &state);
}

#[test]
fn help_over_the_table() {
    let mut state = fixture_state();
    update(&mut state, Action::ToggleHelp);
    snapshot_all("help", &state);
}

#[test]
fn tiny_terminal_does_not_panic() {
    let state = fixture_state();
    for (w, h) in [(1, 1), (20, 5), (40, 10), (80, 3)] {
        let _ = text(&state, w, h);
    }
    let mut detail = fixture_state();
    update(&mut detail, Action::Open);
    for (w, h) in [(1, 1), (20, 5), (40, 10)] {
        let _ = text(&detail, w, h);
    }
}
