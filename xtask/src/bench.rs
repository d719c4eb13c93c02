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
mod scaling;
mod table;
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
    tls_cost(&bin, &out)?;
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

/// Cost of a traced OpenSSL `SSL_write`: N small writes from python's ssl module
/// to a TLS peer (another python process) over loopback, with no recorder, with
/// `tokenscope record --tls off` (socket probes only) and with `--tls auto` (the
/// plaintext uprobes on SSL_write, SSL_read and friends as well), alternating in
/// each round. Both processes load a private copy of the libssl python uses
/// (LD_LIBRARY_PATH): a uprobe covers one file, so no probe another tracer put on
/// the system's copy reaches the baseline, and `--tls auto` finds the copy among
/// the files running processes map.
fn tls_cost(bin: &Path, out: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tokenscope-bench-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = tls_rounds(bin, out, &dir);
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// `python3 -c TLS_WORKLOAD libssl | server CERT KEY CALLS SIZE | client PORT CALLS SIZE`.
/// The server reads CALLS * SIZE bytes per connection and answers one byte; the
/// client times its CALLS writes of SIZE bytes (SSL_write_ex in OpenSSL 3). Each
/// names the libssl it has mapped.
const TLS_WORKLOAD: &str = r#"
import socket, ssl, sys, time

def libssl():
    return next(l.split()[-1] for l in open('/proc/self/maps') if '/libssl.so' in l)

def server(cert, key, calls, size):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ls = socket.socket()
    ls.bind(('127.0.0.1', 0))
    ls.listen()
    print(ls.getsockname()[1], libssl(), flush=True)
    while True:
        c, _ = ls.accept()
        try:
            with ctx.wrap_socket(c, server_side=True) as s:
                want, got = calls * size, 0
                while got < want:
                    b = s.recv(65536)
                    if not b:
                        break
                    got += len(b)
                s.sendall(b'k' if got == want else b'e')
        except OSError:
            pass

def client(port, calls, size):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with ctx.wrap_socket(socket.create_connection(('127.0.0.1', port))) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        w, b = s.write, b'x' * size
        t = time.perf_counter_ns()
        for _ in range(calls):
            w(b)
        t = time.perf_counter_ns() - t
        if s.recv(1) != b'k':
            sys.exit('the TLS peer did not get every byte')
    print(t, libssl())

a = sys.argv[1:]
if a[0] == 'libssl':
    print(libssl())
elif a[0] == 'server':
    server(a[1], a[2], int(a[3]), int(a[4]))
else:
    client(int(a[1]), int(a[2]), int(a[3]))
"#;

fn tls_rounds(bin: &Path, out: &Path, dir: &Path) -> Result<()> {
    const CALLS: u32 = 20_000;
    const SIZE: u32 = 64;
    let python = |args: &[&str]| {
        let mut c = Command::new("python3");
        c.arg("-c").arg(TLS_WORKLOAD).args(args);
        c.env("LD_LIBRARY_PATH", dir).stdin(Stdio::null());
        c
    };
    let (lib, cert, key) = tls_peer_files(&python, dir)?;
    // /proc/PID/maps names the file with symlinks resolved.
    let real = std::fs::canonicalize(&lib)?;
    let loaded = |mapped: Option<&str>| -> Result<()> {
        if mapped.map(Path::new) != Some(real.as_path()) {
            bail!(
                "python's ssl module loaded {mapped:?}, not the bench's copy {}",
                lib.display()
            );
        }
        Ok(())
    };
    let (calls, size) = (CALLS.to_string(), SIZE.to_string());
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let mut server = Peer(
        python(&["server", &cert, &key, &calls, &size])
            .stdout(Stdio::piped())
            .spawn()
            .context("start the TLS peer")?,
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().expect("piped")).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let port: u16 = words
        .next()
        .and_then(|p| p.parse().ok())
        .context("the TLS peer did not start")?;
    loaded(words.next())?;
    let port = port.to_string();
    let client = || -> Result<f64> {
        let o = python(&["client", &port, &calls, &size]).output()?;
        if !o.status.success() {
            bail!("TLS client: {}", String::from_utf8_lossy(&o.stderr).trim());
        }
        let text = String::from_utf8_lossy(&o.stdout);
        let mut words = text.split_whitespace();
        let ns: f64 = words
            .next()
            .and_then(|t| t.parse().ok())
            .context("timing from python")?;
        loaded(words.next())?;
        Ok(ns / f64::from(CALLS))
    };
    let record = |tls: &str| {
        let args = ["--port", &port, "--tls", tls, "-o"];
        let mut args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
        args.push(out.as_os_str());
        Recorder::spawn(bin, &args)
    };
    let plaintext = || plaintext_io(bin, out, SIZE);

    let (mut base, mut off, mut auto, mut seen) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        base.push(client()?);
        let rec = record("off")?;
        off.push(client()?);
        rec.stop()?;
        let (w, r, _) = plaintext()?;
        if w + r > 0 {
            bail!("--tls off still recorded plaintext: {w} SSL_write and {r} SSL_read events");
        }
        let rec = record("auto")?;
        auto.push(client()?);
        let summary = rec.stop()?;
        let (w, r, probed) = plaintext()?;
        if w == 0 {
            bail!(
                "--tls auto recorded no SSL_write of {SIZE} B for {CALLS} calls on {} (SSL_write probed in: {probed})",
                lib.display()
            );
        }
        seen.push((w, r, summary));
    }
    drop(server);

    let name = lib.file_name().unwrap_or_default().to_string_lossy();
    print_tls_rounds(&name, CALLS, SIZE, (base, off, auto), &seen);
    Ok(())
}

