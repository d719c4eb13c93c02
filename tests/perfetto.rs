//! Privileged: the Perfetto export of a real recording. The lab engine (its
//! stand-in libcuda probed, so GPU steps exist) behind real nginx, loaded by
//! bench while `tokenscope record` watches; the recording is exported, decoded
//! by Google's own Python bindings (PyPI `perfetto`, in a venv this test makes)
//! and checked (tests/perfetto_check.py), and the trace's counts of request
//! tracks, token instants, GPU steps and diagnoses must equal the report's, its
//! token instants' times (rebuilt from the incremental clock) the recorded ones.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::proxy::{NginxProxy, ProxyConfig, ProxyMode};
use tokenscope_lab::{Engine, EngineConfig};

const CHECK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/perfetto_check.py");

fn run(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `tokenscope export REC -o TRACE ARGS`, which must succeed.
fn export(rec: &Path, trace: &Path, args: &[&str]) -> std::process::Output {
    let what = format!("tokenscope export {}", args.join(" "));
    run(
        Command::new(profiler())
            .arg("export")
            .arg(rec)
            .arg("-o")
            .arg(trace)
            .args(args),
        &what,
    )
}

/// A venv with PyPI's `perfetto` in the system temp dir, made once and reused. It is
/// built beside its final path and renamed into place, so concurrent runs never share
/// a half-made one.
fn perfetto_venv() -> PathBuf {
    test_support::pyvenv::python_for(test_support::venv_specs::PERFETTO)
}

/// Records the lab engine behind untuned nginx (auth_request sub-requests,
/// buffering) under bench load, with the engine's libcuda probed.
fn record(dir: &Path) -> PathBuf {
    let rt = runtime();
    rt.block_on(async {
        let engine = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("engine");
        let proxy = NginxProxy::start(ProxyConfig::new(ProxyMode::Untuned, engine.addr()))
            .await
            .expect("nginx");
        let lib = engine.libcuda_path().to_path_buf();
        let ports = [
            engine.addr().port().to_string(),
            proxy.addr().port().to_string(),
        ];
        let rec = Recorder::start(
            dir,
            &[
                "--port",
                &ports[0],
                "--port",
                &ports[1],
                "--libcuda",
                lib.to_str().expect("utf-8 path"),
            ],
        );
        let out = bench::run(&BenchConfig {
            url: proxy.url(),
            concurrency: 4,
            requests: Some(12),
            prompt_tokens: 120,
            shared_prefix: 100,
            max_tokens: 32,
            progress: false,
            timeout: Duration::from_secs(120),
            ..BenchConfig::default()
        })
        .await
        .expect("bench");
        assert!(out.records.iter().all(|r| r.ok), "every request succeeded");
        let path = rec.path.clone();
        rec.stop();
        drop(proxy);
        engine.shutdown().await;
        path
    })
}

/// The trace without its first packet (the one that clears incremental state):
/// Trace.packet is field 1, so each packet is 0x0a, a varint length, the bytes.
fn without_first_packet(trace: &[u8]) -> Vec<u8> {
    assert_eq!(trace[0], 0x0a, "a Trace starts with a packet field");
    let (mut len, mut shift, mut i) = (0usize, 0, 1);
    loop {
        let b = trace[i];
        len |= usize::from(b & 0x7f) << shift;
        shift += 7;
        i += 1;
        if b & 0x80 == 0 {
            break;
        }
    }
    trace[i + len..].to_vec()
}

#[test]
fn a_lab_recording_exports_to_a_trace_perfetto_decodes_with_the_reports_counts() {
    let python = perfetto_venv();
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = record(dir.path());
    let (header, events) = read_recording(&rec);
    let report = collector::export::report::build(&header, &events);
    let trace_path = dir.path().join("lab.pftrace");
    let out = export(&rec, &trace_path, &[]);
    println!(
        "{} events -> {}",
        events.len(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    // The library writes the same trace the command did.
    let mut again = Vec::new();
    let summary = collector::export::perfetto::write_trace(&header, &events, &mut again)
        .expect("export the recording");
    assert!(
        again == std::fs::read(&trace_path).expect("read the trace"),
        "export is deterministic: the library and the command wrote the same trace"
    );

    let out = run(
        Command::new(&python).arg(CHECK).arg(&trace_path),
        "perfetto_check.py on the exported trace",
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("the check prints JSON counts");
    println!("perfetto_check.py: {seen}");

    let tokens: usize = report
        .requests
        .iter()
        .flat_map(|r| &r.points)
        .map(|p| p.token_ns.len())
        .sum();
    assert!(
        report.requests.len() >= 12 && tokens >= 12 * 32 && report.gpu.steps > 0,
        "the recording has the bench's requests, their tokens and GPU steps: {} requests, {tokens} tokens, {} steps",
        report.requests.len(),
        report.gpu.steps
    );
    assert_eq!(
        seen["request_tracks"],
        report.requests.len(),
        "a request track per request in the report"
    );
    assert_eq!(
        seen["token_instants"], tokens,
        "a token instant per token at each observation point in the report"
    );
    // Timed on the incremental clock, each token is back at its recorded nanosecond.
    let token_ns_sum = report
        .requests
        .iter()
        .flat_map(|r| &r.points)
        .flat_map(|p| &p.token_ns)
        .fold(0u64, |sum, &t| sum.wrapping_add(t));
    assert_eq!(
        seen["token_ns_sum"], token_ns_sum,
        "the token instants' times, decoded by Perfetto's bindings, are the recorded ones"
    );
    assert_eq!(
        seen["gpu_steps"], report.gpu.steps,
        "a GPU step slice per step in the report"
    );
    let rules: Vec<&str> = report.diagnoses.iter().map(|d| d.key).collect();
    assert!(
        rules.contains(&"proxy_buffering"),
        "untuned nginx buffers the streams, so the trace has a diagnosis to check: {rules:?}"
    );
    assert_eq!(
        seen["diagnoses"],
        report.diagnoses.len(),
        "a diagnosis slice per diagnosis in the report"
    );
    assert_eq!(seen["diagnoses"], summary.diagnoses);
    let cited: std::collections::BTreeSet<usize> = report
        .diagnoses
        .iter()
        .flat_map(|d| d.evidence.request_ids.iter().copied())
        .collect();
    assert_eq!(
        seen["diagnosis_cites"],
        cited.len(),
        "one instant on the track of each request a diagnosis cites"
    );
    assert_eq!(seen["packets"], summary.packets, "every packet decoded");
    assert_eq!(seen["flows"], summary.flows, "every flow complete");
    // Each token linked across hops, but for the rare token whose read the probes saw a
    // few microseconds before its write (no flow rather than a backward one).
    assert!(
        summary.flows * 100 >= 12 * 32 * 95,
        "each token linked across hops: {} flows",
        summary.flows
    );

    windowed_export_keeps_the_reports_counts(&python, &rec, dir.path(), &seen);

    // Written uncompressed, the trace holds the same packets (the check counts them the
    // same); and the check is not vacuous: without the packet that clears incremental
    // state (the file's first when nothing is deflated), it fails.
    let plain = dir.path().join("plain.pftrace");
    export(&rec, &plain, &["--uncompressed"]);
    let out = run(
        Command::new(&python).arg(CHECK).arg(&plain),
        "perfetto_check.py on the uncompressed trace",
    );
    let plain_seen: Value = serde_json::from_slice(&out.stdout).expect("JSON counts");
    assert!(
        seen["bundles"].as_u64() > Some(0) && plain_seen["bundles"] == 0,
        "the default trace is deflated, --uncompressed is not: {seen} / {plain_seen}"
    );
    for key in [
        "packets",
        "token_instants",
        "token_ns_sum",
        "flows",
        "diagnoses",
    ] {
        assert_eq!(
            seen[key], plain_seen[key],
            "{key}: the same with or without compression"
        );
    }
    let bytes = std::fs::read(&plain).expect("read the trace");
    assert!(
        std::fs::metadata(&trace_path).expect("trace").len() * 3 < bytes.len() as u64,
        "deflated, the trace is under a third of its packets' bytes"
    );
    let broken = dir.path().join("broken.pftrace");
    std::fs::write(&broken, without_first_packet(&bytes)).expect("write the broken trace");
    let out = Command::new(&python)
        .arg(CHECK)
        .arg(&broken)
        .output()
        .expect("run perfetto_check.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("incremental state"),
        "perfetto_check.py must reject a trace without the clearing packet: {stderr}"
    );
}

/// The same recording written in windows of 500 ms: many requests stream across
/// windows (they go to the window they began in) and connections carry exchanges in
/// several. The trace must still pass the check and hold the one-window trace's
/// requests, tokens, flows and GPU steps, each once.
fn windowed_export_keeps_the_reports_counts(python: &Path, rec: &Path, dir: &Path, whole: &Value) {
    let path = dir.join("windowed.pftrace");
    let out = export(rec, &path, &["--window", "500ms"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("windowed: {}", stderr.trim());
    let windows: u64 = stderr
        .split(" window")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the export says how many windows it wrote");
    assert!(
        windows >= 4,
        "the recording spans several windows: {windows}"
    );
    let out = run(
        Command::new(python).arg(CHECK).arg(&path),
        "perfetto_check.py on the windowed trace",
    );
    let seen: Value = serde_json::from_slice(&out.stdout).expect("the check prints JSON counts");
    println!("perfetto_check.py (windowed): {seen}");
    for key in [
        "request_tracks",
        "token_instants",
        "token_ns_sum",
        "gpu_steps",
        "flows",
    ] {
        assert_eq!(seen[key], whole[key], "{key}: windowed as in one window");
    }
}

/// The recording's events copied `copies` times, each copy shifted past the one
/// before, on its own socket addresses and with its own content fingerprints, so
/// each copy stitches like the original.
fn replicate(events: &[collector::ingest::Event], copies: u64) -> Vec<collector::ingest::Event> {
    use collector::ingest::model::event::Body;
    let (lo, hi) = events.iter().fold((u64::MAX, 0), |(lo, hi), e| {
        (lo.min(e.ts_ns), hi.max(e.ts_ns))
    });
    let span = hi - lo + 1_000_000_000;
    let mut out = Vec::with_capacity(events.len() * copies as usize);
    for k in 0..copies {
        for e in events {
            let mut e = e.clone();
            e.ts_ns += k * span;
            let sock = match &mut e.body {
                Some(Body::State(s)) => s.sock.as_mut(),
                Some(Body::Io(s)) => {
                    // Each copy carries other content, as a long recording would: copies
                    // must not be joined to each other by body or token fingerprints.
                    if let Some(sn) = s.sniff.as_mut() {
                        sn.fingerprint ^= k;
                        if let Some(b) = sn.body_print.as_mut() {
                            b.hash ^= k;
                        }
                        for ev in &mut sn.sse {
                            ev.fingerprint ^= k;
                        }
                    }
                    s.sock.as_mut()
                }
                Some(Body::Accept(s)) => s.sock.as_mut(),
                Some(Body::Retransmit(s)) => s.sock.as_mut(),
                Some(Body::Gpu(a)) => {
                    a.start_ns += k * span;
                    a.end_ns += k * span;
                    None
                }
                _ => None,
            };
            if let Some(s) = sock {
                s.skaddr ^= k << 44;
            }
            out.push(e);
        }
    }
    out
}

/// Benchmark, not a test (no timing or size is asserted): export throughput, trace size
/// and memory on about a million events (a lab recording replicated in time), and the
/// streamed export's peak memory on that and on four times as many events. Run it with
/// `cargo test --release --test perfetto -- --ignored --nocapture export_benchmark`
/// (as root; TOKENSCOPE_BENCH_RECORDING=FILE uses that recording instead of making one).
#[test]
#[ignore = "benchmark: run explicitly, in release"]
fn export_benchmark_on_a_million_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = match std::env::var_os("TOKENSCOPE_BENCH_RECORDING") {
        Some(p) => PathBuf::from(p),
        None => record(dir.path()),
    };
    if let Some(keep) = std::env::var_os("TOKENSCOPE_KEEP_RECORDING") {
        std::fs::copy(&rec, keep).expect("keep the recording");
    }
    let (header, base) = read_recording(&rec);
    let copies = match std::env::var("TOKENSCOPE_BENCH_COPIES") {
        Ok(n) => n.parse().expect("TOKENSCOPE_BENCH_COPIES is a number"),
        Err(_) => (1_000_000 / base.len().max(1) as u64).max(1),
    };
    // The streamed export (`tokenscope export`, 60 s windows) in a process of its own, on
    // recordings of one and four times the events: its peak memory should not grow.
    for n in [copies, 4 * copies] {
        let file = dir.path().join(format!("bench-{n}.tsrec"));
        let mut w = collector::ingest::record::RecordWriter::create(&file, header.clone())
            .expect("create the bench recording");
        let events = replicate(&base, n);
        let count = events.len();
        let end = events.iter().map(|e| e.ts_ns).max().unwrap_or(0);
        for e in events {
            w.push(e).expect("write an event");
        }
        w.finish(header.counters.unwrap_or_default(), end)
            .expect("finish the bench recording");
        let out = dir.path().join("bench-streamed.pftrace");
        let started = std::time::Instant::now();
        let mut child = Command::new(profiler())
            .arg("export")
            .arg(&file)
            .arg("-o")
            .arg(&out)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run tokenscope export");
        let status_path = format!("/proc/{}/status", child.id());
        let mut peak = 0;
        while child.try_wait().expect("wait").is_none() {
            peak = peak.max(vm_hwm_kib(&status_path));
            std::thread::sleep(Duration::from_millis(20));
        }
        let secs = started.elapsed().as_secs_f64();
        let out = child.wait_with_output().expect("export output");
        assert!(out.status.success(), "tokenscope export failed");
        println!(
            "streamed export: {count} events in {secs:.2} s = {:.0} events/s, peak RSS {peak} KiB; {}",
            count as f64 / secs,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        std::fs::remove_file(&file).ok();
    }
    let events = replicate(&base, copies);
    let base_len = base.len();
    drop(base);
    let peak_before = peak_rss_kib();
    // Each timing is the best of two runs: the machine is shared.
    let (mut stitch_s, mut export_s, mut requests) = (f64::MAX, f64::MAX, 0);
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let timeline = collector::stitch::stitch(&events, false);
        stitch_s = stitch_s.min(started.elapsed().as_secs_f64());
        requests = timeline.requests.len();
    }
    let peak_stitch = peak_rss_kib();
    let path = dir.path().join("bench.pftrace");
    let mut summary = None;
    for _ in 0..2 {
        let file = std::io::BufWriter::new(std::fs::File::create(&path).expect("create"));
        let started = std::time::Instant::now();
        let s = collector::export::perfetto::write_trace(&header, &events, file).expect("export");
        export_s = export_s.min(started.elapsed().as_secs_f64());
        summary = Some(s);
    }
    let s = summary.expect("exported");
    let peak = peak_rss_kib();
    println!(
        "in-memory export (one window): {} events ({copies} copies of {}), {requests} requests; stitch alone {stitch_s:.2} s; \
         export (stitch + layout + encode + write) {export_s:.2} s = {:.0} events/s, of which layout + encode + write {:.2} s; \
         {} packets, {} bytes = {:.1} bytes per token event ({} token instants, {:.1} B each), {:.1} bytes per packet; peak RSS {peak_before} KiB with the events loaded, {peak_stitch} KiB after stitching alone, {peak} KiB after export",
        events.len(),
        base_len,
        events.len() as f64 / export_s,
        export_s - stitch_s,
        s.packets,
        s.bytes,
        s.bytes as f64 / s.token_instants.max(1) as f64,
        s.token_instants,
        s.token_bytes as f64 / s.token_instants.max(1) as f64,
        s.bytes as f64 / s.packets.max(1) as f64,
    );
}

fn vm_hwm_kib(status: &str) -> u64 {
    std::fs::read_to_string(status)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Peak resident memory of this process so far (VmHWM), KiB.
fn peak_rss_kib() -> u64 {
    vm_hwm_kib("/proc/self/status")
}

#[test]
fn record_to_a_pftrace_name_writes_the_trace_and_keeps_the_recording() {
    let python = perfetto_venv();
    let dir = tempfile::tempdir().expect("tempdir");
    let nginx = Nginx::start(dir.path(), "default_type text/plain; return 200 \"hi\";");
    let trace = dir.path().join("live.pftrace");
    let port = nginx.http_port.to_string();
    let mut child = Command::new(profiler())
        .args([
            "record",
            "--port",
            &port,
            "--gpu",
            "off",
            "--nvml",
            "off",
            "--duration",
            "3s",
            "-o",
        ])
        .arg(&trace)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("record");
    // Traffic while it records: the recorder says when it is attached.
    let stderr = child.stderr.take().expect("piped");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    for line in lines.by_ref().map_while(Result::ok) {
        if line.contains("recording:") {
            break;
        }
    }
    curl(&[
        "-s",
        "-o",
        "/dev/null",
        &format!("http://127.0.0.1:{port}/"),
    ]);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(child.wait().expect("wait").success(), "{rest:?}");
    let kept = dir.path().join("live.pftrace.tsrec");
    assert!(kept.exists(), "the recording is kept beside the trace");
    // The trace is what `tokenscope export` makes of the kept recording, and Perfetto's
    // own bindings accept it.
    let again = dir.path().join("again.pftrace");
    export(&kept, &again, &[]);
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        std::fs::read(&again).unwrap(),
        "same bytes as export"
    );
    run(
        Command::new(&python).arg(CHECK).arg(&trace),
        "perfetto_check.py",
    );
}
