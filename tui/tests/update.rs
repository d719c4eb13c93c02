//! update() and the worker's Analysis: sort, filter, selection, pause, the pass
//! rate and the window, and the key map, on the committed fixture.
#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

mod common;

use collector::ingest::Event;
use common::{fixture, fixture_span, fixture_state, fixture_top, Top, WINDOW_NS};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use tokenscope_tui::feed::Replay;
use tokenscope_tui::{action_for_key, update, Action, SortKey, State, View};

const S: u64 = 1_000_000_000;

fn column(
    state: &State,
    f: impl Fn(&tokenscope_tui::rows::Row) -> Option<u64>,
) -> Vec<Option<u64>> {
    state
        .visible
        .iter()
        .map(|&i| f(&state.shown.rows[i]))
        .collect()
}

fn non_increasing(v: &[Option<u64>]) -> bool {
    v.windows(2).all(|w| w[0] >= w[1])
}

#[test]
fn sort_cycles_start_ttft_itl_worst_first() {
    let mut state = fixture_state();
    assert_eq!(state.sort, SortKey::Start);
    assert!(
        non_increasing(&column(&state, |r| Some(r.start_ns))),
        "start: newest first"
    );
    update(&mut state, Action::CycleSort);
    assert_eq!(state.sort, SortKey::Ttft);
    let ttft = column(&state, |r| r.ttft_first_ns);
    assert!(non_increasing(&ttft), "TTFT: slowest first: {ttft:?}");
    assert!(
        ttft[0] > ttft[ttft.len() - 1],
        "TTFTs differ in the fixture"
    );
    update(&mut state, Action::CycleSort);
    assert_eq!(state.sort, SortKey::ItlP99);
    assert!(
        non_increasing(&column(&state, |r| r.itl_p99_ns)),
        "ITL p99: most jittery first"
    );
    update(&mut state, Action::CycleSort);
    assert_eq!(state.sort, SortKey::Start, "s wraps around");
}

#[test]
fn filter_narrows_as_typed_and_cancel_or_esc_restore() {
    let mut state = fixture_state();
    let all = state.visible.len();
    update(&mut state, Action::FilterStart);
    for c in "chat".chars() {
        update(&mut state, Action::FilterInput(c));
    }
    assert_eq!(state.visible.len(), 6, "narrowed while typing");
    update(&mut state, Action::FilterCancel);
    assert_eq!(state.visible.len(), all, "cancel drops the typed filter");
    assert_eq!(state.filter, "");

    update(&mut state, Action::FilterStart);
    for c in "COALESCED".chars() {
        update(&mut state, Action::FilterInput(c));
    }
    update(&mut state, Action::FilterApply);
    assert_eq!(state.filter, "coalesced", "filters ignore case");
    assert!(!state.visible.is_empty(), "the untuned proxy coalesces");
    assert!(
        state.visible.iter().all(|&i| state.shown.rows[i].coalesced),
        "only coalesced requests are shown"
    );
    update(&mut state, Action::FilterBackspace);
    assert_eq!(
        state.filter, "coalesced",
        "backspace only edits while typing"
    );
    update(&mut state, Action::Back);
    assert_eq!(state.visible.len(), all, "Esc clears an applied filter");

    update(&mut state, Action::FilterStart);
    for c in "no such route".chars() {
        update(&mut state, Action::FilterInput(c));
    }
    update(&mut state, Action::FilterApply);
    assert!(state.visible.is_empty());
    update(&mut state, Action::Open);
    assert_eq!(state.view, View::Table, "nothing to open");
}

