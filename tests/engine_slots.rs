//! Privileged: rule 13, engine slot saturation, from sockets alone. The lab engine with
//! two sequence slots (vLLM's --max-num-seqs 2) and six concurrent long streams, recorded
//! with `--gpu off` (no steps: rule 6 cannot see the queue): rule 13 fires with the four
//! waiting requests as evidence, and its estimates agree with what bench measured, the
//! wait and what its own fix (six slots, same load, back to back) saves. With six slots it
//! does not fire.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig, RequestRecord};
use tokenscope_lab::EngineConfig;

const STREAMS: usize = 6;

/// Six streams at once against an engine with `slots`, recorded; bench's records and
/// the report (with `--what-if 13`).
fn run(slots: usize) -> (Vec<RequestRecord>, Value) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = lab_engine(
        &rt,
        EngineConfig {
            max_running_seqs: slots,
            ..EngineConfig::default()
        },
    );
    rt.block_on(async {
        let port = engine.addr().port().to_string();
        let rec = Recorder::start(dir.path(), &["--port", &port, "--gpu", "off"]);
        let outcome = bench::run(&BenchConfig {
            url: format!("http://{}/v1/completions", engine.addr()),
            concurrency: STREAMS,
            requests: Some(STREAMS as u64),
            prompt_tokens: 60,
            max_tokens: 40,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BenchConfig::default()
        })
        .await
        .expect("bench");
        let path = rec.path.clone();
        rec.stop();
        engine.shutdown().await;
        assert!(
            outcome.records.iter().all(|r| r.ok),
            "every stream succeeded"
        );
        (
            outcome.records,
            report_json_with(&path, &["--what-if", "13"]),
        )
    })
}

fn rule(report: &Value, n: u64) -> Option<&Value> {
    report["diagnoses"]
        .as_array()
        .expect("diagnoses")
        .iter()
        .find(|d| d["rule"] == n)
}

fn ttfts(records: &[RequestRecord]) -> Vec<u64> {
    let mut v: Vec<u64> = records.iter().map(|r| r.ttft_ns().expect("ttft")).collect();
    v.sort_unstable();
    v
}

fn within_25_percent(what: &str, estimated: f64, measured: f64) {
    println!(
        "{what}: estimated {:.1} ms, measured {:.1} ms",
        estimated / 1e6,
        measured / 1e6
    );
    assert!(
        (estimated - measured).abs() <= 0.25 * measured,
        "{what}: estimated {estimated} ns, measured {measured} ns (more than 25% apart)"
    );
}

#[test]
fn two_slots_make_requests_wait_and_rule_13_says_so_and_how_much() {
    let (two, report) = run(2);
    let (six, report_six) = run(STREAMS);
    let d = rule(&report, 13)
        .unwrap_or_else(|| panic!("rule 13 fires with two slots: {:#}", report["diagnoses"]));
    assert!(
        rule(&report_six, 13).is_none(),
        "six slots: no wait: {:#}",
        report_six["diagnoses"]
    );
    assert!(
        rule(&report, 6).is_none(),
        "no GPU source: rule 6 has no steps"
    );
    assert_eq!(d["evidence"]["requests"], 4, "the four that waited: {d:#}");
    assert_eq!(figure(d, "streams at once (most)"), 2.0);
    check_report_schema(&report).expect("the report with rule 13 follows the schema");

    // What bench saw: the two that found a slot start at once; the others wait.
    let t = ttfts(&two);
    let free = t[0].max(t[1]);
    let mut waits: Vec<u64> = t[2..].iter().map(|x| x - free).collect();
    waits.sort_unstable();
    let measured_p50 = (waits[1] + waits[2]) as f64 / 2.0;
    within_25_percent("wait p50", figure(d, "wait p50") * 1e6, measured_p50);

    // What the fix saves: TTFT p95 with two slots against six, same load.
    let p95 = |v: &[u64]| collector::analyze::percentile(v, 950) as f64;
    let measured_saving = p95(&t) - p95(&ttfts(&six));
    let estimated = d["saving"]["ttft_p95_ns"]
        .as_f64()
        .expect("a TTFT p95 saving");
    within_25_percent("TTFT p95 saving", estimated, measured_saving);

    // The what-if, as the profiler reads both runs: TTFT p95 predicted with slots for
    // every stream against the six-slot run's, within 25% (or 20 ms) of the saving.
    let at = |r: &Value, side: &str| {
        r["what_if"][side]["ttft_p95_ns"]
            .as_f64()
            .expect("ttft p95")
    };
    let predicted = at(&report, "recorded") - at(&report, "predicted");
    let measured = at(&report, "recorded") - at(&report_six, "recorded");
    println!(
        "what-if 13: TTFT p95 {:.1} ms, predicted {:.1} ms, six slots {:.1} ms",
        at(&report, "recorded") / 1e6,
        at(&report, "predicted") / 1e6,
        at(&report_six, "recorded") / 1e6
    );
    assert!(
        (predicted - measured).abs() <= (0.25 * measured).max(20e6),
        "what-if 13: predicted saving {predicted} ns, measured {measured} ns"
    );
}
