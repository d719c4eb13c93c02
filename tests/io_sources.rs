//! Privileged: the I/O sources. Each source yields the same events, so two recorders
//! watching the same traffic, one on the default source and one forced to the syscall
//! source, must report the same requests and tokens at the same times. A kernel that
//! cannot host a source (or has no BTF) gets one line and exit status 2.
//!
//! `cargo xtask test-kernels` runs this file inside older kernels too (Debian 12's 6.1,
//! where the default is the kprobe source).

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use collector::analyze::percentile;
use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig, RequestRecord};
use tokenscope_lab::proxy::{NginxProxy, ProxyConfig, ProxyMode};
use tokenscope_lab::{Engine, EngineConfig};

/// Inside `cargo xtask test-kernels`: a guest emulated without KVM, where each
/// instruction costs tens of times more, so streams run one at a time to keep the
/// guest's CPU from queueing the very reads being timed.
fn in_emulated_guest() -> bool {
    std::env::var_os("TOKENSCOPE_KERNEL_MATRIX").is_some()
}

/// Runs `requests` bench requests through nginx (keep-alive, unbuffered) to the lab
/// engine while one recorder per entry of `sources` watches; returns bench's records
/// and each recorder's report.
fn run_watched(sources: &[&[&str]], requests: u64) -> (Vec<RequestRecord>, Vec<Value>) {
    let rt = runtime();
    let dirs: Vec<tempfile::TempDir> = sources
        .iter()
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    rt.block_on(async {
        let engine = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("engine");
        let proxy = NginxProxy::start(ProxyConfig::new(ProxyMode::TunedPlain, engine.addr()))
            .await
            .expect("nginx");
        let ports = [
            engine.addr().port().to_string(),
            proxy.addr().port().to_string(),
        ];
        // One request before recording, so the timed ones do not pay for loading code
        // and filling caches (seconds of page faults in an emulated guest).
        let warm_up = bench::run(&BenchConfig {
            url: proxy.url(),
            concurrency: 1,
            requests: Some(1),
            max_tokens: 4,
            progress: false,
            timeout: Duration::from_secs(300),
            ..BenchConfig::default()
        })
        .await
        .expect("warm-up request");
        assert!(
            warm_up.records.iter().all(|r| r.ok),
            "the warm-up request succeeded"
        );
        let recorders: Vec<Recorder> = sources
            .iter()
            .zip(&dirs)
            .map(|(extra, dir)| {
                let mut args = vec!["--port", &ports[0], "--port", &ports[1]];
                args.extend_from_slice(extra);
                Recorder::start(dir.path(), &args)
            })
            .collect();
        let outcome = bench::run(&BenchConfig {
            url: proxy.url(),
            concurrency: if in_emulated_guest() { 1 } else { 4 },
            requests: Some(requests),
            prompt_tokens: 120,
            shared_prefix: 100,
            max_tokens: 24,
            progress: false,
            timeout: Duration::from_secs(300),
            ..BenchConfig::default()
        })
        .await
        .expect("bench");
        let paths: Vec<_> = recorders.iter().map(|r| r.path.clone()).collect();
        for r in recorders {
            r.stop();
        }
        drop(proxy);
        engine.shutdown().await;
        let reports = paths.iter().map(|p| report_json(p)).collect();
        (outcome.records, reports)
    })
}

/// The lab's completions in a report, keyed by (client port, order on that connection).
fn by_connection(report: &Value) -> BTreeMap<(u16, usize), &Value> {
    let mut per_port: BTreeMap<u16, Vec<&Value>> = BTreeMap::new();
    for r in report["requests"].as_array().expect("requests") {
        if r["path"] != "/v1/completions" {
            continue;
        }
        let port = r["client_addr"]
            .as_str()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("request {} has a client address", r["id"]));
        per_port.entry(port).or_default().push(r);
    }
    let mut out = BTreeMap::new();
    for (port, mut rs) in per_port {
        rs.sort_by_key(|r| ns(&r["first_byte_ns"]));
        for (i, r) in rs.into_iter().enumerate() {
            out.insert((port, i), r);
        }
    }
    out
}

fn io_source(report: &Value) -> &str {
    report["recording"]["io_source"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("the report names its I/O source: {}", report["recording"]))
}

/// What this kernel's default source should be.
fn expected_default() -> &'static str {
    let tracefs = collector::probes::tracefs_root().expect("tracefs is mounted by now");
    if tracefs.join("events/sock/sock_send_length").is_dir() {
        "sock"
    } else if Path::new("/sys/bus/event_source/devices/kprobe/type").exists() {
        "kprobe"
    } else {
        "syscall"
    }
}