/// The bench's copy of the libssl python's ssl module maps (so its uprobes touch
/// nothing else), and a throwaway certificate for the peer.
fn tls_peer_files(
    python: &dyn Fn(&[&str]) -> Command,
    dir: &Path,
) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let o = python(&["libssl"]).env_remove("LD_LIBRARY_PATH").output()?;
    if !o.status.success() {
        bail!(
            "python3 with its ssl module: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let system = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let lib = dir.join(system.file_name().context("the libssl python maps")?);
    std::fs::copy(&system, &lib).with_context(|| format!("copy {}", system.display()))?;
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let o = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdin(Stdio::null())
        .output()
        .context("openssl")?;
    if !o.status.success() {
        bail!(
            "openssl req (the peer's certificate): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok((lib, cert, key))
}

/// Plaintext I/O in a recording: (SSL_write events of `size` bytes, SSL_read events,
/// the files SSL_write was probed in).
fn plaintext_io(bin: &Path, recording: &Path, size: u32) -> Result<(u64, u64, String)> {
    let o = Command::new(bin).arg("dump").arg(recording).output()?;
    if !o.status.success() {
        bail!(
            "tokenscope dump: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let sized = format!(" {size} B");
    let writes = text
        .lines()
        .filter(|l| l.contains(" send SSL_write fd ") && l.contains(&sized))
        .count();
    let reads = text
        .lines()
        .filter(|l| l.contains(" recv SSL_read fd "))
        .count();
    let probed: Vec<&str> = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("uprobe:SSL_write@"))
        .collect();
    Ok((writes as u64, reads as u64, probed.join(" ")))
}

/// The rounds' medians against the run without tokenscope, and what each recording saw.
fn print_tls_rounds(
    name: &str,
    calls: u32,
    size: u32,
    (mut base, mut off, mut auto): (Vec<f64>, Vec<f64>, Vec<f64>),
    seen: &[(u64, u64, Summary)],
) {
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, f, t) = (med(&mut base), med(&mut off), med(&mut auto));
    println!("TLS plaintext uprobes: {calls} SSL_write calls of {size} B (python ssl, a copy of {name}) to a TLS peer over loopback, median of {ROUNDS} rounds (same run)");
    println!("  no tokenscope                     {b:>8.0} ns/call   1.00x");
    println!(
        "  socket probes only (--tls off)    {f:>8.0} ns/call   {:.2}x  (+{:.2} us/call)",
        f / b,
        (f - b) / 1e3
    );
    println!(
        "  TLS uprobes too (--tls auto)      {t:>8.0} ns/call   {:.2}x  (+{:.2} us/call)",
        t / b,
        (t - b) / 1e3
    );
    println!(
        "SSL_write ({size} B, python ssl): {:.1} us/call without tokenscope, {:.1} us with socket probes only (--tls off), {:.1} us with TLS uprobes: +{:.1} us per traced SSL_write (entry + return uprobes and the plaintext record; the peer's SSL_read is traced too)",
        b / 1e3,
        f / 1e3,
        t / 1e3,
        (t - f) / 1e3
    );
    for (w, r, s) in seen {
        println!(
            "  --tls auto recorded {w} SSL_write events of {size} B for {calls} calls, {r} SSL_read ({} delivered, {} dropped)",
            s.delivered, s.dropped
        );
    }
}

/// A child killed when dropped, on error paths too.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
