//! `cargo xtask bench`: probe overhead and event throughput, as ratios against
//! a baseline measured in the same run (never as test assertions).
//!
//! Workload: N one-byte sends over loopback TCP to a sink thread. Measured
//! (1) with no probes, (2) with `tokenscope record` attached but filtered to
//! another port (the cost every unrelated process pays), (3) recording this
//! socket. Throughput: events delivered per second of the flood, and drops.
//! Replay: a recording of the lab engine under bench load, then the time
//! `tokenscope report` takes to decode, stitch and analyze it (events/s).
//! Uprobes: libcuda calls with and without the GPU probes, and OpenSSL
//! `SSL_write` calls with no recorder, with socket probes only (`--tls off`)
//! and with the TLS plaintext uprobes (`--tls auto`). Scaling: replay of a
//! recording replicated 1x, 10x, 100x (see `scaling`; alone: `bench scaling`). The
//! agent: served tokens/s with and without it, its CPU and RSS (`agent`; alone: `bench
//! agent`).

mod agent;
mod child;
mod reference;
mod scaling;
mod table;
mod tls;
mod top;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const SENDS: usize = 200_000;
const ROUNDS: usize = 3;

/// `what`: `None` for every measurement, `Some("scaling")` for replay scaling alone
/// (no probes: it needs no privileges); `more`: what follows it (`bench top`: other
/// binaries to measure beside this build's).
pub(crate) fn run(what: Option<&str>, more: &[String]) -> Result<()> {
    if what != Some("top") && !more.is_empty() {
        bail!("unexpected arguments {more:?} (only `bench top` takes binaries)");
    }
    match what {
        None => {}
        Some("scaling") => {
            return scaling::run(&binaries()?);
        }
        Some("agent") => {
            crate::setup::run()?;
            return agent::run(&binaries()?);
        }
        Some("table") => {
            crate::setup::run()?;
            let bin = binaries()?;
            warn_other_recorders();
            return table::run(&bin);
        }
        Some("top") => {
            crate::setup::run()?;
            let bin = binaries()?;
            warn_other_recorders();
            let others: Vec<PathBuf> = more.iter().map(PathBuf::from).collect();
            return table::run_top(&bin, &others);
        }
        Some(other) => bail!("unknown bench '{other}' (known: table, top, scaling, agent)"),
    }
    crate::setup::run()?;
    let bin = binaries()?;
    warn_other_recorders();
    table::run(&bin)?;
    let out = std::env::temp_dir().join(format!("tokenscope-bench-{}.tsrec", std::process::id()));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let sink = std::thread::spawn(move || sink(listener));

    let mut base = Vec::new();
    let mut sources: Vec<SourceRuns> = IO_SOURCES
        .iter()
        .filter_map(|&name| usable_source(&bin, &out, name, port.wrapping_add(1)))
        .collect();
    for _ in 0..ROUNDS {
        base.push(flood(port)?);
        for s in &mut sources {
            let rec = Recorder::start(&bin, &out, port.wrapping_add(1), s.name)?;
            s.filtered.push(flood(port)?);
            rec.stop()?;
            let rec = Recorder::start(&bin, &out, port, s.name)?;
            let t = flood(port)?;
            s.traced.push(t);
            let summary = rec.stop()?;
            s.throughput.push((summary, t));
        }
    }
    let _ = TcpStream::connect(("127.0.0.1", port)).map(|mut s| s.write_all(b"q"));
    drop(sink);
    let _ = std::fs::remove_file(&out);

    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let b = med(&mut base);
    let per = |d: Duration| d.as_nanos() as f64 / SENDS as f64;
    println!("probe overhead: {SENDS} one-byte sends over loopback, median of {ROUNDS} rounds (same run)");
    println!(
        "  no probes                               {:>8.0} ns/send   1.00x",
        per(b)
    );
    for s in &mut sources {
        let rows = [
            ("other port ", med(&mut s.filtered)),
            ("this socket", med(&mut s.traced)),
        ];
        for (which, d) in rows {
            println!(
                "  --io-source {:<8} probes on, {which}{:>8.0} ns/send   {:.2}x  (+{:.2} us/send)",
                s.name,
                per(d),
                per(d) / per(b),
                (per(d) - per(b)) / 1e3
            );
        }
    }
    println!("throughput while tracing (each send is a send event on one side and a receive event on the other):");
    for s in &sources {
        for (summary, d) in &s.throughput {
            println!(
                "  --io-source {:<8} {:>9.0} events/s delivered ({} delivered, {} dropped)",
                s.name,
                summary.delivered as f64 / d.as_secs_f64(),
                summary.delivered,
                summary.dropped
            );
        }
    }
    replay(&bin, &out)?;
    uprobe_cost(&bin, &out)?;
    tls::tls_cost(&bin, &out)?;
    agent::run(&bin)
}