#[test]
fn requests_through_nginx_appear_once_with_every_point_and_the_bench_timing() {
    let (records, reports) = run_watched(&[&[]], 16);
    let report = &reports[0];
    assert!(
        records.iter().all(|r| r.ok),
        "every bench request succeeded"
    );
    assert_eq!(
        io_source(report),
        expected_default(),
        "the best source this kernel has"
    );
    let seen = by_connection(report);
    assert_eq!(
        seen.len(),
        records.len(),
        "every bench request appears exactly once"
    );

    let mut bench_by_conn: BTreeMap<u16, Vec<&RequestRecord>> = BTreeMap::new();
    for b in &records {
        bench_by_conn.entry(b.local_port).or_default().push(b);
    }
    let (mut ttft_err, mut itl_err) = (Vec::new(), Vec::new());
    // TTFT's two ends apart: request start, and first token (both one clock).
    let (mut start_err, mut first_err) = (Vec::new(), Vec::new());
    for (port, mut bs) in bench_by_conn {
        bs.sort_by_key(|b| b.request_start_ns);
        for (i, b) in bs.into_iter().enumerate() {
            let r = seen
                .get(&(port, i))
                .unwrap_or_else(|| panic!("bench request {i} on :{port} is in the report"));
            assert_eq!(
                point_kinds(r),
                ["client_read", "proxy_write", "proxy_read", "engine_write"],
                "request {} has client-read, proxy and engine points",
                r["id"]
            );
            let client = point(r, "client_read").expect("client read");
            let tokens: Vec<u64> = client["token_ns"]
                .as_array()
                .expect("token_ns")
                .iter()
                .map(ns)
                .collect();
            assert_eq!(
                tokens.len(),
                b.events.iter().filter(|e| e.choice).count(),
                "token count of request {}",
                r["id"]
            );
            let err = off_range(ns(&client["ttft_ns"]), b.ttft_range().expect("bench ttft"));
            let start = ns(&r["start_ns"]).abs_diff(b.start_ns());
            let first = tokens[0].abs_diff(b.first_token_ns().expect("bench first token"));
            if err > MS {
                println!(
                    "request {} (new connection: {}): TTFT |error| {err} ns, start {start} ns, first token {first} ns",
                    r["id"], r["new_connection"]
                );
            }
            ttft_err.push(err);
            start_err.push(start);
            first_err.push(first);
            let gaps = tokens.windows(2).map(|w| w[1] - w[0]);
            itl_err.extend(gaps.zip(b.itl_ns()).map(|(a, b)| a.abs_diff(b)));
        }
    }
    println!(
        "request start |error| p50 {} ns p99 {} ns; first token |error| p50 {} ns p99 {} ns",
        percentile(&start_err, 500),
        percentile(&start_err, 990),
        percentile(&first_err, 500),
        percentile(&first_err, 990)
    );
    // The guest emulated without KVM reads its clock and schedules through TCG: 1 ms
    // holds on real hardware (the host run), the guest gets 2 (CI saw a p99 of 0.96 ms
    // there, one request of 16 just over 1 ms; 0.55 ms in the run before).
    let limit = if in_emulated_guest() { 2 * MS } else { MS };
    assert_within(
        &format!("{} source, through nginx", expected_default()),
        "TTFT",
        ttft_err,
        itl_err,
        limit,
    );
}

#[test]
fn the_syscall_source_sees_the_same_requests_and_tokens_as_the_default() {
    let (records, reports) = run_watched(&[&[], &["--io-source", "syscall"]], 32);
    assert!(
        records.iter().all(|r| r.ok),
        "every bench request succeeded"
    );
    let (default, syscall) = (&reports[0], &reports[1]);
    assert_eq!(io_source(default), expected_default());
    assert_eq!(io_source(syscall), "syscall");
    assert!(
        syscall["recording"]["io_source"]["not_seen"]
            .as_str()
            .is_some_and(|s| s.contains("sendfile")),
        "the report says what the syscall source cannot see"
    );

    let (a, b) = (by_connection(default), by_connection(syscall));
    assert_eq!(
        a.len(),
        records.len(),
        "the default source saw every request"
    );
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "both sources saw the same requests on the same connections"
    );
    let mut diffs = Vec::new();
    for (key, ra) in &a {
        let rb = b[key];
        assert_eq!(
            point_kinds(ra),
            point_kinds(rb),
            "points of request {key:?}"
        );
        for kind in point_kinds(ra) {
            let times = |r: &Value| -> Vec<u64> {
                point(r, kind).expect("point")["token_ns"]
                    .as_array()
                    .expect("token_ns")
                    .iter()
                    .map(ns)
                    .collect()
            };
            let (ta, tb) = (times(ra), times(rb));
            assert_eq!(ta.len(), tb.len(), "tokens of request {key:?} at {kind}");
            diffs.extend(ta.iter().zip(&tb).map(|(x, y)| x.abs_diff(*y)));
        }
    }
    let p50 = percentile(&diffs, 500);
    let p99 = percentile(&diffs, 990);
    println!(
        "{} vs syscall source: per-token time |difference| p50 {p50} ns, p99 {p99} ns over {} tokens",
        expected_default(),
        diffs.len()
    );
    // Both probes fire inside the same syscall; emulation stretches that path about
    // thirtyfold, while a token put in the wrong read would be off by a whole ITL.
    let bound = if in_emulated_guest() { MS } else { 50_000 };
    assert!(
        p99 < bound,
        "per-token times of the two sources differ by {p99} ns at p99 (want < {bound} ns)"
    );
}

