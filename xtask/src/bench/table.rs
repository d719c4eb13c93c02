//! `cargo xtask bench` (alone: `bench table`): issue 17's table, every row measured in
//! this run on one load, printed and written to BENCHMARKS.md with the machine's cores
//! and kernel. The load: the lab engine behind the lab's tuned nginx (HTTP/1.1
//! keep-alive both sides, buffering off), 64 closed-loop streams, about 4k tokens/s.
//!
//! - Served tokens/s with `tokenscope record` attached, as a ratio of without: rounds
//!   alternate without/with (the order flips each round, so drift cancels); ratio of the
//!   sums.
//! - `record`'s CPU (utime + stime from /proc over its rounds) per 1k tokens/s served,
//!   its RSS while recording (VmRSS) and its peak (VmHWM), drops, and the
//!   last round's recording: bytes per token.
//! - On that recording: `report --json` (events/s on one core; peak RSS, bytes of JSON
//!   per request) and `export` (events/s, bytes of trace per token event, peak RSS),
//!   each rate the median of runs at three moments of the table (see `replay::Replay`).
//! - `tokenscope top` live on the same load (in a tmux pane, see `top`): CPU and RSS
//!   once its 60 s window is full.
//! - Scaling: 64, 256 and 1,000 streams with `record` attached: CPU per 1k tokens/s and
//!   drops (default settings). Replay of a recording replicated 1x/10x/100x (`scaling`).
//!
//! Every figure is a rate or ratio from this run; nothing here is a test assertion.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::child::{cpu_seconds, load, rss_kib, Chain, Served};
use super::Recorder;

mod replay;

use replay::files;

const LOAD_SECONDS: u64 = 20;
/// top is measured over a minute: its findings (at most 0.5% of a core, see tui's
/// `findings::COST_FACTOR`) are made every 1-9 s at this load, 10-45 ms each as its
/// window fills, so a short run reads more or less as makings fall inside it (when they
/// were capped at 2% and cost 0.3-1.2 s, a 20 s run read 10.0-15.1% for one binary).
const TOP_MEASURED: Duration = Duration::from_secs(60);
/// Load rounds, each one without and one with `record` (the order flips each round).
/// The served ratio is read over all of them: the lab engine's step period moved
/// 15.91-16.03 ms from one 20 s run to the next whether or not `record` was attached
/// (a 0.4% swing; its step log, three pairs), so three pairs read 99.44-99.86% of one
/// build across tables.
const ROUNDS: usize = 5;
const STREAMS: u32 = 64;
const SCALING_STREAMS: &[u32] = &[64, 256, 1000];

/// The engine: 64 sequences per step, a step short enough for ~4k tokens/s with 64
/// streams decoding, a token budget that never holds a decode back.
const ENGINE: &[&str] = &[
    "--max-num-seqs",
    "64",
    "--step-overhead-ms",
    "6",
    "--decode-seq-ms",
    "0.1",
    "--prefill-token-ms",
    "0.1",
    "--max-batched-tokens",
    "512",
];

/// The load, past `--concurrency`: chat completions, 64 tokens each, short prompts.
const LOAD: &[&str] = &["--chat", "--max-tokens", "64", "--prompt-tokens", "32"];

/// One row: what, measured, target, and whether the target is met (None: no target).
pub(super) struct Row {
    what: String,
    measured: String,
    target: &'static str,
    met: Option<bool>,
}

impl Row {
    pub(super) fn new(
        what: impl Into<String>,
        measured: String,
        target: &'static str,
        met: Option<bool>,
    ) -> Row {
        Row {
            what: what.into(),
            measured,
            target,
            met,
        }
    }
}

/// The rows so far; each is printed as it is measured, so a bench that fails half-way
/// still shows what it had.
#[derive(Default)]
struct Rows(Vec<Row>);

