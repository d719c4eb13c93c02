//! Privileged: `tokenscope-lab demo --compare` records both sides of the lab. The untuned
//! side must yield the seed article's five diagnoses (rules 1-5), each with its
//! evidence, and their summed TTFT p95 saving must land within 50% of what tuning
//! measurably saved (the bench's own clock, same run); the tuned side yields none of
//! them. The same recordings then drive the SLO gate both ways.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use test_support::{
    assert_rule_with_evidence, check_report_schema, demo_recording, demo_stdout, profiler,
    report_json,
};

struct Demo {
    stdout: String,
    untuned: PathBuf,
    tuned: PathBuf,
}

/// One demo run shared by the tests of this file (they run one at a time).
fn demo() -> &'static Demo {
    static DEMO: OnceLock<Demo> = OnceLock::new();
    DEMO.get_or_init(|| {
        let stdout = demo_stdout(&["--compare", "--duration", "20s"]);
        println!("{stdout}");
        Demo {
            untuned: demo_recording(&stdout, "untuned.tsrec"),
            tuned: demo_recording(&stdout, "tuned.tsrec"),
            stdout,
        }
    })
}

fn rules(report: &Value) -> Vec<u64> {
    report["diagnoses"]
        .as_array()
        .expect("diagnoses")
        .iter()
        .map(|d| d["rule"].as_u64().unwrap())
        .collect()
}

#[test]
fn untuned_demo_yields_rules_1_to_5_with_evidence_and_tuned_none() {
    let d = demo();
    let untuned = report_json(&d.untuned);
    check_report_schema(&untuned).expect("the report with diagnoses matches the committed schema");
    for rule in 1..=5 {
        assert_rule_with_evidence(&untuned, rule);
    }
    let tuned = report_json(&d.tuned);
    let left: Vec<u64> = rules(&tuned).into_iter().filter(|r| *r <= 5).collect();
    assert!(
        left.is_empty(),
        "the tuned side yields none of rules 1-5: {left:?}"
    );
    assert!(
        d.stdout.contains("tuned side: none of rules 1-5"),
        "the demo says so"
    );
}

#[test]
fn the_summed_saving_of_rules_1_to_5_is_within_half_of_the_measured_difference() {
    let d = demo();
    let line = d
        .stdout
        .lines()
        .find(|l| l.contains("estimated saving, summed:"))
        .unwrap_or_else(|| panic!("the demo prints the summed saving:\n{}", d.stdout));
    let number_after = |key: &str| -> f64 {
        line.split(key)
            .nth(1)
            .unwrap()
            .trim_start()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let estimated = number_after("summed:");
    let measured = number_after("(bench):");
    println!("estimated {estimated} ms vs measured {measured} ms");
    assert!(measured > 0.0, "tuning saved TTFT p95: {line}");
    assert!(
        (estimated - measured).abs() <= 0.5 * measured,
        "the estimate is within 50% of the measured difference: {line}"
    );
}

/// `report --slo ...` on a recording: (exit code, stdout).
fn gate(path: &std::path::Path, slos: &[&str]) -> (i32, String) {
    let mut cmd = Command::new(profiler());
    cmd.arg("report").arg(path);
    for s in slos {
        cmd.args(["--slo", s]);
    }
    let out = cmd.output().expect("run report");
    (
        out.status.code().expect("exited"),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn the_slo_gate_fails_the_untuned_side_and_passes_the_tuned_one() {
    let d = demo();
    let slos = ["ttft_p95=300ms", "itl_p99=50ms"];
    let (code, out) = gate(&d.untuned, &slos);
    assert_eq!(code, 1, "untuned violates: {out}");
    let ttft = out
        .lines()
        .skip_while(|l| !l.starts_with("VIOLATED: ttft_p95=300ms"))
        .take(2)
        .collect::<Vec<_>>();
    assert!(
        ttft.len() == 2 && ttft[1].trim_start().starts_with('['),
        "the violated TTFT SLO lists its top diagnosis: {out}"
    );
    let (code, out) = gate(&d.tuned, &["ttft_p95=300ms"]);
    assert_eq!(code, 0, "tuned meets TTFT p95 <= 300 ms: {out}");
    assert!(out.contains("met: ttft_p95=300ms"), "{out}");

    // JSON carries the verdicts too.
    let out = Command::new(profiler())
        .arg("report")
        .arg(&d.untuned)
        .args(["--json", "--slo", "ttft_p95=300ms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["slo"][0]["met"], false);
    assert!(!v["slo"][0]["top_diagnoses"].as_array().unwrap().is_empty());

    // Could not tell: an unreadable recording is 2, not a pass and not a breach.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.tsrec");
    std::fs::write(&junk, b"not a recording").unwrap();
    let (code, out) = gate(&junk, &slos);
    assert_eq!(code, 2, "{out}");
    assert!(out.starts_with("tokenscope: error: "), "{out}");
    // A malformed objective is a usage error (2) that shows the form.
    let (code, out) = gate(&d.tuned, &["ttft_p95=300"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("ttft_p95=300ms"), "{out}");
}

/// `report --what-if 1,2,3,4,5` on the untuned side predicts what tuning measurably saved
/// (the tuned side of the same demo, read at the same point): TTFT p95 within 25% (or
/// 20 ms); the JSON matches the schema and the text prints the table.
#[test]
fn what_if_on_the_untuned_side_predicts_the_tuned_side() {
    let d = demo();
    let what_if = |path: &std::path::Path| -> Value {
        let v = test_support::report_json_with(path, &["--what-if", "1,2,3,4,5"]);
        check_report_schema(&v).expect("the report with what_if matches the schema");
        v["what_if"].clone()
    };
    let (before, after) = (what_if(&d.untuned), what_if(&d.tuned));
    let applied: Vec<u64> = before["applied"]
        .as_array()
        .expect("applied")
        .iter()
        .map(|a| a["rule"].as_u64().unwrap())
        .collect();
    assert_eq!(applied, [1, 2, 3, 4, 5], "{before}");
    assert_eq!(
        after["applied"].as_array().map(Vec::len),
        Some(0),
        "{after}"
    );
    let ms = |v: &Value| v.as_f64().expect("ns") / 1e6;
    let recorded = ms(&before["recorded"]["ttft_p95_ns"]);
    let predicted = ms(&before["predicted"]["ttft_p95_ns"]);
    let fixed = ms(&after["recorded"]["ttft_p95_ns"]);
    let (predicted_saving, measured_saving) = (recorded - predicted, recorded - fixed);
    println!(
        "untuned -> tuned (live), rules 1-5, TTFT p95: recorded {recorded:.1} ms, predicted \
         {predicted:.1} ms, tuned {fixed:.1} ms; saving predicted {predicted_saving:.1} ms, \
         measured {measured_saving:.1} ms"
    );
    assert!(measured_saving > 0.0, "tuning saved TTFT p95");
    assert!(
        (predicted_saving - measured_saving).abs() <= (0.25 * measured_saving).max(20.0),
        "the predicted saving is within 25% of the measured one"
    );
    let text = Command::new(profiler())
        .arg("report")
        .arg(&d.untuned)
        .args(["--what-if", "all"])
        .output()
        .expect("run report");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("what-if --what-if all:") && text.contains("  TTFT p95 "),
        "{text}"
    );
}
