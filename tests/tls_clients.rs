//! Privileged: real Python HTTP/2 clients over TLS through nginx to the lab engine.
//! The official openai SDK (httpx + h2, OpenSSL through Python's ssl module): its own
//! SSL_read gives the client-read point, timed as the SDK timed it. And a recording
//! that starts while HTTP/2 streams are already running on a connection: later
//! streams are decoded with their paths, earlier ones timed and counted as attached
//! mid-connection, nothing made up.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use collector::analyze::percentile;
use serde_json::Value;
use test_support::*;

fn python() -> PathBuf {
    test_support::pyvenv::python_for(test_support::venv_specs::OPENAI_H2)
}

fn client_script(name: &str) -> String {
    format!("{}/tests/clients/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs a client script of tests/clients (argv: base URL, API key, requests, max
/// tokens 16) over HTTP/2 + TLS through nginx to the lab engine while recording; what
/// it printed (one JSON array) and the recording.
fn sdk_recorded(dir: &Path, script: &str, requests: usize) -> (Vec<Value>, PathBuf) {
    let python = python();
    let (rt, engine, nginx) = engine_behind_nginx(dir);
    let ports = [engine.addr().port().to_string(), nginx.h2_port.to_string()];
    let rec = Recorder::start(dir, &["--port", &ports[0], "--port", &ports[1]]);
    let out = Command::new(&python)
        .arg(client_script(script))
        .arg(format!("https://127.0.0.1:{}/v1", nginx.h2_port))
        .arg("sk-SECRET-sdk-key-5150")
        .arg(requests.to_string())
        .arg("16")
        .output()
        .expect("run the openai SDK");
    let path = rec.path.clone();
    rec.stop();
    drop(nginx);
    rt.block_on(engine.shutdown());
    assert!(
        out.status.success(),
        "the SDK client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sdk = serde_json::from_slice(&out.stdout).expect("the client prints JSON");
    (sdk, path)
}

#[test]
fn openai_sdk_over_http2_gets_its_client_read_point_from_its_own_ssl_read() {
    const REQUESTS: usize = 12;
    let dir = tempfile::tempdir().expect("tempdir");
    let (sdk, path) = sdk_recorded(dir.path(), "openai_sdk_h2.py", REQUESTS);
    assert!(
        sdk.iter().all(|r| r["http_version"] == "HTTP/2"),
        "httpx spoke HTTP/2: {sdk:?}"
    );

    let report = report_json(&path);
    let requests: Vec<&Value> = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .collect();
    assert_eq!(
        (report["requests"].as_array().unwrap().len(), requests.len()),
        (REQUESTS, REQUESTS),
        "every SDK request once, none made of control frames"
    );
    // Sequential requests: pair them in order.
    let mut requests = requests;
    requests.sort_by_key(|r| ns(&r["first_byte_ns"]));
    let (mut first_err, mut itl_err, mut start_gap) = (Vec::new(), Vec::new(), Vec::new());
    let mut sdk_work = Vec::new();
    for (r, s) in requests.iter().zip(&sdk) {
        let client = point(r, "client_read").unwrap_or_else(|| {
            panic!("request {} has the SDK's client-read point: {r:#}", r["id"])
        });
        assert!(
            client["comm"].as_str().unwrap().starts_with("python"),
            "the client-read point is the SDK's process: {}",
            client["comm"]
        );
        assert_eq!(r["http2"], true);
        let ours: Vec<u64> = client["token_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(ns)
            .collect();
        let theirs: Vec<u64> = s["token_ns"].as_array().unwrap().iter().map(ns).collect();
        assert_eq!(
            ours.len(),
            theirs.len(),
            "token count of request {}",
            r["id"]
        );
        // The first token: one event (the client's read of it) on one clock, twice.
        first_err.push(ours[0].abs_diff(theirs[0]));
        sdk_work.push(ns(&s["chunk_ns"][0]).saturating_sub(theirs[0]));
        let gaps = |t: &[u64]| t.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
        itl_err.extend(
            gaps(&ours)
                .iter()
                .zip(gaps(&theirs))
                .map(|(a, b)| a.abs_diff(b)),
        );
        // What the SDK spends before its first request byte (building the request):
        // inside its own TTFT, before anything reaches a socket.
        start_gap.push(ns(&r["start_ns"]).saturating_sub(ns(&s["start_ns"])));
    }
    let pre = percentile(&start_gap, 500);
    let work = percentile(&sdk_work, 500);
    println!("openai SDK: its own work before its first request byte p50 {pre} ns, from its read of the first token to handing it over p50 {work} ns");
    assert_within_a_millisecond(
        "the openai SDK over HTTP/2 (client read vs its own reads)",
        "first token",
        first_err,
        itl_err,
    );
    assert_no_secrets_in_outputs(
        &path,
        dir.path(),
        &["sk-SECRET-sdk-key-5150", "SECRET-sdk-prompt"],
    );
}

/// Token times per choice, in the order choices first appear.
fn series(times: &[u64], choices: &[u64]) -> Vec<Vec<u64>> {
    let mut order: Vec<u64> = Vec::new();
    let mut out: Vec<Vec<u64>> = Vec::new();
    for (t, c) in times.iter().zip(choices) {
        let slot = order.iter().position(|o| o == c).unwrap_or_else(|| {
            order.push(*c);
            out.push(Vec::new());
            out.len() - 1
        });
        out[slot].push(*t);
    }
    out
}

#[test]
fn openai_sdk_responses_and_two_choices_are_timed_per_choice_as_the_sdk_saw_them() {
    const REQUESTS: usize = 12;
    let dir = tempfile::tempdir().expect("tempdir");
    let (sdk, path) = sdk_recorded(dir.path(), "openai_sdk_apis.py", REQUESTS);
    let report = report_json(&path);
    let mut requests: Vec<&Value> = report["requests"].as_array().unwrap().iter().collect();
    assert_eq!(requests.len(), REQUESTS, "every SDK request once");
    requests.sort_by_key(|r| ns(&r["first_byte_ns"]));
    let (mut first_err, mut itl_err) = (Vec::new(), Vec::new());
    let mut worst = None;
    for (r, s) in requests.iter().zip(&sdk) {
        let (api, choices) = match s["call"].as_str() {
            Some("responses") => ("openai-responses", 1),
            _ => ("openai-chat", 2),
        };
        assert_eq!(r["api"], api, "request {} named by its events", r["id"]);
        let client = point(r, "client_read").expect("the SDK's client-read point");
        let ours_t: Vec<u64> = client["token_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(ns)
            .collect();
        let ours_c: Vec<u64> = client["token_choice"]
            .as_array()
            .map_or_else(|| vec![0; ours_t.len()], |c| c.iter().map(ns).collect());
        let theirs_t: Vec<u64> = s["token_ns"].as_array().unwrap().iter().map(ns).collect();
        let theirs_c: Vec<u64> = s["choice"].as_array().unwrap().iter().map(ns).collect();
        assert_eq!(ours_c, theirs_c, "request {}: each token's choice", r["id"]);
        let (ours, theirs) = (series(&ours_t, &ours_c), series(&theirs_t, &theirs_c));
        assert_eq!(
            ours.len(),
            choices,
            "request {}: a token stream per choice",
            r["id"]
        );
        first_err.push(ours_t[0].abs_diff(theirs_t[0]));
        // Which side was late when the check fails (it failed ~1 in 30 runs, with
        // either ring reader): the largest per-token difference, signed.
        for (k, (o, t)) in ours_t.iter().zip(&theirs_t).enumerate() {
            let d = *o as i64 - *t as i64;
            if worst.is_none_or(|(w, _, _): (i64, u64, usize)| d.abs() > w.abs()) {
                worst = Some((d, ns(&r["id"]), k));
            }
        }
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a.len(), b.len(), "request {}: tokens of a choice", r["id"]);
            let gaps = |t: &[u64]| t.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
            itl_err.extend(gaps(a).iter().zip(gaps(b)).map(|(x, y)| x.abs_diff(y)));
        }
    }
    if let Some((d, id, k)) = worst {
        println!(
            "largest token time difference: ours - the SDK's = {d} ns (request {id}, token {k})"
        );
    }
    assert_within_a_millisecond(
        "the openai SDK's Responses and n=2 chat streams (client read vs its own reads)",
        "first token",
        first_err,
        itl_err,
    );
    assert_no_secrets_in_outputs(
        &path,
        dir.path(),
        &["sk-SECRET-sdk-key-5150", "SECRET-sdk-prompt"],
    );
}

#[test]
fn recording_that_starts_mid_connection_decodes_later_streams_and_times_earlier_ones() {
    let protocols = late_attach(8, 4);
    assert!(
        protocols["h2_unknown_headers"].as_u64().unwrap() > 0,
        "header fields that referred to the table before the recording are counted: {protocols}"
    );
}

/// asyncio's TLS runs over memory BIOs: a write on a session older than the recording
/// runs no socket I/O inside the call, and on an idle connection no read has tied the
/// session to its socket yet. The write is held until its thread's next send.
#[test]
fn recording_that_starts_on_an_idle_asyncio_connection_sees_its_first_writes() {
    let protocols = late_attach(0, 4);
    assert_eq!(
        protocols["tls_untied"], 0,
        "every plaintext call tied to its socket: {protocols}"
    );
}

/// Runs late_attach_h2.py with `early` streams running (or, with none, one finished)
/// on its connection before the recording starts and `late` ones after; checks every
/// stream is in the report as it should be, and returns the report's `protocols`.
fn late_attach(early: usize, late: usize) -> Value {
    let python = python();
    let dir = tempfile::tempdir().expect("tempdir");
    let (rt, engine, nginx) = engine_behind_nginx(dir.path());
    let mut client = Command::new(&python)
        .arg(client_script("late_attach_h2.py"))
        .arg(format!("https://127.0.0.1:{}", nginx.h2_port))
        .arg(early.to_string())
        .arg(late.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the HTTP/2 client");
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(
        first, "EARLY-STREAMING",
        "the early streams run before the recording"
    );
    let ports = [engine.addr().port().to_string(), nginx.h2_port.to_string()];
    let rec = Recorder::start(dir.path(), &["--port", &ports[0], "--port", &ports[1]]);
    writeln!(client.stdin.take().unwrap(), "go").expect("tell the client to go on");
    let summary = lines.next().and_then(Result::ok).unwrap_or_default();
    let status = client.wait().expect("client exit");
    let path = rec.path.clone();
    rec.stop();
    drop(nginx);
    rt.block_on(engine.shutdown());
    assert!(status.success(), "the client failed; stdout: {summary}");
    let counts: Value = serde_json::from_str(&summary).expect("the client prints JSON");

    let report = report_json(&path);
    let requests = report["requests"].as_array().unwrap();
    if let Ok(keep) = std::env::var("TOKENSCOPE_KEEP_RECORDING") {
        std::fs::copy(&path, keep).expect("keep the recording");
    }
    let later: Vec<&Value> = requests
        .iter()
        .filter(|r| r["path"] == "/v1/completions")
        .collect();
    assert_eq!(
        later.len(),
        late,
        "every later stream decoded with its path"
    );
    for (r, n) in later.iter().zip(counts["late"].as_array().unwrap()) {
        assert_eq!(r["attached_mid"], false);
        assert_eq!(r["method"], "POST");
        let client = point(r, "client_read")
            .unwrap_or_else(|| panic!("a later stream's client read: {r:#}"));
        assert_eq!(
            &client["token_ns"].as_array().unwrap().len(),
            &(n.as_u64().unwrap() as usize)
        );
        assert!(
            point(r, "engine_write").is_some(),
            "joined to the engine: {r:#}"
        );
    }
    let attached: Vec<&Value> = requests
        .iter()
        .filter(|r| r["attached_mid"] == true)
        .collect();
    assert_eq!(
        attached.len(),
        early,
        "the streams open before the recording, each once: {:#?}",
        requests
            .iter()
            .map(|r| (&r["path"], &r["attached_mid"]))
            .collect::<Vec<_>>()
    );
    for r in &attached {
        assert_eq!(
            r["path"], "",
            "an attached stream's path is unknown, not made up"
        );
        let tokens = point(r, "client_read").map_or(0, |p| p["token_ns"].as_array().unwrap().len());
        assert!(tokens > 0, "an attached stream's tokens are timed: {r:#}");
    }
    assert_eq!(
        requests.len(),
        early + late,
        "nothing else became a request"
    );
    let protocols = report["protocols"].clone();
    println!("late attach: {protocols}");
    protocols
}