impl Rows {
    fn push(&mut self, r: Row) {
        let met = match r.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "no target",
        };
        println!("  {}: {} [{}: {met}]", r.what, r.measured, r.target);
        self.0.push(r);
    }

    fn extend(&mut self, rows: Vec<Row>) {
        rows.into_iter().for_each(|r| self.push(r));
    }

    /// Row `i` measured again (printed again, in its place in the table).
    fn set(&mut self, i: usize, r: Row) {
        println!("  (updated) {}: {} [{}]", r.what, r.measured, r.target);
        self.0[i] = r;
    }
}

struct Lab {
    lab: PathBuf,
    url: String,
    ports: [u16; 2],
    _chain: Chain,
}

impl Lab {
    fn start() -> Result<Lab> {
        let lab = super::lab();
        let chain = Chain::start(&lab, ENGINE, "--tuned-plain")?;
        Ok(Lab {
            lab,
            url: format!("http://127.0.0.1:{}/v1/chat/completions", chain.proxy_port),
            ports: [chain.engine_port, chain.proxy_port],
            _chain: chain,
        })
    }

    /// What `streams` closed-loop streams served over LOAD_SECONDS.
    fn serve(&self, streams: u32) -> Result<Served> {
        let streams = streams.to_string();
        load(
            &self.lab,
            &self.url,
            Duration::from_secs(LOAD_SECONDS),
            &load_args(&streams),
        )
    }

    /// Tokens/s served by `streams` streams, none of whose requests may fail.
    fn tokens_per_s(&self, streams: u32) -> Result<f64> {
        let served = self.serve(streams)?;
        anyhow::ensure!(
            served.failed == 0,
            "{} of the load's requests failed ({streams} streams)",
            served.failed
        );
        Ok(served.tokens_per_s)
    }
}

/// The lab bench's arguments past --url and --duration: `streams` workers, the LOAD.
fn load_args(streams: &str) -> Vec<&str> {
    let mut args = vec!["--concurrency", streams];
    args.extend_from_slice(LOAD);
    args
}

/// A load run with `record` attached.
struct Recorded {
    tokens_per_s: f64,
    failed: u64,
    cpu_seconds: f64,
    wall: Duration,
    /// VmRSS at the end of the load and VmHWM (its peak), KiB.
    rss_kib: u64,
    peak_rss_kib: u64,
    dropped: u64,
    delivered: u64,
}

