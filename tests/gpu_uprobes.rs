//! Privileged: libcuda uprobes on the lab engine's stand-in driver. The steps
//! tokenscope rebuilds from the calls must match the engine's own step log.

mod common;

use std::time::Duration;

use collector::gpu::{self, StepKind};
use common::*;
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::engine::StepKind as LabKind;
use tokenscope_lab::{Engine, EngineConfig};

#[test]
fn recorded_steps_match_the_engine_step_log() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, path) = rt.block_on(async {
        let engine = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("engine");
        let lib = engine.libcuda_path().to_path_buf();
        let port = engine.addr().port().to_string();
        let rec = Recorder::start(
            dir.path(),
            &["--port", &port, "--libcuda", lib.to_str().unwrap()],
        );
        let load = BenchConfig {
            url: engine.base_url(),
            concurrency: 4,
            requests: Some(16),
            prompt_tokens: 300,
            shared_prefix: 0,
            max_tokens: 16,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BenchConfig::default()
        };
        let out = bench::run(&load).await.expect("bench");
        assert!(out.records.iter().all(|r| r.ok));
        let log = engine.step_log().snapshot();
        let path = rec.path.clone();
        rec.stop();
        engine.shutdown().await;
        (log, path)
    });
    let (header, events) = read_recording(&path);
    assert!(
        header
            .probes
            .iter()
            .any(|p| p.starts_with("uprobe:cuLaunchKernel@")),
        "uprobes attached: {:?}",
        header.probes
    );
    let steps = gpu::steps(&events);
    assert_eq!(steps.len(), log.len(), "one recorded step per engine step");
    let kind = |k: LabKind| match k {
        LabKind::Prefill => StepKind::Prefill,
        LabKind::Decode => StepKind::Decode,
        LabKind::Mixed => StepKind::Mixed,
    };
    let mut close = 0;
    let mut worst = 0u64;
    for (s, l) in steps.iter().zip(&log) {
        assert_eq!(s.kind, kind(l.kind), "step {} kind", l.index);
        assert_eq!(
            (s.kernel_launches, s.graph_launches),
            (l.kernel_launches, l.graph_launches),
            "step {} launches",
            l.index
        );
        let err = s
            .start_ns
            .abs_diff(l.start_ns)
            .max(s.end_ns.abs_diff(l.end_ns));
        worst = worst.max(err);
        close += usize::from(err <= 500_000);
    }
    println!("{} steps ({} prefill, {} decode, {} mixed); start/end within 0.5 ms for {close}; worst {worst} ns",
        steps.len(),
        steps.iter().filter(|s| s.kind == StepKind::Prefill).count(),
        steps.iter().filter(|s| s.kind == StepKind::Decode).count(),
        steps.iter().filter(|s| s.kind == StepKind::Mixed).count());
    assert!(
        close * 100 >= steps.len() * 99,
        "start/end within 0.5 ms for >= 99% of steps ({close} of {})",
        steps.len()
    );
}

#[test]
fn a_decode_stall_names_the_request_whose_prefill_caused_it() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = rt.block_on(async {
        // Chunked prefill off: a long prompt's prefill runs as one step that stalls every decode.
        let engine = Engine::start(EngineConfig::untuned(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("engine");
        let lib = engine.libcuda_path().to_path_buf();
        let port = engine.addr().port().to_string();
        let rec = Recorder::start(
            dir.path(),
            &["--port", &port, "--libcuda", lib.to_str().unwrap()],
        );
        let load = BenchConfig {
            url: engine.base_url(),
            concurrency: 4,
            requests: Some(8),
            prompt_tokens: 40,
            shared_prefix: 0,
            long_prompt_every: 4,
            long_prompt_tokens: 3000,
            max_tokens: 80,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BenchConfig::default()
        };
        let out = bench::run(&load).await.expect("bench");
        assert!(out.records.iter().all(|r| r.ok));
        let path = rec.path.clone();
        rec.stop();
        engine.shutdown().await;
        path
    });
    let report = report_json(&path);
    let requests = report["requests"].as_array().expect("requests");
    let prefill = |r: &serde_json::Value| r["gpu"]["prefill_ns"].as_u64().unwrap_or(0);
    let long = requests
        .iter()
        .max_by_key(|r| prefill(r))
        .expect("a request");
    let long_id = long["id"].as_u64().unwrap();
    assert!(
        prefill(long) >= 500_000_000,
        "the 3,000-word prompt prefills for ~600 ms: {}",
        long["gpu"]
    );
    let stalls: Vec<&serde_json::Value> = requests
        .iter()
        .filter(|r| r["id"] != long["id"])
        .flat_map(|r| {
            r["gpu"]["stalled_by"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |s| (r, s))
        })
        .filter(|(_, s)| {
            s["requests"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c.as_u64() == Some(long_id))
        })
        .map(|(r, _)| r)
        .collect();
    assert!(
        !stalls.is_empty(),
        "some running stream's gap is blamed on request {long_id}: {:#}",
        report["gpu"]
    );
    for r in &stalls {
        for s in r["gpu"]["stalled_by"].as_array().unwrap() {
            if s["requests"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c.as_u64() == Some(long_id))
            {
                let (gap, step) = (
                    s["gap_ns"].as_u64().unwrap(),
                    s["step_ns"].as_u64().unwrap(),
                );
                assert!(
                    gap >= step,
                    "the gap ({gap} ns) spans the prefill step ({step} ns)"
                );
            }
        }
    }
    println!(
        "request {long_id} (prefill {} ms) stalled {} other requests",
        prefill(long) / 1_000_000,
        stalls.len()
    );
}
