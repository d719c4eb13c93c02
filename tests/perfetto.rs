//! Privileged: the Perfetto export of a real recording. The lab engine (its
//! stand-in libcuda probed, so GPU steps exist) behind real nginx, loaded by
//! bench while `tokenscope record` watches; the recording is exported, decoded
//! by Google's own Python bindings (PyPI `perfetto`, in a venv this test makes)
//! and checked (tests/perfetto_check.py), and the trace's counts of request
//! tracks, token instants and GPU steps must equal the report's.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;
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

/// A venv with PyPI's `perfetto` in the system temp dir, made once and reused. It is
/// built beside its final path and renamed into place, so concurrent runs never share
/// a half-made one.
fn perfetto_venv() -> PathBuf {
    let venv = std::env::temp_dir().join("tokenscope-perfetto-venv");
    let python = venv.join("bin/python");
    let has_bindings = |python: &Path| {
        Command::new(python)
            .args([
                "-c",
                "from perfetto.protos.perfetto.trace import perfetto_trace_pb2",
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has_bindings(&python) {
        return python;
    }
    let building =
        std::env::temp_dir().join(format!("tokenscope-perfetto-venv.{}", std::process::id()));
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&building),
        "python3 -m venv (Debian package python3-venv)",
    );
    run(
        Command::new(building.join("bin/python")).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "perfetto",
        ]),
        "pip install perfetto (PyPI)",
    );
    let _ = std::fs::remove_dir_all(&venv);
    if std::fs::rename(&building, &venv).is_err() {
        // Another run put its venv in place first: use ours where it is.
        return building.join("bin/python");
    }
    assert!(
        has_bindings(&python),
        "the venv at {} imports perfetto_trace_pb2",
        venv.display()
    );
    python
}

/// Records the lab engine behind untuned nginx (auth_request sub-requests,
/// buffering) under bench load, with the engine's libcuda probed.
fn record(dir: &Path) -> PathBuf {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
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
    let file = std::fs::File::create(&trace_path).expect("create the trace file");
    let summary =
        collector::export::perfetto::write_trace(&header, &events, std::io::BufWriter::new(file))
            .expect("export the recording");
    println!(
        "{} events -> {} packets, {} bytes: {summary:?}",
        events.len(),
        summary.packets,
        summary.bytes
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
    assert_eq!(
        seen["gpu_steps"], report.gpu.steps,
        "a GPU step slice per step in the report"
    );
    assert_eq!(seen["packets"], summary.packets, "every packet decoded");
    assert_eq!(seen["flows"], summary.flows, "every flow complete");
    assert!(
        summary.flows >= 12 * 32,
        "each token linked across hops: {} flows",
        summary.flows
    );

    // The check is not vacuous: a trace that never clears incremental state fails it.
    let broken = dir.path().join("broken.pftrace");
    let bytes = std::fs::read(&trace_path).expect("read the trace");
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
