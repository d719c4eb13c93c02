//! `cargo xtask bench scaling`: `tokenscope report` and `tokenscope export` on one
//! lab recording replicated 1x, 10x and 100x (`tokenscope-lab replicate`: each copy
//! later in time, on its own sockets). Per-event cost against 1x says whether replay
//! time grows linearly; peak RSS whether memory stays flat once requests end. Both
//! cut the replay into windows once nothing in flight began in them (the report sums
//! each up and writes its requests aside; the export writes it), so their memory
//! follows what is in flight, not the recording's length. Printed rows, not assertions; the one assertion is that N copies give
//! N times the requests (else the figures compare different work).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

/// The committed recording: deterministic, and already on every checkout.
const FIXTURE: &str = "tests/fixtures/diagnose/tuned-plain.tsrec.gz";
const FACTORS: &[u32] = &[1, 10, 100];
/// Timed runs per factor (the median counts): 1x is tens of milliseconds.
const ROUNDS: usize = 3;

pub(super) fn run(bin: &Path) -> Result<()> {
    print_rows(&measured(bin)?);
    Ok(())
}

/// The table's rows: per-event cost and peak RSS of each factor against 1x.
pub(super) fn rows(bin: &Path) -> Result<Vec<super::table::Row>> {
    let rows = measured(bin)?;
    print_rows(&rows);
    let one = &rows[0];
    Ok(rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let report = per_event(r.wall, r) / per_event(one.wall, one);
            let export = per_event(r.export_wall, r) / per_event(one.export_wall, one);
            // Against the factor before (a recording 10x shorter): memory that followed the
            // recording's length would be ~10x; the 1x run is mostly the process itself.
            let before = &rows[i.saturating_sub(1)];
            let rss = r.max_rss_kib as f64 / before.max_rss_kib.max(1) as f64;
            let export_rss = r.export_rss_kib as f64 / before.export_rss_kib.max(1) as f64;
            super::table::Row::new(
                format!("replay of a recording x{} ({} events)", r.factor, r.events),
                format!(
                    "`report` {:.0}k events/s, {report:.2}x the per-event time of 1x, {} MiB peak; `export` {export:.2}x, {} MiB peak",
                    r.events as f64 / r.wall.as_secs_f64() / 1e3,
                    r.max_rss_kib / 1024,
                    r.export_rss_kib / 1024
                ),
                "linear: per-event time within 1.5x of 1x; peak RSS within 2x of the factor before (10x shorter)",
                (r.factor > 1).then_some(
                    report <= 1.5 && export <= 1.5 && rss <= 2.0 && export_rss <= 2.0,
                ),
            )
        })
        .collect())
}

