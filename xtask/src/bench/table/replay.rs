//! The replay rows of the table: `report` and `export` on the load's recording, timed
//! at three moments of the table (`Replay`), with the recording's size and `report
//! --json`'s bytes per request.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Result;

use super::{Row, Rows};
use crate::bench::agent::report_counts;
use crate::bench::child::number_before;
use crate::bench::scaling::{self, Cores, Timed};

/// `report`'s one-core runs and `export`'s runs at each moment of the table (see
/// `Replay`).
const RUNS_AT_A_MOMENT: usize = 3;

/// `report` on the load's recording: on one core (the target's terms: its reading
/// thread shares that core) three runs at each of three moments of the table (after the
/// load rounds, after `top`, after the scaling rounds); on every core (what a user's
/// machine gives it) three runs at the first. This host's speed moved by a fifth within
/// minutes (the same binary on the same file: 108 ms, then 130 ms twenty minutes later),
/// so three runs in a row measured the moment as much as the code; the row gives the
/// median of the nine and their range, and the time of a fixed task of no code of ours
/// before each moment (`reference`), to tell the host's speed from the code's. `export`
/// likewise, on every core, after each moment's `report` runs (three in a row at one
/// moment read 1,887k events/s in a table whose code had read 2,298k in the table
/// before).
pub(super) struct Replay {
    bin: PathBuf,
    recording: PathBuf,
    events: f64,
    one_core: Vec<Timed>,
    all: Timed,
    pub(super) row_index: usize,
    exports: Vec<Timed>,
    trace: TraceSizes,
    pub(super) export_row_index: usize,
    /// The fixed task's time on CPU 0 at each moment (`reference`): the host's speed.
    reference: Vec<Duration>,
}

/// What `export` said of its trace (the same every run: one recording, one build).
#[derive(Clone, Copy, Debug, Default)]
struct TraceSizes {
    token_events: f64,
    /// A token instant's bytes before compression.
    instant: f64,
    /// The trace's bytes, deflated, and before.
    bytes: f64,
    uncompressed: f64,
}

impl Replay {
    /// The fixed reference task, then `RUNS_AT_A_MOMENT` more runs of `report` on one
    /// core, then of `export`.
    pub(super) fn sample(&mut self) -> Result<()> {
        self.reference
            .push(crate::bench::reference::time_on_cpu0()?);
        for _ in 0..RUNS_AT_A_MOMENT {
            let run = scaling::timed_report(&self.bin, &self.recording, Stdio::null(), Cores::One)?;
            self.one_core.push(run);
        }
        for _ in 0..RUNS_AT_A_MOMENT {
            let (run, trace) = export_once(&self.bin, &self.recording)?;
            self.exports.push(run);
            self.trace = trace;
        }
        Ok(())
    }

    pub(super) fn export_row(&self) -> Row {
        let s = Sampled::of(&self.exports, self.events);
        let t = self.trace;
        let per_token_event = t.bytes / t.token_events;
        Row::new(
            "`export`",
            format!(
                "{:.0}k events/s on every core ({}; reading and deflating on threads of their own; {:.0}k events per CPU second), {per_token_event:.1} B of trace per token event (deflated; {:.1} B before, its instant {:.1} B), {:.0} MiB peak RSS",
                s.rate / 1e3,
                s.spread,
                self.events / s.median.cpu.as_secs_f64() / 1e3,
                t.uncompressed / t.token_events,
                t.instant,
                s.rss_kib as f64 / 1024.0
            ),
            ">= 2 M events/s, <= 16 B per token event, <= 100 MB",
            Some(s.rate >= 2e6 && per_token_event <= 16.0 && s.rss_kib * 1024 <= 100_000_000),
        )
    }

