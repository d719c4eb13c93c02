//! Privileged: `tokenscope agent` under `setpriv` with exactly the capabilities
//! deploy/ grants (CAP_BPF + CAP_PERFMON, and CAP_SYS_ADMIN for uprobes) records and
//! serves what it saw; with one of them missing it says which, in one line. A planted
//! key, cookie and prompt reach no metric, recording or report.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::process::Command;
use std::time::Duration;

use test_support::agent::{metric_sum, Agent};
use test_support::http::curl_status;
use test_support::{assert_no_secrets_in_outputs, free_port, lab_engine, profiler, runtime};
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::EngineConfig;

/// `setpriv` keeping only `caps` (e.g. "+bpf,+perfmon") in every set a root process
/// gets at exec, then the profiler.
fn setpriv(caps: &str) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--bounding-set=-all,{caps}"))
        .arg("--inh-caps=-all")
        .arg(profiler());
    c
}

/// A key, a cookie and a prompt that must reach no metric label, recording or report.
const SECRETS: [&str; 3] = [
    "sk-planted-CAPS-789",
    "planted-cookie-321",
    "PLANTED-PROMPT-654",
];

/// Runs the agent with `caps` while bench sends 6 streams and curl one more carrying
/// the planted secrets; its /metrics request count and its stderr.
fn watch_with(caps: &str) -> (f64, String) {
    let rt = runtime();
    let engine = lab_engine(&rt, EngineConfig::default());
    let port = engine.addr().port().to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = dir.path().join("rec");
    let agent = Agent::start_with(
        setpriv(caps),
        free_port(),
        &[
            "--port",
            &port,
            "--nvml",
            "off",
            "--record-dir",
            rec.to_str().expect("utf-8 path"),
        ],
    );
    rt.block_on(async {
        let out = bench::run(&BenchConfig {
            url: format!("http://{}/v1/completions", engine.addr()),
            concurrency: 3,
            requests: Some(6),
            max_tokens: 16,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BenchConfig::default()
        })
        .await
        .expect("bench");
        assert!(out.records.iter().all(|r| r.ok));
    });
    let body = format!(
        r#"{{"model":"lab-model","prompt":"{} tell me","max_tokens":8,"stream":true}}"#,
        SECRETS[2]
    );
    let (code, text) = curl_status(&[
        "-N",
        "-H",
        "content-type: application/json",
        "-H",
        &format!("Authorization: Bearer {}", SECRETS[0]),
        "-H",
        &format!("Cookie: session={}", SECRETS[1]),
        "-d",
        &body,
        &format!("http://127.0.0.1:{port}/v1/completions"),
    ]);
    assert_eq!(code, 200, "the planted request streamed: {text}");
    // Settled and observed.
    let mut seen = 0.0;
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = agent.metrics();
        seen = metric_sum(&metrics, "tokenscope_requests_total");
        if seen >= 7.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let stderr = agent.stop();
    for secret in SECRETS {
        assert!(!metrics.contains(secret), "{caps}: {secret} in /metrics");
        assert!(!stderr.contains(secret), "{caps}: {secret} on stderr");
    }
    let kept: Vec<_> = std::fs::read_dir(&rec)
        .expect("--record-dir made")
        .map(|e| e.expect("entry").path())
        .collect();
    assert!(!kept.is_empty(), "{caps}: a recording kept in --record-dir");
    for file in &kept {
        assert_no_secrets_in_outputs(file, dir.path(), &SECRETS);
    }
    rt.block_on(engine.shutdown());
    (seen, stderr)
}

#[test]
fn the_granted_capabilities_record_and_serve_and_uprobes_say_when_sys_admin_is_missing() {
    let (full, stderr) = watch_with("+bpf,+perfmon,+sys_admin");
    println!("bpf+perfmon+sys_admin: {full} requests\n{stderr}");
    assert_eq!(full, 7.0, "every stream observed with the full grant");
    assert!(
        !stderr.contains("CAP_SYS_ADMIN"),
        "nothing is missing with the full grant: {stderr}"
    );

    let (socket_only, stderr) = watch_with("+bpf,+perfmon");
    println!("bpf+perfmon: {socket_only} requests\n{stderr}");
    assert_eq!(
        socket_only, 7.0,
        "sockets are traced without CAP_SYS_ADMIN (uprobes are not)"
    );
}

#[test]
fn without_sys_admin_each_uprobe_set_is_one_line_naming_it() {
    let out = setpriv("+bpf,+perfmon")
        .args([
            "agent",
            "--metrics-listen",
            "off",
            "--duration",
            "1s",
            "--nvml",
            "off",
        ])
        .output()
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stderr}");
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("CAP_SYS_ADMIN"))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("TLS plaintext (OpenSSL) not traced: uprobes need CAP_SYS_ADMIN")),
        "the TLS uprobes say what they need, once: {lines:?}"
    );
    assert!(
        lines.len() <= 2,
        "one line per uprobe set (TLS, GPU), not one per symbol: {lines:?}"
    );
}

#[test]
fn without_cap_bpf_or_cap_perfmon_the_agent_names_the_missing_one_in_one_line() {
    for (caps, missing) in [("+perfmon", "CAP_BPF"), ("+bpf", "CAP_PERFMON")] {
        let out = setpriv(caps)
            .args(["agent", "--metrics-listen", "off", "--duration", "1s"])
            .output()
            .expect("run the agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("{caps}: {stderr}");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{caps}: exit status 2 (cannot host the probes)"
        );
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{caps}: one line: {lines:?}");
        assert!(
            lines[0].contains(&format!("no {missing}")),
            "{caps}: the line names {missing}: {}",
            lines[0]
        );
    }
}