#[test]
fn selection_moves_clamps_and_opens_the_selected_request() {
    let mut state = fixture_state();
    let n = state.visible.len();
    update(&mut state, Action::Up);
    assert_eq!(state.selected, 0, "up at the top stays");
    update(&mut state, Action::Down);
    update(&mut state, Action::Down);
    assert_eq!(state.selected, 2);
    update(&mut state, Action::End);
    assert_eq!(state.selected, n - 1);
    update(&mut state, Action::Down);
    assert_eq!(state.selected, n - 1, "down at the bottom stays");
    update(&mut state, Action::PageUp);
    assert_eq!(state.selected, n - 11);
    update(&mut state, Action::Home);
    update(&mut state, Action::PageDown);
    assert_eq!(state.selected, 10);
    let row = state.selected_row().expect("row").clone();
    update(&mut state, Action::Open);
    assert_eq!(state.view, View::Detail);
    let r = state.selected_request().expect("request");
    assert_eq!(
        (r.client_addr.as_str(), r.first_byte_ns),
        (&*row.key.client_addr, row.key.first_byte_ns),
        "the detail shows the selected row's request"
    );
    update(&mut state, Action::Back);
    assert_eq!(state.view, View::Table);
    update(&mut state, Action::ToggleHelp);
    assert!(state.help);
    update(&mut state, Action::Back);
    assert!(!state.help, "Esc closes help first");
}

/// The fixture's events split at `at_ns` (replay order): the first half delivered.
fn halves(at_ns: u64) -> (Top, Vec<Event>, u64) {
    let (mut top, mut replay) = Top::replay(WINDOW_NS);
    top.events(replay.due(at_ns));
    let rest = replay.due(u64::MAX);
    (top, rest, replay.last_ns)
}

#[test]
fn restitch_at_most_once_a_second_and_never_while_paused() {
    let (first, last) = fixture_span();
    let mid = first + (last - first) / 2;
    let (mut top, rest, end) = halves(mid);
    top.tick(mid, 0);
    let early = top.state.shown.rows.len();
    assert!(early > 0, "requests in the first half");

    top.events(rest);
    top.tick(end, S / 2);
    assert_eq!(top.state.shown.rows.len(), early, "no pass within a second");

    update(&mut top.state, Action::TogglePause);
    top.tick(end, 2 * S);
    assert_eq!(
        top.state.shown.rows.len(),
        early,
        "paused: the screen holds still"
    );
    assert!(
        top.state.shown.events_total < top.analysis.events_total(),
        "events still arrive underneath"
    );

    update(&mut top.state, Action::TogglePause);
    assert_eq!(
        top.state.shown.rows.len(),
        24,
        "unpaused: the pass made meanwhile"
    );
    assert_eq!(top.state.shown.events_total, top.analysis.events_total());
}

#[test]
fn selection_follows_its_request_across_restitches() {
    let (first, last) = fixture_span();
    let mid = first + (last - first) / 2;
    let (mut top, rest, end) = halves(mid);
    top.tick(mid, 0);
    let state = &mut top.state;
    // The oldest request: complete by mid-recording (a younger one may still
    // be half-joined across nginx, a different request until it is whole).
    update(state, Action::End);
    let (position, key) = (
        state.selected,
        state.selected_row().expect("row").key.clone(),
    );
    top.events(rest);
    top.tick(end, 5 * S);
    let state = &top.state;
    assert_eq!(state.shown.rows.len(), 24);
    assert_eq!(
        state.selected_row().expect("row").key,
        key,
        "newer requests above it do not move the selection off it"
    );
    assert!(state.selected > position, "it moved down the table");
}

#[test]
fn window_forgets_old_events() {
    let (mut top, mut replay) = Top::replay(2 * S);
    top.events(replay.due(u64::MAX));
    let end = replay.last_ns;
    top.tick(end, 0);
    let held = top.state.shown.events_in_window;
    assert!(
        held < top.state.shown.events_total,
        "older than 2 s left the window"
    );
    assert!(
        !top.state.shown.rows.is_empty(),
        "the last requests are shown"
    );
    top.tick(end + 10 * S, 5 * S);
    assert_eq!(top.state.shown.events_in_window, 0, "all gone 10 s later");
    assert!(top.state.shown.rows.is_empty(), "and the table emptied");
}