    pub(super) fn row(&self) -> Row {
        let s = Sampled::of(&self.one_core, self.events);
        Row::new(
            "`report` replay",
            format!(
                "on one core {:.0}k events/s ({:.0} events; {}); on every core (reading on a thread of its own): {:.0}k events/s ({:.2} s of CPU); {:.0} MiB peak RSS; the host's speed, a fixed task on CPU 0 before each moment's runs: {}",
                s.rate / 1e3,
                self.events,
                s.spread,
                self.events / self.all.wall.as_secs_f64() / 1e3,
                self.all.cpu.as_secs_f64(),
                s.rss_kib.max(self.all.rss_kib) as f64 / 1024.0,
                self.reference
                    .iter()
                    .map(|d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ">= 3 M events/s on one core",
            Some(s.rate >= 3e6),
        )
    }
}

/// Runs taken at the table's moments (`Replay::sample`), summed up for a row.
struct Sampled {
    /// The run of median wall time, and its rate in events/s.
    median: Timed,
    rate: f64,
    /// "the median of N runs at M moments of the table, FASTk-SLOWk; by moment Ak, Bk, Ck"
    spread: String,
    /// The largest peak RSS of them.
    rss_kib: i64,
}

impl Sampled {
    fn of(runs: &[Timed], events: f64) -> Sampled {
        let rate = |t: &Timed| events / t.wall.as_secs_f64();
        let middle = median(runs);
        let (fastest, slowest) = (runs.iter().min(), runs.iter().max());
        // Each moment's own median (`runs` are in the order taken): the host's speed
        // moved by 15-25% within minutes, and this shows whether a row moved with it.
        let moments: Vec<String> = runs
            .chunks(RUNS_AT_A_MOMENT)
            .map(|moment| format!("{:.0}k", rate(&median(moment)) / 1e3))
            .collect();
        Sampled {
            median: middle,
            rate: rate(&middle),
            spread: format!(
                "the median of {} runs at {} moments of the table, {:.0}k-{:.0}k; by moment {}",
                runs.len(),
                runs.len() / RUNS_AT_A_MOMENT,
                slowest.map_or(0.0, rate) / 1e3,
                fastest.map_or(0.0, rate) / 1e3,
                moments.join(", ")
            ),
            rss_kib: runs.iter().map(|t| t.rss_kib).max().unwrap_or(0),
        }
    }
}

/// The run of median wall time (the later of the two middle ones for an even count).
fn median(runs: &[Timed]) -> Timed {
    let mut sorted = runs.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

/// `report` and `export` on the load's recording, and its size; `report`'s one-core
/// runs go on later (`Replay::sample`).
pub(super) fn files(bin: &Path, recording: &Path, rows: &mut Rows) -> Result<Replay> {
    println!("table: replay and export of the last round's recording...");
    let counts = report_counts(bin, recording)?;
    let bytes = std::fs::metadata(recording)?.len().saturating_sub(4096) as f64;
    let per_token = bytes / counts.tokens;
    rows.push(Row::new(
        "recording size",
        format!(
            "{:.1} B per event, {:.1} events per token: {per_token:.1} B per token",
            bytes / counts.events,
            counts.events / counts.tokens
        ),
        "<= 48 B per token",
        Some(per_token <= 48.0),
    ));
    // The every-core runs write their JSON here: its size is read from the last one, not
    // from another run.
    let output = recording.with_extension("out");
    let to_output = || -> Result<Stdio> { Ok(std::fs::File::create(&output)?.into()) };
    let all = median_of_three(|| scaling::timed_report(bin, recording, to_output()?, Cores::All))?;
    let mut replay = Replay {
        bin: bin.to_path_buf(),
        recording: recording.to_path_buf(),
        events: counts.events,
        one_core: Vec::new(),
        all,
        row_index: rows.0.len(),
        exports: Vec::new(),
        trace: TraceSizes::default(),
        export_row_index: 0,
        reference: Vec::new(),
    };
    replay.sample()?;
    rows.push(replay.row());
    let per_request = std::fs::metadata(&output)?.len() as f64 / counts.requests;
    rows.push(Row::new(
        "`report --json`",
        format!(
            "{:.0} B per request ({:.0} requests)",
            per_request, counts.requests
        ),
        "<= 2 KB per request",
        Some(per_request <= 2048.0),
    ));
    let _ = std::fs::remove_file(&output);
    replay.export_row_index = rows.0.len();
    rows.push(replay.export_row());
    Ok(replay)
}

/// One `export` of `recording` (to a trace beside it, removed after), and what it said
/// of the trace.
fn export_once(bin: &Path, recording: &Path) -> Result<(Timed, TraceSizes)> {
    let trace = recording.with_extension("pftrace");
    let said = recording.with_extension("export-said");
    let run = scaling::timed(
        bin,
        &[
            "export".as_ref(),
            recording.as_os_str(),
            "-o".as_ref(),
            trace.as_os_str(),
        ],
        Stdio::null(),
        std::fs::File::create(&said)?.into(),
        Cores::All,
    );
    let _ = std::fs::remove_file(&trace);
    let text = std::fs::read_to_string(&said);
    let _ = std::fs::remove_file(&said);
    let (run, text) = (run?, text?);
    // "FILE: N requests, T token events (B B each before compression), ...; P packets,
    // B bytes (deflated in N bundles from U bytes), ..."
    let (Some(token_events), Some(instant), Some(bytes), Some(uncompressed)) = (
        number_before(&text, " token events"),
        number_before(&text, " B each"),
        number_before(&text, " bytes"),
        number_before(&text, " bytes)"),
    ) else {
        anyhow::bail!(
            "no token event or byte count from tokenscope export: {}",
            text.trim()
        );
    };
    let sizes = TraceSizes {
        token_events,
        instant,
        bytes,
        uncompressed,
    };
    Ok((run, sizes))
}

/// The run of median wall time of three, with the largest peak RSS.
fn median_of_three(mut run: impl FnMut() -> Result<Timed>) -> Result<Timed> {
    let mut runs = (0..3).map(|_| run()).collect::<Result<Vec<_>>>()?;
    runs.sort();
    let rss_kib = runs.iter().map(|r| r.rss_kib).max().unwrap_or(0);
    Ok(Timed { rss_kib, ..runs[1] })
}