fn recorded(bin: &Path, lab: &Lab, streams: u32, out: &Path) -> Result<Recorded> {
    let ports = lab.ports.map(|p| p.to_string());
    let child = Recorder::spawn(
        bin,
        &[
            "--nvml".as_ref(),
            "off".as_ref(),
            "--port".as_ref(),
            ports[0].as_ref(),
            "--port".as_ref(),
            ports[1].as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
    )?;
    let before = cpu_seconds(child.pid())?;
    let started = Instant::now();
    let served = lab.serve(streams)?;
    let wall = started.elapsed();
    let cpu = cpu_seconds(child.pid())? - before;
    let (rss, peak) = rss_kib(child.pid())?;
    let summary = child.stop()?;
    Ok(Recorded {
        tokens_per_s: served.tokens_per_s,
        failed: served.failed,
        cpu_seconds: cpu,
        wall,
        rss_kib: rss,
        peak_rss_kib: peak,
        dropped: summary.dropped,
        delivered: summary.delivered,
    })
}

pub(super) fn run(bin: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tokenscope-bench-table-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(bin, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let rows = result?;
    let text = render(&rows)?;
    print!("{text}");
    let path = crate::root().join("BENCHMARKS.md");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    println!("written to {}", path.display());
    Ok(())
}

fn measure(bin: &Path, dir: &Path) -> Result<Vec<Row>> {
    let mut rows = Rows::default();
    let lab = Lab::start()?;
    println!("table: {STREAMS} streams through the tuned nginx, {LOAD_SECONDS} s per run, {ROUNDS} rounds without/with `tokenscope record`...");
    // Warm-up: nginx's upstream connections, the engine's prefix cache.
    lab.tokens_per_s(STREAMS)?;
    let recording = dir.join("load.tsrec");
    let (mut without, mut with) = (0.0, 0.0);
    let mut runs = Vec::new();
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            without += lab.tokens_per_s(STREAMS)?;
        }
        let _ = std::fs::remove_file(&recording);
        let r = recorded(bin, &lab, STREAMS, &recording)?;
        anyhow::ensure!(
            r.failed == 0,
            "{} of the load's requests failed with `record` attached",
            r.failed
        );
        with += r.tokens_per_s;
        runs.push(r);
        if round % 2 == 1 {
            without += lab.tokens_per_s(STREAMS)?;
        }
    }
    let rounds = ROUNDS as f64;
    let ratio = with / without;
    rows.push(Row::new(
        "served tokens/s with `record` attached",
        format!(
            "{:.2}% of without ({:.0} vs {:.0} tok/s)",
            ratio * 100.0,
            with / rounds,
            without / rounds
        ),
        ">= 99.5% (same run)",
        Some(ratio >= 0.995),
    ));
    let cpu: f64 = runs.iter().map(|r| r.cpu_seconds).sum::<f64>()
        / runs.iter().map(|r| r.wall.as_secs_f64()).sum::<f64>();
    let per_1k = cpu * 100.0 / (with / rounds / 1000.0);
    rows.push(Row::new(
        "`record` CPU",
        format!(
            "{:.2}% of a core at {:.0} tok/s ({per_1k:.2}% per 1k tok/s)",
            cpu * 100.0,
            with / rounds
        ),
        "<= 0.5% of a core per 1k tok/s",
        Some(per_1k <= 0.5),
    ));
    // Two rows: what it holds while it records, and its peak. The peak came at probe
    // load (aya parsing the kernel's BTF: 31.2 MB) until that load's large blocks were
    // mapped on their own (see collector's probes::LoadingAllocations).
    let rss = runs.iter().map(|r| r.rss_kib).max().unwrap_or(0);
    rows.push(Row::new(
        "`record` RSS while recording (VmRSS at the load's end)",
        format!("{:.1} MiB", rss as f64 / 1024.0),
        "<= 32 MB",
        Some(rss * 1024 <= 32_000_000),
    ));
    let peak = runs.iter().map(|r| r.peak_rss_kib).max().unwrap_or(0);
    rows.push(Row::new(
        "`record` RSS peak (VmHWM)",
        format!("{:.1} MiB", peak as f64 / 1024.0),
        "<= 32 MB",
        Some(peak * 1024 <= 32_000_000),
    ));
    let dropped: u64 = runs.iter().map(|r| r.dropped).sum();
    rows.push(Row::new(
        "events dropped by `record`",
        format!(
            "{dropped} of {}",
            runs.iter().map(|r| r.delivered + r.dropped).sum::<u64>()
        ),
        "0",
        Some(dropped == 0),
    ));
    let mut replay = files(bin, &recording, &mut rows)?;
    rows.push(top_row(bin, &lab)?);
    replay.sample()?;
    drop(lab);

    let lab = Lab::start()?;
    lab.tokens_per_s(STREAMS)?;
    let mut scaling = Vec::new();
    for &streams in SCALING_STREAMS {
        println!("table: scaling, {streams} streams with `record` attached...");
        let out = dir.join("scaling.tsrec");
        let r = recorded(bin, &lab, streams, &out)?;
        let _ = std::fs::remove_file(&out);
        let per_1k = r.cpu_seconds / r.wall.as_secs_f64() * 100.0 / (r.tokens_per_s / 1000.0);
        scaling.push((streams, per_1k, r));
    }
    let first = scaling.first().map_or(0.0, |s| s.1);
    for (streams, per_1k, r) in scaling {
        rows.push(Row::new(
            format!("scaling: {streams} streams, `record` attached"),
            format!(
                "{:.0} tok/s ({} requests failed), {per_1k:.2}% of a core per 1k tok/s ({:.2}x {}), {:.1} MiB peak, {} of {} events dropped",
                r.tokens_per_s,
                r.failed,
                per_1k / first,
                SCALING_STREAMS[0],
                r.peak_rss_kib as f64 / 1024.0,
                r.dropped,
                r.delivered + r.dropped
            ),
            "CPU per 1k tok/s within 1.5x of 64 streams, 0 dropped, 0 failed",
            Some(r.dropped == 0 && r.failed == 0 && per_1k <= first * 1.5),
        ));
    }
    drop(lab);
    replay.sample()?;
    rows.set(replay.row_index, replay.row());
    rows.set(replay.export_row_index, replay.export_row());
    rows.extend(super::scaling::rows(bin)?);
    Ok(rows.0)
}