#[test]
fn events_per_second_counts_the_last_second() {
    let state = fixture_state();
    assert!(
        state.shown.events_per_s > 0,
        "events in the fixture's last second"
    );
    assert!(state.shown.events_per_s <= state.shown.events_total);
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

#[test]
fn key_map_types_into_the_filter_and_quits_outside_it() {
    let mut state = fixture_state();
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Char('q'))),
        Some(Action::Quit)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Char('j'))),
        Some(Action::Down)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Up)),
        Some(Action::Up)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Char('s'))),
        Some(Action::CycleSort)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Char('p'))),
        Some(Action::TogglePause)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Char('?'))),
        Some(Action::ToggleHelp)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Enter)),
        Some(Action::Open)
    ));
    update(&mut state, Action::FilterStart);
    assert!(
        matches!(
            action_for_key(&state, key(KeyCode::Char('q'))),
            Some(Action::FilterInput('q'))
        ),
        "q is text while filtering"
    );
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Enter)),
        Some(Action::FilterApply)
    ));
    assert!(matches!(
        action_for_key(&state, key(KeyCode::Esc)),
        Some(Action::FilterCancel)
    ));
    assert!(
        matches!(
            action_for_key(
                &state,
                KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)
            ),
            Some(Action::Quit)
        ),
        "Ctrl-C quits even while filtering"
    );
}

#[test]
fn header_shows_the_latest_nvml_reading_per_gpu() {
    use collector::ingest::model::{event::Body, NvmlSample};
    let nvml = |ts_ns: u64, util: u32| Event {
        ts_ns,
        pid: 0,
        tid: 0,
        cpu: 0,
        comm: Default::default(),
        body: Some(Body::Nvml(NvmlSample {
            device: 0,
            gpu_util_pct: Some(util),
            sm_clock_mhz: Some(1410),
            mem_used_bytes: Some(12 << 30),
            power_mw: Some(250_000),
            ..NvmlSample::default()
        })),
    };
    let mut top = fixture_top();
    let before = common::text(&top.state, 80, 24);
    assert!(
        before.contains("no NVML"),
        "no samples in the fixture:\n{before}"
    );
    let t = top.state.shown.clock_ns;
    top.events(vec![nvml(t + 2, 87), nvml(t + 1, 10)]);
    top.tick(t + 3, 10 * S);
    let screen = common::text(&top.state, 80, 24);
    assert!(
        screen.contains("GPU0 87% SM 1410 MHz mem 12.0 GiB 250 W"),
        "the latest sample, not the last delivered:\n{screen}"
    );
}

#[test]
fn diagnoses_come_with_the_restitch_as_the_report_has_them() {
    let (mut top, rest, end) = halves(fixture_span().0);
    top.events(rest);
    assert!(
        top.state.shown.diagnoses.is_empty(),
        "nothing diagnosed before a tick"
    );
    top.tick(end, 0);
    let state = &top.state;
    let rules: Vec<u8> = state.shown.diagnoses.iter().map(|d| d.rule).collect();
    assert_eq!(
        rules,
        [2, 6, 1],
        "the report's diagnoses of the fixture, largest saving first: proxy buffering, queueing, new connections"
    );
    let cited: Vec<u8> = state.diagnoses_citing(4).map(|d| d.rule).collect();
    assert_eq!(cited, [2, 6, 1], "request 4 is evidence of all three");
    let cited: Vec<u8> = state.diagnoses_citing(23).map(|d| d.rule).collect();
    assert!(
        cited.is_empty(),
        "a reused-connection chat request is evidence of none: {cited:?}"
    );
}

