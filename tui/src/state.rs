//! The screen's state and its one way to change: `update(&mut State, Action)`.
//! Pure: what the window holds arrives in `Action::Snapshot` (made by `analysis`
//! on its own thread), keys as actions; nothing here reads a clock, a file or the
//! terminal, and nothing here is slower than a frame.

use collector::diagnose::Diagnosis;
use collector::stitch::Request;

use crate::analysis::Snapshot;
use crate::findings::Share;
use crate::rows::{Row, RowKey};

pub use crate::analysis::TTFT_WINDOW_NS;

/// What the header says about where the events come from.
#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub host: String,
    /// e.g. "replay lab.tsrec ×1" or "live".
    pub source: String,
    pub probes_attached: usize,
    pub probes_skipped: usize,
    /// Records the ring buffer had no room for; None while unknown (live).
    pub dropped: Option<u64>,
    /// Times in the table are shown relative to this (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Newest first.
    Start,
    /// Slowest first.
    Ttft,
    /// Most jittery first.
    ItlP99,
}

impl SortKey {
    pub fn label(self) -> &'static str {
        match self {
            SortKey::Start => "start",
            SortKey::Ttft => "TTFT",
            SortKey::ItlP99 => "ITL p99",
        }
    }

    fn next(self) -> SortKey {
        match self {
            SortKey::Start => SortKey::Ttft,
            SortKey::Ttft => SortKey::ItlP99,
            SortKey::ItlP99 => SortKey::Start,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Table,
    /// The selected request's waterfall and per-token timeline.
    Detail,
}

#[derive(Clone, Debug)]
pub enum Action {
    /// A pass over the window (at most one a second). Held while paused.
    Snapshot(Box<Snapshot>),
    /// Ring-buffer drops so far (live, read every 200 ms).
    Dropped(u64),
    /// The source has no more events (replay at its end, live recording over).
    SourceEnded(String),
    /// A line about the source (e.g. NVML off), shown in the status line.
    Note(String),
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Open,
    Back,
    FilterStart,
    FilterInput(char),
    FilterBackspace,
    FilterApply,
    FilterCancel,
    CycleSort,
    TogglePause,
    ToggleHelp,
    Quit,
}

/// Rows a page key moves.
const PAGE: usize = 10;

pub struct State {
    pub meta: Meta,
    /// The last snapshot shown (the window as of one pass).
    pub shown: Snapshot,
    /// The newest snapshot that came while paused: shown on resume.
    held: Option<Box<Snapshot>>,
    /// Indices into `rows`, filtered and sorted.
    pub visible: Vec<usize>,
    /// Position in `visible`.
    pub selected: usize,
    selected_key: Option<RowKey>,
    pub sort: SortKey,
    /// The applied filter (lower case), and the text being typed after `/`.
    pub filter: String,
    pub filter_input: Option<String>,
    pub view: View,
    pub help: bool,
    pub paused: bool,
    pub ended: Option<String>,
    pub note: Option<String>,
    pub quit: bool,
}

impl State {
    pub fn new(meta: Meta) -> State {
        State {
            shown: Snapshot {
                clock_ns: meta.start_ns,
                ..Snapshot::default()
            },
            meta,
            held: None,
            visible: Vec::new(),
            selected: 0,
            selected_key: None,
            sort: SortKey::Start,
            filter: String::new(),
            filter_input: None,
            view: View::Table,
            help: false,
            paused: false,
            ended: None,
            note: None,
            quit: false,
        }
    }

    pub fn selected_row(&self) -> Option<&Row> {
        self.visible
            .get(self.selected)
            .map(|&i| &self.shown.rows[i])
    }

    pub fn selected_request(&self) -> Option<&Request> {
        self.selected_row().map(|r| &*self.shown.requests[r.index])
    }

    /// The selected request's GPU share (see `analysis::Snapshot::findings`).
    pub fn selected_share(&self) -> Option<Share> {
        self.selected_row()
            .and_then(|r| self.shown.findings.share(&r.key))
    }

    /// The diagnoses that cite request `id` among their evidence.
    pub fn diagnoses_citing(&self, id: usize) -> impl Iterator<Item = &Diagnosis> {
        self.shown
            .diagnoses
            .iter()
            .filter(move |d| d.evidence.request_ids.contains(&id))
    }

    /// The filter in effect: what is being typed, else the applied one.
    pub fn active_filter(&self) -> &str {
        self.filter_input.as_deref().unwrap_or(&self.filter)
    }

    /// Shows a pass: the rows are laid out again, the selection kept on its request.
    fn show(&mut self, s: Snapshot) {
        self.shown = s;
        self.relayout();
    }

    /// Filter and sort the rows again, keeping the selected request selected.
    fn relayout(&mut self) {
        let needle = self.active_filter().to_lowercase();
        let mut visible: Vec<usize> = (0..self.shown.rows.len())
            .filter(|&i| self.shown.rows[i].matches(&needle))
            .collect();
        let rows = &self.shown.rows;
        match self.sort {
            SortKey::Start => visible.sort_by_key(|&i| std::cmp::Reverse(rows[i].start_ns)),
            // Rows without the value last; ties by start.
            SortKey::Ttft => visible.sort_by_key(|&i| {
                (
                    std::cmp::Reverse(rows[i].ttft_first_ns),
                    std::cmp::Reverse(rows[i].start_ns),
                )
            }),
            SortKey::ItlP99 => visible.sort_by_key(|&i| {
                (
                    std::cmp::Reverse(rows[i].itl_p99_ns),
                    std::cmp::Reverse(rows[i].start_ns),
                )
            }),
        }
        self.visible = visible;
        let found = self.selected_key.as_ref().and_then(|k| {
            self.visible
                .iter()
                .position(|&i| &self.shown.rows[i].key == k)
        });
        self.selected = match found {
            Some(p) => p,
            None => self.selected.min(self.visible.len().saturating_sub(1)),
        };
        self.remember_selection();
        if self.view == View::Detail && self.visible.is_empty() {
            self.view = View::Table;
        }
    }

    fn remember_selection(&mut self) {
        self.selected_key = self.selected_row().map(|r| r.key.clone());
    }

    fn move_selection(&mut self, to: usize) {
        self.selected = to.min(self.visible.len().saturating_sub(1));
        self.remember_selection();
    }
}

pub fn update(state: &mut State, action: Action) {
    match action {
        // Paused: the screen holds still; passes keep coming underneath.
        Action::Snapshot(snapshot) if state.paused => state.held = Some(snapshot),
        Action::Snapshot(snapshot) => state.show(*snapshot),
        Action::SourceEnded(why) => state.ended = Some(why),
        Action::Dropped(n) => state.meta.dropped = Some(n),
        Action::Note(line) => state.note = Some(line),
        Action::Quit => state.quit = true,
        Action::ToggleHelp => state.help = !state.help,
        Action::TogglePause => {
            state.paused = !state.paused;
            if !state.paused {
                if let Some(snapshot) = state.held.take() {
                    state.show(*snapshot);
                }
            }
        }
        Action::FilterStart => {
            state.filter_input = Some(state.filter.clone());
        }
        Action::FilterInput(c) => {
            if let Some(text) = &mut state.filter_input {
                text.push(c);
                state.relayout();
            }
        }
        Action::FilterBackspace => {
            if let Some(text) = &mut state.filter_input {
                text.pop();
                state.relayout();
            }
        }
        Action::FilterApply => {
            if let Some(text) = state.filter_input.take() {
                state.filter = text.to_lowercase();
                state.relayout();
            }
        }
        Action::FilterCancel => {
            state.filter_input = None;
            state.relayout();
        }
        Action::CycleSort => {
            state.sort = state.sort.next();
            state.relayout();
            state.move_selection(0);
        }
        Action::Up => state.move_selection(state.selected.saturating_sub(1)),
        Action::Down => state.move_selection(state.selected + 1),
        Action::PageUp => state.move_selection(state.selected.saturating_sub(PAGE)),
        Action::PageDown => state.move_selection(state.selected + PAGE),
        Action::Home => state.move_selection(0),
        Action::End => state.move_selection(usize::MAX),
        Action::Open => {
            if state.selected_row().is_some() {
                state.view = View::Detail;
            }
        }
        Action::Back => {
            if state.help {
                state.help = false;
            } else if state.view == View::Detail {
                state.view = View::Table;
            } else if !state.filter.is_empty() {
                state.filter.clear();
                state.relayout();
            }
        }
    }
}
