//! The app's state and its one way to change: `update(&mut State, Action)`.
//! Pure: time arrives in `Action::Tick`, events in `Action::Events`; nothing
//! here reads a clock, a file or the terminal.

use std::collections::VecDeque;

use collector::diagnose::{self, Diagnosis};
use collector::ingest::Event;
use collector::stitch::{stitch, Request};

use crate::rows::{self, GpuReading, RouteItl, Row, RowKey, TtftWindow};

const SECOND_NS: u64 = 1_000_000_000;
/// Width of the TTFT-over-time windows.
pub const TTFT_WINDOW_NS: u64 = SECOND_NS;

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

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Events decoded since the last batch (live) or due by now (replay).
    Events(Vec<Event>),
    /// `clock_ns`: now on the events' clock (CLOCK_MONOTONIC, or the replay's
    /// position); `wall_ns`: now on any steady clock, for the re-stitch rate.
    Tick {
        clock_ns: u64,
        wall_ns: u64,
    },
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
    /// History kept and re-stitched (ns of event time).
    pub window_ns: u64,
    /// Oldest events go first past this many, whatever the window.
    pub max_events: usize,
    events: VecDeque<Event>,
    pub events_total: u64,
    pub events_per_s: u64,
    /// The window was cut short by `max_events`.
    pub window_capped: bool,
    /// Event time of the latest tick and of the last re-stitch.
    pub clock_ns: u64,
    pub stitched_clock_ns: u64,
    last_stitch_wall_ns: Option<u64>,
    dirty: bool,
    /// From the last re-stitch.
    pub requests: Vec<Request>,
    pub rows: Vec<Row>,
    pub routes: Vec<RouteItl>,
    pub ttft_windows: Vec<TtftWindow>,
    pub gpu: Vec<GpuReading>,
    pub gpu_steps: usize,
    pub unparsed_ios: u64,
    /// The window's diagnoses, the largest saving first.
    pub diagnoses: Vec<Diagnosis>,
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
    pub fn new(meta: Meta, window_ns: u64) -> State {
        State {
            clock_ns: meta.start_ns,
            stitched_clock_ns: meta.start_ns,
            meta,
            window_ns,
            max_events: 1_000_000,
            events: VecDeque::new(),
            events_total: 0,
            events_per_s: 0,
            window_capped: false,
            last_stitch_wall_ns: None,
            dirty: false,
            requests: Vec::new(),
            rows: Vec::new(),
            routes: Vec::new(),
            ttft_windows: Vec::new(),
            gpu: Vec::new(),
            gpu_steps: 0,
            unparsed_ios: 0,
            diagnoses: Vec::new(),
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

    pub fn events_held(&self) -> usize {
        self.events.len()
    }

    pub fn selected_row(&self) -> Option<&Row> {
        self.visible.get(self.selected).map(|&i| &self.rows[i])
    }

    pub fn selected_request(&self) -> Option<&Request> {
        self.selected_row().map(|r| &self.requests[r.index])
    }

    /// The diagnoses that cite request `id` among their evidence.
    pub fn diagnoses_citing(&self, id: usize) -> impl Iterator<Item = &Diagnosis> {
        self.diagnoses
            .iter()
            .filter(move |d| d.evidence.request_ids.contains(&id))
    }

    /// The filter in effect: what is being typed, else the applied one.
    pub fn active_filter(&self) -> &str {
        self.filter_input.as_deref().unwrap_or(&self.filter)
    }

    fn ingest(&mut self, batch: Vec<Event>) {
        self.events_total += batch.len() as u64;
        self.dirty |= !batch.is_empty();
        self.events.extend(batch);
        while self.events.len() > self.max_events {
            self.events.pop_front();
            self.window_capped = true;
        }
    }

    fn evict(&mut self) {
        let cutoff = self.clock_ns.saturating_sub(self.window_ns);
        while self.events.front().is_some_and(|e| e.ts_ns < cutoff) {
            self.events.pop_front();
            self.dirty = true;
        }
    }

    /// Re-stitch the window and derive everything the screen shows.
    fn restitch(&mut self) {
        // In place: cloning a window of events every second cost more than stitching it.
        let dropped = self.meta.dropped.is_some_and(|d| d > 0);
        let events = self.events.make_contiguous();
        let timeline = stitch(events, dropped);
        // Here, not per frame: the rules read the whole window.
        let nvml = diagnose::nvml_samples(events);
        self.diagnoses = diagnose::diagnose(&diagnose::Input::new(&timeline, &nvml));
        self.rows = timeline
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| Row::from_request(i, r))
            .collect();
        self.routes = rows::itl_by_route(&timeline.requests);
        self.ttft_windows = rows::ttft_over_time(&self.rows, TTFT_WINDOW_NS);
        self.gpu = rows::latest_gpu(self.events.iter());
        self.gpu_steps = timeline.steps.len();
        self.unparsed_ios = timeline.unparsed_ios;
        self.requests = timeline.requests;
        let since = self.clock_ns.saturating_sub(SECOND_NS);
        self.events_per_s = self
            .events
            .iter()
            .rev()
            .take_while(|e| e.ts_ns + SECOND_NS > since)
            .filter(|e| e.ts_ns > since && e.ts_ns <= self.clock_ns)
            .count() as u64;
        self.stitched_clock_ns = self.clock_ns;
        self.dirty = false;
        self.relayout();
    }

    /// Filter and sort the rows again, keeping the selected request selected.
    fn relayout(&mut self) {
        let needle = self.active_filter().to_lowercase();
        let mut visible: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].matches(&needle))
            .collect();
        let rows = &self.rows;
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
        let found = self
            .selected_key
            .as_ref()
            .and_then(|k| self.visible.iter().position(|&i| &self.rows[i].key == k));
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
        Action::Events(batch) => state.ingest(batch),
        Action::Tick { clock_ns, wall_ns } => {
            // Paused: the screen holds still; events keep arriving underneath.
            if state.paused {
                return;
            }
            state.clock_ns = state.clock_ns.max(clock_ns);
            state.evict();
            let due = state
                .last_stitch_wall_ns
                .is_none_or(|last| wall_ns.saturating_sub(last) >= SECOND_NS);
            if state.dirty && due {
                state.restitch();
                state.last_stitch_wall_ns = Some(wall_ns);
            }
        }
        Action::SourceEnded(why) => {
            state.ended = Some(why);
            // Show everything now rather than at the next second.
            state.last_stitch_wall_ns = None;
        }
        Action::Note(line) => state.note = Some(line),
        Action::Quit => state.quit = true,
        Action::ToggleHelp => state.help = !state.help,
        Action::TogglePause => {
            state.paused = !state.paused;
            if !state.paused {
                state.last_stitch_wall_ns = None;
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