#[test]
fn the_api_column_shows_where_apis_differ_and_filters_by_api() {
    let mut state = fixture_state();
    let header = |state: &State| {
        common::text(state, 120, 30)
            .lines()
            .find(|l| l.contains("route"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    assert!(
        !header(&state).contains(" api "),
        "one API (the fixture predates API names: all openai): no column"
    );
    let first = state.visible[0];
    state.shown.rows[first].api = Some("anthropic");
    assert!(
        header(&state).contains(" api "),
        "two APIs: {}",
        header(&state)
    );
    let screen = common::text(&state, 120, 30);
    assert!(
        screen.contains("anthropic") && screen.contains("openai"),
        "{screen}"
    );
    update(&mut state, Action::FilterStart);
    for c in "anthro".chars() {
        update(&mut state, Action::FilterInput(c));
    }
    update(&mut state, Action::FilterApply);
    assert_eq!(state.visible, [first], "the filter reads the API");
}

#[test]
fn a_replay_of_two_hosts_recordings_shows_both_side_by_side() {
    use collector::ingest::record::{RecordReader, RecordWriter};
    // The fixture again, as if another host recorded it (another boot: its own clock, its
    // own pids and sockets), 2 s later. No connection of one is the other's peer, so the
    // two hosts' requests stand side by side, each whole.
    let dir = tempfile::tempdir().expect("tempdir");
    let other = dir.path().join("other-host.tsrec");
    let mut reader = RecordReader::open(&fixture()).expect("fixture");
    let mut header = reader.header.clone();
    header.boot_id = "00000000-0000-4000-8000-00000000beef".into();
    header.start_monotonic_ns += 2_000_000_000;
    let end = header.end_monotonic_ns + 2_000_000_000;
    let counters = header.counters.unwrap_or_default();
    let mut w = RecordWriter::create(&other, header).expect("create");
    for mut e in reader.read_all().expect("read") {
        e.ts_ns += 2_000_000_000;
        w.push(e).expect("write");
    }
    w.finish(counters, end).expect("seal");

    let paths = [fixture(), other];
    let mut replay = Replay::open(&paths).expect("two recordings");
    let meta = replay.meta(&paths, 0.0);
    assert!(
        meta.source.contains("lab-untuned.tsrec + other-host.tsrec"),
        "{}",
        meta.source
    );
    let mut top = Top::new(meta, WINDOW_NS, collector::pipeline::Config::sorted());
    top.events(replay.due(u64::MAX));
    assert!(replay.finished());
    let last = replay.last_ns;
    top.end("replay done");
    top.tick(last, 0);
    assert_eq!(
        top.state.shown.rows.len(),
        2 * fixture_state().shown.rows.len(),
        "each host's requests, once each"
    );
}

#[test]
fn findings_between_makings_follow_their_requests_as_the_window_slides() {
    use tokenscope_tui::rows::RowKey;
    let mut top = fixture_top();
    let keys = |state: &State, ids: &[usize]| -> Vec<RowKey> {
        ids.iter()
            .map(|&i| state.shown.rows[i].key.clone())
            .collect()
    };
    let before = &top.state;
    let stalled_keys = |state: &State| -> Vec<RowKey> {
        state
            .shown
            .rows
            .iter()
            .filter(|r| r.stalled)
            .map(|r| r.key.clone())
            .collect()
    };
    let cited_keys = |state: &State| -> Vec<Vec<RowKey>> {
        state
            .shown
            .diagnoses
            .iter()
            .map(|d| keys(state, &d.evidence.request_ids))
            .collect()
    };
    let cited = cited_keys(before);
    let stalled = stalled_keys(before);
    assert!(!stalled.is_empty(), "the fixture has stalled requests");
    let (rows, end) = (before.shown.rows.len(), before.shown.clock_ns);
    // The oldest requests leave the window; the findings are not made again.
    top.analysis.findings_every(3600 * S);
    top.analysis.window_ns = end - before.shown.rows[rows / 2].start_ns;
    top.tick(end, 2 * S);
    let after = &top.state;
    assert!(
        after.shown.rows.len() < rows,
        "older requests left the window"
    );
    let now = cited_keys(after);
    let still = |k: &RowKey| after.shown.rows.iter().any(|r| &r.key == k);
    let kept: Vec<Vec<RowKey>> = cited
        .iter()
        .map(|ks| ks.iter().filter(|k| still(k)).cloned().collect())
        .collect();
    assert_eq!(
        now, kept,
        "each diagnosis cites the same requests, renumbered, less those gone"
    );
    let stalled_now = stalled_keys(after);
    let stalled_kept: Vec<RowKey> = stalled.into_iter().filter(|k| still(k)).collect();
    assert_eq!(
        stalled_now, stalled_kept,
        "stall flags stay with their requests"
    );
}
