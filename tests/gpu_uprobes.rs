//! Privileged: libcuda uprobes on the lab engine's stand-in driver. The steps
//! tokenscope rebuilds from the calls, and each request's prefill time, must
//! match the engine's own logs; a decode stall must name the request whose
//! prefill caused it.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::PathBuf;
use std::time::Duration;

use collector::gpu::{self, StepKind};
use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::engine::requests::ServedRequest;
use tokenscope_lab::engine::StepKind as LabKind;
use tokenscope_lab::{Engine, EngineConfig, Step};

struct Run {
    log: Vec<Step>,
    served: Vec<ServedRequest>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

/// Records the lab engine (uprobes on its stand-in libcuda) under `load`.
fn record_engine(config: EngineConfig, load: BenchConfig) -> Run {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, served, path) = rt.block_on(async {
        let engine = Engine::start(config, "127.0.0.1:0".parse().unwrap())
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
            progress: false,
            timeout: Duration::from_secs(60),
            ..load
        };
        let out = bench::run(&load).await.expect("bench");
        assert!(out.records.iter().all(|r| r.ok), "every request succeeded");
        let (log, served) = (
            engine.step_log().snapshot(),
            engine.request_log().snapshot(),
        );
        let path = rec.path.clone();
        rec.stop();
        engine.shutdown().await;
        (log, served, path)
    });
    Run {
        log,
        served,
        path,
        _dir: dir,
    }
}

fn load(concurrency: usize, requests: u64, prompt: usize, max_tokens: usize) -> BenchConfig {
    BenchConfig {
        concurrency,
        requests: Some(requests),
        prompt_tokens: prompt,
        shared_prefix: 0,
        max_tokens,
        ..BenchConfig::default()
    }
}

#[test]
fn recorded_steps_match_the_engine_step_log() {
    let run = record_engine(EngineConfig::default(), load(4, 16, 300, 16));
    let (header, events) = read_recording(&run.path);
    // The stand-in's entry points begin as NVIDIA's do (a guard `cmpl` of 10 bytes, then
    // `je`): every probe goes on the jump, where no single step is needed, and the steps
    // below are what those probes (entries and the synchronisations' returns) saw.
    let cuda: Vec<&String> = header
        .probes
        .iter()
        .filter(|p| p.starts_with("uprobe:cu"))
        .collect();
    assert!(
        cuda.iter()
            .any(|p| p.starts_with("uprobe:cuLaunchKernel+10@"))
            && cuda.iter().all(|p| p.contains("+10@")),
        "uprobes attached past the guard: {:?}",
        header.probes
    );
    let steps = gpu::steps(&events);
    assert_eq!(
        steps.len(),
        run.log.len(),
        "one recorded step per engine step"
    );
    let kind = |k: LabKind| match k {
        LabKind::Prefill => StepKind::Prefill,
        LabKind::Decode => StepKind::Decode,
        LabKind::Mixed => StepKind::Mixed,
    };
    let mut errors = Vec::with_capacity(steps.len());
    for (s, l) in steps.iter().zip(&run.log) {
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
        errors.push(err);
    }
    errors.sort_unstable();
    let close = errors.iter().filter(|&&e| e <= 500_000).count();
    let median = errors[errors.len() / 2];
    let worst = errors.last().copied().unwrap_or(0);
    let count = |k: StepKind| steps.iter().filter(|s| s.kind == k).count();
    println!(
        "{} steps ({} prefill, {} decode, {} mixed); start/end within 0.5 ms for {close}; median {median} ns, worst {worst} ns",
        steps.len(),
        count(StepKind::Prefill),
        count(StepKind::Decode),
        count(StepKind::Mixed)
    );
    // The engine reads its clock just before it calls the probed function; on a 2-core VM a
    // preemption between the two can put a step 1-2 ms off (CI saw 2 of 141). A systematic
    // error would move the median and most steps, which is what these two bounds catch.
    assert!(
        median <= 100_000,
        "median start/end error {median} ns, want <= 0.1 ms"
    );
    assert!(
        close * 100 >= steps.len() * 95,
        "start/end within 0.5 ms for >= 95% of steps ({close} of {})",
        steps.len()
    );
}

/// |reported - logged| prefill time per request, matched by the first token's time. Prefill
/// time is vLLM's: from the start of the step with its first prompt chunk to the end of the
/// step with its last (under chunked prefill those steps are shared with other prompts).
fn prefill_errors(run: &Run, report: &Value) -> Vec<u64> {
    run.served
        .iter()
        .map(|served| {
            let (first, last) = prefill_steps(&run.log, served.request_id);
            let logged = last.end_ns - first.start_ns;
            reported_by_first_token(report, served.token_ns[0])["gpu"]["prefill_ns"]
                .as_u64()
                .expect("a prefill time")
                .abs_diff(logged)
        })
        .collect()
}

#[test]
fn each_request_prefill_time_matches_the_log_with_whole_prompt_prefills() {
    // Chunked prefill off: each prompt prefills in one step, as many engines run today.
    prefill_times_match(EngineConfig::untuned(), "off", 200);
}

