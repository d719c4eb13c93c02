//! `cargo xtask bench`: probe overhead and event throughput, as ratios against
//! a baseline measured in the same run (never as test assertions).
//!
//! Workload: N one-byte sends over loopback TCP to a sink thread. Measured
//! (1) with no probes, (2) with `tokenscope record` attached but filtered to
//! another port (the cost every unrelated process pays), (3) recording this
//! socket. Throughput: events delivered per second of the flood, and drops.
//! Replay: a recording of the lab engine under bench load, then the time
//! `tokenscope report` takes to read, stitch and analyze it (events/s).
//! Replay: a recording of the lab engine under bench load, then the time
//! `tokenscope report` takes to decode, stitch and analyze it (events/s).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

const SENDS: usize = 200_000;
const ROUNDS: usize = 3;

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::cargo(&["build", "--release", "--bin", "tokenscope"])?;
    let bin = crate::root().join("target/release/tokenscope");
    let out = std::env::temp_dir().join(format!("tokenscope-bench-{}.tsrec", std::process::id()));
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let sink = std::thread::spawn(move || sink(listener));

    let mut base = Vec::new();
    let mut filtered = Vec::new();
    let mut traced = Vec::new();
    let mut throughput = Vec::new();
    for _ in 0..ROUNDS {
        base.push(flood(port)?);
        let rec = Recorder::start(&bin, &out, port.wrapping_add(1))?;
        filtered.push(flood(port)?);
        rec.stop()?;
        let rec = Recorder::start(&bin, &out, port)?;
        let t = flood(port)?;
        traced.push(t);
        let summary = rec.stop()?;
        throughput.push((summary, t));
    }
    let _ = TcpStream::connect(("127.0.0.1", port)).map(|mut s| s.write_all(b"q"));
    drop(sink);
    let _ = std::fs::remove_file(&out);

    let med = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let (b, f, t) = (med(&mut base), med(&mut filtered), med(&mut traced));
    let per = |d: Duration| d.as_nanos() as f64 / SENDS as f64;
    println!("probe overhead: {SENDS} one-byte sends over loopback, median of {ROUNDS} rounds (same run)");
    println!(
        "  no probes                     {:>8.0} ns/send   1.00x",
        per(b)
    );
    println!(
        "  probes on, other port         {:>8.0} ns/send   {:.2}x  (+{:.2} us/send)",
        per(f),
        per(f) / per(b),
        (per(f) - per(b)) / 1e3
    );
    println!(
        "  probes on, this socket        {:>8.0} ns/send   {:.2}x  (+{:.2} us/send)",
        per(t),
        per(t) / per(b),
        (per(t) - per(b)) / 1e3
    );
    println!("throughput while tracing (each send is a send event on one side and a receive event on the other):");
    for (s, d) in &throughput {
        println!(
            "  {:>9.0} events/s delivered ({} delivered, {} dropped)",
            s.delivered as f64 / d.as_secs_f64(),
            s.delivered,
            s.dropped
        );
    }
    replay(&bin, &out)?;
    uprobe_cost(&bin, &out)
}

/// Cost of a libcuda uprobe hit: N calls to the lab's stand-in cuGraphLaunch on a
/// null graph (it returns CUDA_ERROR_INVALID_HANDLE at once) with and without the
/// GPU probes (entry and return each fire).
fn uprobe_cost(bin: &Path, out: &Path) -> Result<()> {
    const CALLS: u32 = 20_000;
    let dir = std::env::temp_dir().join(format!("tokenscope-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let lib = dir.join("libcuda.so.1");
    // `lab engine --libcuda PATH` writes the stand-in there when it is missing.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut engine = Command::new(bin)
        .args([
            "lab",
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
        "libcuda uprobes: {CALLS} cuGraphLaunch calls: {base:.0} ns/call without, {probed:.0} ns/call with (entry + return probes): +{:.1} us per call",
        (probed - base) / 1e3
    );
    Ok(())
}

/// Records the lab engine under bench load, then times `tokenscope report` on it.
fn replay(bin: &Path, out: &Path) -> Result<()> {
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut engine = Command::new(bin)
        .args(["lab", "engine", "--listen", &format!("127.0.0.1:{port}")])
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
    let rec = Recorder::start(bin, out, port)?;
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
    crate::run(Command::new(bin).args(load).stdout(Stdio::null()))?;
    let summary = rec.stop()?;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(engine.id() as i32, libc::SIGTERM) };
    let _ = engine.wait();
    let start = Instant::now();
    let report = Command::new(bin)
        .arg("report")
        .arg(out)
        .arg("--json")
        .stdout(Stdio::null())
        .status()?;
    let took = start.elapsed();
    let _ = std::fs::remove_file(out);
    if !report.success() {
        bail!("tokenscope report failed on the replay recording");
    }
    println!(
        "replay: {} events read, stitched, analyzed and written as JSON in {took:.2?}: {:.0} events/s",
        summary.delivered,
        summary.delivered as f64 / took.as_secs_f64()
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
    fn start(bin: &Path, out: &Path, port: u16) -> Result<Recorder> {
        let port = port.to_string();
        Recorder::spawn(
            bin,
            &[
                "--port".as_ref(),
                port.as_ref(),
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
        while !line.contains("recording:") {
            line.clear();
            if err.read_line(&mut line)? == 0 {
                bail!("tokenscope record exited before attaching");
            }
        }
        Ok(Recorder(child, err))
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
        let num = |key: &str| -> u64 {
            rest.split(key)
                .nth(1)
                .and_then(|s| {
                    s.trim_start()
                        .split(|c: char| !c.is_ascii_digit())
                        .next()?
                        .parse()
                        .ok()
                })
                .unwrap_or(0)
        };
        Ok(Summary {
            delivered: num("delivered"),
            dropped: num("dropped"),
        })
    }
}