fn measured(bin: &Path) -> Result<Vec<Row>> {
    let dir = std::env::temp_dir().join(format!("tokenscope-bench-scaling-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = measure(bin, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

struct Row {
    factor: u32,
    events: u64,
    requests: u64,
    wall: Duration,
    max_rss_kib: i64,
    export_wall: Duration,
    export_rss_kib: i64,
}

fn measure(bin: &Path, dir: &Path) -> Result<Vec<Row>> {
    let original = dir.join("original.tsrec");
    crate::run(
        Command::new("sh")
            .arg("-c")
            .arg("gzip -dc \"$0\" > \"$1\"")
            .arg(crate::root().join(FIXTURE))
            .arg(&original),
    )?;
    let mut rows: Vec<Row> = Vec::new();
    for &factor in FACTORS {
        let replica = dir.join(format!("x{factor}.tsrec"));
        let events = replicate(&original, factor, &replica)?;
        let mut runs = (0..ROUNDS)
            .map(|_| timed_report(bin, &replica, Stdio::null(), Cores::All))
            .collect::<Result<Vec<_>>>()?;
        runs.sort();
        let wall = runs[ROUNDS / 2].wall;
        let max_rss_kib = runs.iter().map(|r| r.rss_kib).max().unwrap_or(0);
        let trace = dir.join(format!("x{factor}.pftrace"));
        let mut exports = (0..ROUNDS)
            .map(|_| {
                timed(
                    bin,
                    &[
                        "export".as_ref(),
                        replica.as_os_str(),
                        "-o".as_ref(),
                        trace.as_os_str(),
                    ],
                    Stdio::null(),
                    Stdio::null(),
                    Cores::All,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let _ = std::fs::remove_file(&trace);
        exports.sort();
        let export_wall = exports[ROUNDS / 2].wall;
        let export_rss_kib = exports.iter().map(|r| r.rss_kib).max().unwrap_or(0);
        // A second, untimed run: the text report's first line (xtask parses no JSON).
        let requests = super::agent::report_counts(bin, &replica)?.requests as u64;
        let _ = std::fs::remove_file(&replica);
        match rows.first() {
            None => ensure!(requests > 0, "{FIXTURE} reported no requests: nothing to scale"),
            Some(one) => ensure!(
                requests == one.requests * u64::from(factor),
                "{factor}x the recording reported {requests} requests, not {factor} x {}: copies stitched into each other or were lost",
                one.requests
            ),
        }
        rows.push(Row {
            factor,
            events,
            requests,
            wall,
            max_rss_kib,
            export_wall,
            export_rss_kib,
        });
    }
    Ok(rows)
}

fn per_event(wall: Duration, r: &Row) -> f64 {
    wall.as_secs_f64() / r.events as f64
}

fn print_rows(rows: &[Row]) {
    println!(
        "replay scaling: `tokenscope report --json` (to /dev/null) and `tokenscope export` (60 s windows) on {FIXTURE} replicated, each copy later in time on its own sockets; median of {ROUNDS} runs (process start included)"
    );
    println!("  factor     events  requests | report: wall     events/s  per-event vs 1x  peak RSS | export: wall  per-event vs 1x  peak RSS");
    let one = &rows[0];
    for r in rows {
        println!(
            "  {:>5}x {:>10} {:>9} | {:>12.2?} {:>12.0}  {:>14.2}x  {:>4} MiB | {:>12.2?}  {:>14.2}x  {:>4} MiB",
            r.factor,
            r.events,
            r.requests,
            r.wall,
            r.events as f64 / r.wall.as_secs_f64(),
            per_event(r.wall, r) / per_event(one.wall, one),
            r.max_rss_kib / 1024,
            r.export_wall,
            per_event(r.export_wall, r) / per_event(one.export_wall, one),
            r.export_rss_kib / 1024
        );
    }
}

/// `tokenscope-lab replicate`; the events it wrote.
fn replicate(input: &Path, factor: u32, output: &Path) -> Result<u64> {
    let out = Command::new(super::lab())
        .arg("replicate")
        .arg(input)
        .args(["--times", &factor.to_string(), "-o"])
        .arg(output)
        .output()
        .context("start tokenscope-lab replicate")?;
    let said = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("tokenscope-lab replicate: {}", said.trim());
    }
    // "replicate: N x SPAN ns -> EVENTS events in FILE"
    said.split("-> ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no event count in {:?}", said.trim()))
}

/// `tokenscope report --json FILE > stdout`, timed.
pub(super) fn timed_report(
    bin: &Path,
    recording: &Path,
    stdout: Stdio,
    cores: Cores,
) -> Result<Timed> {
    timed(
        bin,
        &["report".as_ref(), recording.as_os_str(), "--json".as_ref()],
        stdout,
        Stdio::inherit(),
        cores,
    )
}

/// Keeps the calling thread (or a forked child before exec) on CPU 0 alone.
pub(super) fn pin_to_cpu0() -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; sched_setaffinity(0) sets the caller's own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// What a run of tokenscope took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Timed {
    pub wall: Duration,
    /// User and system time of all its threads.
    pub cpu: Duration,
    /// Peak RSS.
    pub rss_kib: i64,
}

/// Where a timed run may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cores {
    /// Every core of the machine (reading and deflating threads on their own cores).
    All,
    /// CPU 0 alone (sched_setaffinity before exec): the rate of one core.
    One,
}

/// Wall time, CPU time and peak RSS of `tokenscope ARGS` (`stdout`, `stderr`: where its
/// output and its summary line go). wait4, not getrusage(RUSAGE_CHILDREN): that is the
/// largest child so far, not this one.
pub(super) fn timed(
    bin: &Path,
    args: &[&std::ffi::OsStr],
    stdout: Stdio,
    stderr: Stdio,
    cores: Cores,
) -> Result<Timed> {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(bin);
    command.args(args).stdout(stdout).stderr(stderr);
    if cores == Cores::One {
        // SAFETY: `pin_to_cpu0` in the forked, not yet exec'd process: a
        // sched_setaffinity on a cpu_set_t of its own stack, async-signal-safe.
        unsafe {
            command.pre_exec(pin_to_cpu0);
        }
    }
    let start = Instant::now();
    let child = command.spawn().context("start tokenscope")?;
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child, which std has not reaped (we never wait on `child`).
    let reaped = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    ensure!(reaped == pid, "wait4: {}", std::io::Error::last_os_error());
    let status = ExitStatus::from_raw(status);
    ensure!(
        status.success(),
        "tokenscope {} failed with {status}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Ok(Timed {
        wall,
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        rss_kib: usage.ru_maxrss,
    })
}