#[test]
fn each_request_prefill_time_matches_the_log_with_chunked_prefill() {
    // Chunked prefill on (vLLM V1): 300-token prompts in 40-token steps, four arriving at
    // once, so prompts take turns and share steps with others' chunks and decodes.
    prefill_times_match(EngineConfig::default(), "on", 200);
}

fn prefill_times_match(config: EngineConfig, chunked: &str, prompt: usize) {
    let run = record_engine(config, load(4, 16, prompt, 16));
    let report = report_json(&run.path);
    let errors = prefill_errors(&run, &report);
    let worst = errors.iter().max().copied().unwrap_or(0);
    println!(
        "prefill time vs the engine log, chunked prefill {chunked}: {} requests, worst error {worst} ns",
        errors.len()
    );
    if errors.iter().any(|e| *e > 1_000_000) {
        println!(
            "{} requests reported of {} served; recording: {}",
            report["requests"].as_array().map_or(0, |r| r.len()),
            run.served.len(),
            report["recording"]
        );
        for step in run.log.iter().filter(|s| s.prefill_tokens > 0) {
            println!(
                "step {} {}..{} prefills {:?}",
                step.index,
                step.start_ns,
                step.end_ns,
                step.requests
                    .iter()
                    .filter(|r| r.prefill_tokens > 0)
                    .map(|r| r.request_id)
                    .collect::<Vec<_>>()
            );
        }
        for (served, e) in run.served.iter().zip(&errors) {
            println!(
                "request {} received {} first token {} error {e}",
                served.request_id, served.received_ns, served.token_ns[0]
            );
        }
        for r in report["requests"].as_array().unwrap() {
            let engine = r["points"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["kind"] == "engine_write")
                .cloned()
                .unwrap_or_default();
            let tokens = engine["token_ns"].as_array().cloned().unwrap_or_default();
            println!(
                "reported {} {} tokens {} first {:?}",
                r["engine_received_ns"],
                r["gpu"],
                tokens.len(),
                &tokens[..tokens.len().min(3)]
            );
        }
    }
    // As for steps: the engine reads its clock next to the probed calls, and a preemption
    // between the two (CI saw one request of 16 at 1.2 ms, two of 141 steps at 1.5 ms) puts
    // a request off by its length. A systematic error moves the median and most requests;
    // a gross one (a wrong step taken as the prefill's) is far over 10 ms.
    let mut sorted = errors.clone();
    sorted.sort_unstable();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    let close = errors.iter().filter(|e| **e <= 1_000_000).count();
    assert!(
        !errors.is_empty() && median <= 100_000,
        "median prefill error {median} ns, want <= 0.1 ms: {errors:?}"
    );
    assert!(
        close * 8 >= errors.len() * 7,
        "prefill within 1 ms for >= 7/8 of requests ({close} of {}): {errors:?}",
        errors.len()
    );
    assert!(
        worst <= 10_000_000,
        "no request 10 ms off (worst {worst} ns): {errors:?}"
    );
}

#[test]
fn a_decode_stall_names_the_request_whose_prefill_caused_it() {
    // Chunked prefill off: a long prompt's prefill runs as one step that stalls every decode.
    // Two of the eight prompts are long; one may prefill before any stream is running.
    let cfg = BenchConfig {
        long_prompt_every: 4,
        long_prompt_tokens: 3000,
        ..load(4, 8, 40, 80)
    };
    let run = record_engine(EngineConfig::untuned(), cfg);
    let report = report_json(&run.path);
    let requests = report["requests"].as_array().expect("requests");
    let prefill = |r: &Value| r["gpu"]["prefill_ns"].as_u64().unwrap_or(0);
    let long: Vec<u64> = requests
        .iter()
        .filter(|r| prefill(r) >= 500_000_000)
        .map(|r| r["id"].as_u64().unwrap())
        .collect();
    assert!(
        !long.is_empty(),
        "the 3,000-word prompts prefill for ~600 ms: {:?}",
        requests.iter().map(prefill).collect::<Vec<_>>()
    );
    // Every decode gap that spans a long prefill step names a long prompt, and some do.
    let mut stalled = 0;
    for r in requests {
        for s in r["gpu"]["stalled_by"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|s| s["step_ns"].as_u64().unwrap() >= 500_000_000)
        {
            let (gap, step) = (
                s["gap_ns"].as_u64().unwrap(),
                s["step_ns"].as_u64().unwrap(),
            );
            assert!(
                gap >= step,
                "the gap ({gap} ns) spans the prefill step ({step} ns)"
            );
            let named: Vec<u64> = s["requests"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c.as_u64())
                .collect();
            assert!(
                named.iter().any(|c| long.contains(c)),
                "a gap over a long prefill step names a long prompt ({long:?}): {named:?}"
            );
            assert!(!named.contains(&r["id"].as_u64().unwrap()), "not itself");
            stalled += 1;
        }
    }
    assert!(
        stalled > 0,
        "some running stream's gap spans a long prompt's prefill: {:#}",
        report["gpu"]
    );
    println!(
        "long prompts {long:?} (prefill ~{} ms) stalled {stalled} decode gaps",
        requests.iter().map(prefill).max().unwrap_or(0) / 1_000_000
    );
}