/// Runs `tokenscope record` expecting it to refuse at once; returns (status, stderr).
fn refused(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(profiler())
        .arg("record")
        .arg("-o")
        .arg(dir.path().join("r.tsrec"))
        .args(["--duration", "1s"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run tokenscope record");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn a_source_the_kernel_lacks_is_refused_in_one_line_with_status_2() {
    let tracefs = collector::probes::tracefs_root().expect("tracefs is mounted by now");
    // Every kernel tested lacks one of these: 6.3+ without kprobes (this development
    // machine), or older ones without the socket-layer tracepoints.
    let lacking = if !Path::new("/sys/bus/event_source/devices/kprobe/type").exists() {
        "kprobe"
    } else if !tracefs.join("events/sock/sock_send_length").is_dir() {
        "sock"
    } else {
        panic!("this kernel has every I/O source; the test needs one that lacks a source")
    };
    let (status, stderr) = refused(&["--io-source", lacking], &[]);
    assert_eq!(status, 2, "exit status 2; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains(&format!(
            "--io-source {lacking}: not available in this kernel"
        )),
        "{stderr}"
    );
}

#[test]
fn without_kernel_btf_one_line_and_status_2_and_an_external_btf_file_works() {
    let (status, stderr) = refused(&[], &[("TOKENSCOPE_KERNEL_BTF", "/nonexistent/vmlinux")]);
    assert_eq!(status, 2, "exit status 2; stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("kernel BTF not found") && stderr.contains("--btf FILE"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let garbage = dir.path().join("garbage.btf");
    std::fs::write(&garbage, b"not BTF at all").expect("write");
    let garbage = garbage.to_str().expect("utf-8");
    let (status, stderr) = refused(&["--btf", garbage], &[]);
    assert_eq!(
        status, 2,
        "a BTF file that does not parse; stderr: {stderr}"
    );
    assert!(stderr.contains(&format!("--btf {garbage}")), "{stderr}");

    // A BTFHub-style file: the kernel's own BTF, copied, on a "kernel" that has none.
    let external = dir.path().join("vmlinux.btf");
    std::fs::copy("/sys/kernel/btf/vmlinux", &external).expect("copy the kernel's BTF");
    let external = external.to_str().expect("utf-8");
    let out = Command::new(profiler())
        .arg("record")
        .arg("-o")
        .arg(dir.path().join("r.tsrec"))
        .args(["--duration", "1s", "--btf", external])
        .env("TOKENSCOPE_KERNEL_BTF", "/nonexistent/vmlinux")
        .output()
        .expect("run tokenscope record");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "record with --btf: {stderr}");
    assert!(
        stderr.contains("I/O source: "),
        "record names its I/O source: {stderr}"
    );
    let (header, _) = read_recording(&dir.path().join("r.tsrec"));
    assert!(header.complete, "the recording was sealed");
    assert_eq!(header.io_source, expected_default());
}

/// The seed's untuned set-up (nginx buffering, no upstream keep-alive, connection per
/// request) recorded with this kernel's default source still yields rules 1, 2 and 3.
#[test]
fn the_untuned_demo_still_yields_rules_1_2_3() {
    // Four clients: each reconnects after the server closes on it (what rule 1 sees)
    // even where emulation makes every request last seconds; with the demo's default
    // 24, an emulated guest spends its 20 s on first connections.
    // 10 s are enough on a host (the untuned scenario shows all five in 10 s).
    let duration = if in_emulated_guest() { "20s" } else { "10s" };
    let recording = demo_recording(
        &demo_stdout(&["--duration", duration, "--concurrency", "4"]),
        "untuned.tsrec",
    );
    let report = report_json(&recording);
    assert_eq!(io_source(&report), expected_default());
    for rule in 1..=3 {
        assert_rule_with_evidence(&report, rule);
    }
}
