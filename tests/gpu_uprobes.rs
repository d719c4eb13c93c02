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