/// Builds what the bench runs; the profiler's path. The profiler as `cargo xtask dist`
/// ships it (lto, one codegen unit, nothing of the lab in its dependencies): an SRE's
/// costs are that binary's (a `--release` build replays the bench recording ~7% slower
/// on one core). The lab (load, engine, proxy) in release, built on its own.
fn binaries() -> Result<PathBuf> {
    crate::cargo(&["build", "--release", "-p", "tokenscope-lab", "--bins"])?;
    Ok(crate::dist::build()?.join("tokenscope"))
}

/// The lab's binary (engine, proxy, load), from `binaries`.
fn lab() -> PathBuf {
    crate::target_dir().join("release").join("tokenscope-lab")
}

/// Another recorder's probes fire in every figure here, the baselines included.
fn warn_other_recorders() {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let others: Vec<String> = procs
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.parse::<u32>().ok()?;
            let cmd = std::fs::read(format!("/proc/{name}/cmdline")).ok()?;
            let mut args = cmd.split(|&b| b == 0);
            let exe = args.next()?;
            (exe.ends_with(b"tokenscope") && args.next()? == b"record").then_some(name)
        })
        .collect();
    if !others.is_empty() {
        println!(
            "warning: tokenscope record already runs (pid {}): its probes add to every figure below, baselines included",
            others.join(", ")
        );
    }
}

/// Cost of a libcuda uprobe hit: N calls to the lab's stand-in cuGraphLaunch on a
/// null graph (it returns CUDA_ERROR_INVALID_HANDLE at once) with and without the
/// GPU probes (a launch has its entry probed, not its return).
fn uprobe_cost(bin: &Path, out: &Path) -> Result<()> {
    const CALLS: u32 = 20_000;
    let dir = std::env::temp_dir().join(format!("tokenscope-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let lib = dir.join("libcuda.so.1");
    // `tokenscope-lab engine --libcuda PATH` writes the stand-in there when it is missing.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut engine = Command::new(lab())
        .args([
            "engine",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--libcuda",
        ])
        .arg(&lib)
        .stdout(Stdio::null())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(engine.id() as i32, libc::SIGTERM) };
    let _ = engine.wait();
    let script = format!(
        "import ctypes,time\nl=ctypes.CDLL('{}')\nassert l.cuInit(0)==0\nt=time.perf_counter_ns()\n\
         for _ in range({CALLS}): l.cuGraphLaunch(None, None)\nprint(time.perf_counter_ns()-t)\n",
        lib.display()
    );
    let run = || -> Result<f64> {
        let o = Command::new("python3").arg("-c").arg(&script).output()?;
        let ns: f64 = String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .context("timing from python")?;
        Ok(ns / f64::from(CALLS))
    };
    let base = run()?;
    let rec = Recorder::spawn(
        bin,
        &[
            "--port".as_ref(),
            "1".as_ref(),
            "--libcuda".as_ref(),
            lib.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
    )?;
    let probed = run()?;
    rec.stop_output()?;
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "libcuda uprobes: {CALLS} cuGraphLaunch calls: {base:.0} ns/call without, {probed:.0} ns/call with (its entry probe, past the driver-shaped guard): +{:.1} us per call",
        (probed - base) / 1e3
    );
    Ok(())
}

/// Records the lab engine under bench load, then times `tokenscope report` on it.
fn replay(bin: &Path, out: &Path) -> Result<()> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut engine = Command::new(lab())
        .args(["engine", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .spawn()
        .context("start the lab engine")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("the lab engine did not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let rec = Recorder::start(bin, out, port, "auto")?;
    let url = format!("http://127.0.0.1:{port}");
    let load = [
        "bench",
        "--url",
        &url,
        "--concurrency",
        "64",
        "--requests",
        "600",
        "--max-tokens",
        "64",
        "--prompt-tokens",
        "32",
        "--no-progress",
    ];
    crate::run(Command::new(lab()).args(load).stdout(Stdio::null()))?;
    let summary = rec.stop()?;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(engine.id() as i32, libc::SIGTERM) };
    let _ = engine.wait();
    let report = scaling::timed_report(bin, out, Stdio::null(), scaling::Cores::All);
    let _ = std::fs::remove_file(out);
    let scaling::Timed {
        wall: took,
        rss_kib: max_rss_kib,
        ..
    } = report?;
    println!(
        "replay: {} events read, stitched, analyzed and written as JSON in {took:.2?}: {:.0} events/s, peak RSS {} MiB",
        summary.delivered,
        summary.delivered as f64 / took.as_secs_f64(),
        max_rss_kib / 1024
    );
    Ok(())
}

fn sink(listener: TcpListener) {
    for conn in listener.incoming() {
        let Ok(mut c) = conn else { continue };
        let mut buf = [0u8; 65536];
        let mut first = true;
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            if first && n == 1 && buf[0] == b'q' {
                return;
            }
            first = false;
        }
    }
}

/// Every I/O source `record --io-source` knows; each this kernel has is measured.
const IO_SOURCES: &[&str] = &["sock", "kprobe", "syscall"];

struct SourceRuns {
    name: &'static str,
    filtered: Vec<Duration>,
    traced: Vec<Duration>,
    throughput: Vec<(Summary, Duration)>,
}

/// The source's runs to fill, or a line saying why this kernel cannot run it.
fn usable_source(bin: &Path, out: &Path, name: &'static str, port: u16) -> Option<SourceRuns> {
    match Recorder::start(bin, out, port, name).and_then(Recorder::stop) {
        Ok(_) => Some(SourceRuns {
            name,
            filtered: Vec::new(),
            traced: Vec::new(),
            throughput: Vec::new(),
        }),
        Err(e) => {
            println!("  --io-source {name}: not measured: {e:#}");
            None
        }
    }
}

fn flood(port: u16) -> Result<Duration> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    s.write_all(b"w")?;
    let start = Instant::now();
    for _ in 0..SENDS {
        s.write_all(b"x")?;
    }
    Ok(start.elapsed())
}