/// `tokenscope top` live on the lab's load, its window full (the `top` row).
fn top_row(bin: &Path, lab: &Lab) -> Result<Row> {
    println!("table: `tokenscope top` live on the same load...");
    let top = super::top::measure(
        bin,
        &lab.lab,
        &lab.url,
        &lab.ports,
        &load_args(&STREAMS.to_string()),
        TOP_MEASURED,
    )?;
    let per_1k = top.cpu_pct / (top.tokens_per_s / 1000.0);
    Ok(Row::new(
        "`top` live (its 60 s window full; measured over 60 s)",
        format!(
            "{:.1}% of a core at {:.0} tok/s ({per_1k:.2}% per 1k tok/s), {:.0} MiB RSS at the end, {:.0} MiB peak",
            top.cpu_pct,
            top.tokens_per_s,
            top.rss_kib as f64 / 1024.0,
            top.peak_kib as f64 / 1024.0
        ),
        "<= 3% of a core, <= 64 MB",
        Some(top.cpu_pct <= 3.0 && top.peak_kib * 1024 <= 64_000_000),
    ))
}

/// The `top` row alone (`cargo xtask bench top [BIN..]`): printed, BENCHMARKS.md
/// untouched; with other binaries, each one's row after this build's on the same lab
/// (a change's before and after in one run).
pub(super) fn run_top(bin: &Path, others: &[PathBuf]) -> Result<()> {
    for other in others {
        anyhow::ensure!(other.is_file(), "{}: no such binary", other.display());
    }
    let lab = Lab::start()?;
    lab.tokens_per_s(STREAMS)?;
    let mut rows = Vec::new();
    for b in std::iter::once(bin).chain(others.iter().map(PathBuf::as_path)) {
        let mut row = top_row(b, &lab)?;
        if !others.is_empty() {
            row.what = format!("{} ({})", row.what, b.display());
        }
        rows.push(row);
    }
    print!("{}", render(&rows)?);
    Ok(())
}

fn render(rows: &[Row]) -> Result<String> {
    let mut t = String::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(crate::root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    writeln!(t, "# Benchmarks")?;
    writeln!(t)?;
    writeln!(
        t,
        "Written by `cargo xtask bench` ({date}, commit {commit}) on {cores} cores ({cpu}), kernel {}.",
        kernel.trim()
    )?;
    writeln!(
        t,
        "Every figure is a rate or a ratio measured in that one run; the profiler as `cargo xtask dist` builds it (lto, one codegen unit). Load: the lab \
         engine behind the lab's tuned nginx (HTTP/1.1 keep-alive both sides, buffering off), \
         {STREAMS} closed-loop streams of chat completions (64 tokens each), {LOAD_SECONDS} s per \
         run, {ROUNDS} rounds alternating without and with `tokenscope record`. `report` and \
         `export` run on the last round's recording. See xtask/src/bench/table.rs."
    )?;
    writeln!(t)?;
    writeln!(t, "| what | measured | target | met |")?;
    writeln!(t, "|---|---|---|---|")?;
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        writeln!(t, "| {} | {} | {} | {met} |", r.what, r.measured, r.target)?;
    }
    Ok(t)
}