struct Summary {
    delivered: u64,
    dropped: u64,
}

/// A `tokenscope record` child that has attached its probes.
pub(crate) struct Recorder(std::process::Child, BufReader<std::process::ChildStderr>);

impl Recorder {
    fn start(bin: &Path, out: &Path, port: u16, io_source: &str) -> Result<Recorder> {
        let port = port.to_string();
        Recorder::spawn(
            bin,
            &[
                "--port".as_ref(),
                port.as_ref(),
                "--io-source".as_ref(),
                io_source.as_ref(),
                "-o".as_ref(),
                out.as_os_str(),
            ],
        )
    }

    /// `tokenscope record ARGS...`, once it says it is recording.
    pub(crate) fn spawn(bin: &Path, args: &[&std::ffi::OsStr]) -> Result<Recorder> {
        let mut child = Command::new(bin)
            .arg("record")
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .context("start tokenscope record")?;
        let mut err = BufReader::new(child.stderr.take().expect("piped"));
        let mut line = String::new();
        let mut last = String::new();
        while !line.contains("recording:") {
            line.clear();
            if err.read_line(&mut line)? == 0 {
                let _ = child.wait();
                bail!("tokenscope record exited before attaching: {}", last.trim());
            }
            if !line.trim().is_empty() {
                last.clone_from(&line);
            }
        }
        Ok(Recorder(child, err))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGINT; returns the rest of its stderr once it has exited.
    pub(crate) fn stop_output(mut self) -> Result<String> {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let mut rest = String::new();
        self.1.read_to_string(&mut rest)?;
        self.0.wait()?;
        Ok(rest)
    }

    /// SIGINT, then parse "submitted S, delivered D, dropped X" from its last line.
    fn stop(self) -> Result<Summary> {
        let rest = self.stop_output()?;
        let num = |key: &str| child::number_after(&rest, key).unwrap_or(0);
        Ok(Summary {
            delivered: num("delivered"),
            dropped: num("dropped"),
        })
    }
}

impl Drop for Recorder {
    /// A bench that fails half-way leaves no probes attached behind it.
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
