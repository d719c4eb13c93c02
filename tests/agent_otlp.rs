//! OTLP traces from `tokenscope agent`, decoded by the official opentelemetry-proto
//! schema (test-support's receiver, Python): first what the exporter sends for a request
//! built by hand (no privileges), then privileged, the agent watching the lab engine:
//! one trace per request whose stage spans last what `report` says of the same requests
//! in the agent's own recordings, a traceparent joined, no planted secret anywhere; and
//! a collector down for 30 s: the agent keeps running in bounded memory, drops and
//! counts, and its spans flow once the collector is back.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use collector::stitch::request::Forward;
use collector::stitch::{PointKind, Request};
use serde_json::Value;
use test_support::agent::Agent;
use test_support::http::{curl_status, words};
use test_support::otlp::{roots, Receiver};
use test_support::{free_port, lab_engine, report_json, runtime};
use tokenscope_agent::otlp::{Exporter, OtlpConfig};
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::EngineConfig;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";
const SECRETS: [&str; 2] = ["sk-planted-SECRET-123", "PLANTED-PROMPT-456"];

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// The value of an unlabelled counter in /metrics text (`NAME VALUE`).
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("/metrics has {name}"))
}

/// The spans of each trace, by trace id.
fn traces(spans: &[Value]) -> HashMap<String, Vec<&Value>> {
    let mut t: HashMap<String, Vec<&Value>> = HashMap::new();
    for s in spans {
        let id = s["trace_id"].as_str().expect("a trace id").to_string();
        t.entry(id).or_default().push(s);
    }
    t
}

fn duration_ns(span: &Value) -> u64 {
    let end = span["end_time_unix_nano"].as_u64().expect("end");
    let start = span["start_time_unix_nano"].as_u64().expect("start");
    end - start
}

fn exporter(endpoint: String) -> Exporter {
    Exporter::start(OtlpConfig {
        endpoint,
        queue_spans: 1000,
        batch_spans: 100,
        batch_delay: Duration::from_millis(50),
        timeout: Duration::from_secs(10),
        service_name: "agent-otlp-test".into(),
        host_name: "test-host".into(),
    })
    .expect("exporter")
}

/// A request seen at the client and at the engine, carrying a traceparent.
fn hand_built() -> Request {
    let ms = 1_000_000;
    let t0 = collector::clock::monotonic_ns() - 10_000 * ms;
    let engine: Vec<u64> = (0..10).map(|i| t0 + 40 * ms + i * 7 * ms).collect();
    let client: Vec<u64> = engine.iter().map(|t| t + ms).collect();
    let mut r = Request::at_point(0, PointKind::ClientRead, 10, "client", client);
    r.start_ns = t0;
    r.first_byte_ns = t0;
    r.trace_parent = Some(format!("00-{TRACE}-{PARENT}-01"));
    r.host = Some("127.0.0.1:8000".into());
    r.status = Some(200);
    r.api = Some("openai-chat");
    r.path = "/v1/chat/completions".into();
    r.engine_received_ns = Some(t0 + 2 * ms);
    r.stages.upload_ns = Some(2 * ms);
    r.stages.upstream_wait_ns = Some(38 * ms);
    r.points[0].ttft_ns = Some(41 * ms);
    let mut e = r.points[0].clone();
    e.kind = PointKind::EngineWrite;
    e.token_ns = engine;
    e.ttft_ns = Some(40 * ms);
    r.points.push(e);
    r.forward = vec![Forward::between(&r.points, 0)];
    r
}

#[test]
fn the_official_schema_decodes_every_field_the_exporter_sends() {
    let receiver = Receiver::start(0);
    let x = exporter(receiver.endpoint());
    x.export(&hand_built());
    let stats = x.shutdown(Duration::from_secs(10));
    let spans = receiver.spans();
    assert_eq!(
        (stats.spans_exported, stats.requests_exported),
        (spans.len() as u64, 1)
    );
    let names: Vec<&str> = spans.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "POST /v1/chat/completions",
            "upload",
            "engine wait",
            "decode",
            "client read",
            "engine write"
        ]
    );
    let root = &spans[0];
    assert_eq!(root["path"], "/v1/traces");
    assert_eq!(root["content_type"], "application/x-protobuf");
    assert_eq!(root["resource"]["service.name"], "agent-otlp-test");
    assert_eq!(root["resource"]["host.name"], "test-host");
    assert_eq!(root["scope"]["name"], "tokenscope");
    assert_eq!(root["kind"], 2, "SPAN_KIND_SERVER");
    assert_eq!(root["parent_span_id"], PARENT, "under the caller's span");
    assert_eq!(root["flags"], 0x301);
    for s in &spans {
        assert_eq!(s["trace_id"], TRACE, "{}: the caller's trace", s["name"]);
        assert_eq!(s["span_id"].as_str().map(str::len), Some(16));
    }
    // Types as the schema reads them: ints, doubles, bools and strings.
    assert_eq!(attr(root, "gen_ai.operation.name"), "chat");
    assert_eq!(attr(root, "http.response.status_code"), 200);
    assert_eq!(attr(root, "server.port"), 8000);
    assert_eq!(attr(root, "tokenscope.new_connection"), false);
    let ttft = attr(root, "gen_ai.response.time_to_first_chunk");
    assert_eq!(ttft.as_f64(), Some(0.041), "a double, in seconds: {ttft}");
    let engine = &spans[5];
    let events: Vec<&str> = engine["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(events, ["first_token", "gap", "gap", "gap", "last_token"]);
    assert_eq!(
        engine["events"][1]["attributes"]["tokenscope.gap_s"].as_f64(),
        Some(0.007)
    );
    assert_eq!(duration_ns(&spans[2]), 38_000_000, "engine wait");
}

/// Every request `tokenscope report --json` finds in the agent's rotated recordings.
fn reported(dir: &Path) -> Vec<Value> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("the record dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tsrec"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the agent kept a recording in {dir:?}");
    files
        .iter()
        .flat_map(|f| {
            report_json(f)["requests"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect()
}

/// A reported request as JSON with its points' token arrays left out (a failure's
/// context, not its thousands of numbers).
fn without_tokens(r: &Value) -> String {
    let mut r = r.clone();
    for p in r["points"].as_array_mut().into_iter().flatten() {
        if let Some(n) = p["token_ns"].as_array().map(Vec::len) {
            p["token_ns"] = Value::from(format!("({n} left out)"));
        }
    }
    r.to_string()
}

/// The recordings in `dir` copied where a failed run leaves them (the test's own
/// temporary directory goes when it unwinds).
fn kept(dir: &Path) -> std::path::PathBuf {
    let to = tempfile::Builder::new()
        .prefix("agent_otlp-recordings-")
        .tempdir()
        .expect("tempdir")
        .keep();
    for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let _ = std::fs::copy(f.path(), to.join(f.file_name()));
    }
    to
}

/// A streaming completion sent by curl (as an application would) with headers bench
/// does not send: a traceparent, a bearer key and a planted prompt.
fn curl_with_traceparent(port: u16) {
    let body = format!(
        r#"{{"model":"lab-model","prompt":"{} {}","max_tokens":8,"stream":true}}"#,
        SECRETS[1],
        words(6, "traced")
    );
    let (code, text) = curl_status(&[
        "-N",
        "-H",
        "content-type: application/json",
        "-H",
        &format!("traceparent: 00-{TRACE}-{PARENT}-01"),
        "-H",
        &format!("Authorization: Bearer {}", SECRETS[0]),
        "-d",
        &body,
        &format!("http://127.0.0.1:{port}/v1/completions"),
    ]);
    assert_eq!(code, 200, "the traced request streamed: {text}");
}

/// Stage spans against the report's stages of the same request.
const STAGES: [(&str, &str); 5] = [
    ("connect", "connect_ns"),
    ("tls", "tls_ns"),
    ("upload", "upload_ns"),
    ("gateway", "gateway_ns"),
    ("engine wait", "upstream_wait_ns"),
];

#[test]
fn every_request_is_one_trace_whose_spans_last_what_the_report_says() {
    let rt = runtime();
    let engine = lab_engine(&rt, EngineConfig::default());
    let port = engine.addr().port();
    let receiver = Receiver::start(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let agent = Agent::start(&[
        "--port",
        &port.to_string(),
        "--gpu",
        "off",
        "--otlp-endpoint",
        &receiver.endpoint(),
        "--record-dir",
        dir.path().to_str().expect("a UTF-8 temp path"),
    ]);
    const BENCH: usize = 12;
    let outcome = rt
        .block_on(bench::run(&BenchConfig {
            url: format!("http://{}/v1/completions", engine.addr()),
            concurrency: 3,
            requests: Some(BENCH as u64),
            prompt_tokens: 30,
            max_tokens: 24,
            progress: false,
            timeout: Duration::from_secs(60),
            api_key: Some(bench::ApiKey(SECRETS[0].into())),
            ..BenchConfig::default()
        }))
        .expect("bench");
    assert!(
        outcome.records.iter().all(|r| r.ok),
        "every bench request succeeded"
    );
    curl_with_traceparent(port);
    let want = BENCH + 1;
    receiver.wait_for("a root span per request", Duration::from_secs(60), |s| {
        roots(s).len() >= want
    });
    let stderr = agent.stop();
    rt.block_on(engine.shutdown());
    let spans = receiver.spans();
    let traces = traces(&spans);
    assert_eq!(
        (roots(&spans).len(), traces.len()),
        (want, want),
        "one trace, one root, per request (12 by bench, 1 by curl), none more; agent: {stderr}"
    );
    println!(
        "{} spans for {want} requests ({:.1} a request)",
        spans.len(),
        spans.len() as f64 / want as f64
    );

    // The traceparent: its trace, under its span.
    let joined = &traces[TRACE];
    let root = roots(&spans)
        .into_iter()
        .find(|s| s["trace_id"] == TRACE)
        .expect("the traced request's root");
    assert_eq!(
        root["parent_span_id"], PARENT,
        "the root hangs under the caller's span"
    );
    assert!(
        joined.len() >= 4,
        "the traced request has its stages and points: {joined:?}"
    );

    // Stage spans last what the report of the agent's own recordings says.
    let report = reported(dir.path());
    let by_start: HashMap<u64, &Value> = report
        .iter()
        .filter_map(|r| Some((r["start_ns"].as_u64()?, r)))
        .collect();
    let mut compared = 0;
    for root in roots(&spans) {
        let start = attr(root, "tokenscope.start_monotonic_ns")
            .as_u64()
            .expect("tokenscope.start_monotonic_ns");
        let r = by_start
            .get(&start)
            .unwrap_or_else(|| panic!("the report has the request that started at {start}"));
        assert_eq!(attr(root, "gen_ai.operation.name"), "text_completion");
        let tokens = |p: &Value| -> Vec<u64> {
            let t = p["token_ns"]
                .as_array()
                .expect("report --tokens lists token_ns");
            t.iter().filter_map(Value::as_u64).collect()
        };
        let first = tokens(&r["points"][0]);
        assert_eq!(
            attr(root, "tokenscope.tokens").as_u64(),
            Some(first.len() as u64)
        );
        let children = &traces[root["trace_id"].as_str().expect("trace id")];
        for (span, stage) in STAGES {
            let got = children
                .iter()
                .find(|s| s["name"] == span)
                .map(|s| duration_ns(s));
            let want = r["stages"][stage].as_u64();
            if got != want {
                panic!(
                    "{span} span against the report's {stage} (request at {start}): {got:?} \
                     vs {want:?}; its spans (name, start, ns): {:?}; the report's request, \
                     token arrays left out: {}; the agent's recordings kept in {}",
                    children
                        .iter()
                        .map(|s| (&s["name"], &s["start_time_unix_nano"], duration_ns(s)))
                        .collect::<Vec<_>>(),
                    without_tokens(r),
                    kept(dir.path()).display()
                );
            }
            compared += usize::from(want.is_some());
        }
        for p in r["points"].as_array().expect("points") {
            let label = p["kind"].as_str().expect("kind").replace('_', " ");
            let span = children
                .iter()
                .find(|s| s["name"] == label.as_str())
                .unwrap_or_else(|| panic!("a span for the {label} point"));
            let ttft = attr(span, "tokenscope.ttft_s").as_f64().expect("ttft");
            let want = p["ttft_ns"].as_u64().expect("ttft_ns") as f64 / 1e9;
            assert!(
                (ttft - want).abs() < 1e-9,
                "{label} TTFT {ttft} s, report {want} s"
            );
            // From the request's start to the last token there; tokens summed up as
            // events: first, the three longest gaps, last.
            let t = tokens(p);
            let start_ns = r["start_ns"].as_u64().expect("start_ns");
            assert_eq!(duration_ns(span), t[t.len() - 1] - start_ns, "{label} span");
            let events = span["events"].as_array().expect("events");
            let at = |e: &Value| e["time_unix_nano"].as_u64().expect("event time");
            assert_eq!(
                events.len(),
                2 + (t.len() - 1).min(3),
                "{label}: {events:?}"
            );
            assert_eq!(
                at(&events[events.len() - 1]) - at(&events[0]),
                t[t.len() - 1] - t[0],
                "{label}: first_token to last_token"
            );
            let mut gaps: Vec<u64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            gaps.sort_unstable_by(|a, b| b.cmp(a));
            let mut want_gaps: Vec<f64> = gaps.iter().take(3).map(|&g| g as f64 / 1e9).collect();
            let mut got_gaps: Vec<f64> = events
                .iter()
                .filter(|e| e["name"] == "gap")
                .filter_map(|e| e["attributes"]["tokenscope.gap_s"].as_f64())
                .collect();
            want_gaps.sort_by(f64::total_cmp);
            got_gaps.sort_by(f64::total_cmp);
            assert_eq!(got_gaps, want_gaps, "{label}: the three longest gaps");
        }
    }
    assert!(
        compared >= 2 * want,
        "upload and engine wait at least, every request"
    );

    // Nothing the client sent, but ids: no key, no prompt.
    let text = serde_json::to_string(&spans).expect("json");
    let raw = receiver.raw();
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret} appears in a span");
        let found = raw.windows(secret.len()).any(|w| w == secret.as_bytes());
        assert!(!found, "{secret} appears in what the agent sent");
    }
}

#[test]
fn a_collector_down_for_30_s_costs_drops_not_memory_and_spans_flow_once_it_is_back() {
    let rt = runtime();
    let engine = lab_engine(&rt, EngineConfig::default());
    let port = engine.addr().port();
    let collector_port = free_port();
    let mut agent = Agent::start(&[
        "--port",
        &port.to_string(),
        "--gpu",
        "off",
        "--otlp-endpoint",
        &format!("http://127.0.0.1:{collector_port}"),
        "--otlp-queue-spans",
        "64",
    ]);
    let load = |secs: u64| BenchConfig {
        url: format!("http://{}/v1/completions", engine.addr()),
        concurrency: 2,
        requests: None,
        duration: Some(Duration::from_secs(secs)),
        rate: Some(4.0),
        prompt_tokens: 20,
        max_tokens: 16,
        progress: false,
        timeout: Duration::from_secs(60),
        ..BenchConfig::default()
    };
    // 30 s of light load with nothing listening, RSS sampled as it runs.
    let outage = load(30);
    let bench = rt.spawn(async move { bench::run(&outage).await });
    let mut rss_kb = Vec::new();
    let began = Instant::now();
    while !bench.is_finished() {
        rss_kb.push(agent.rss_kb());
        std::thread::sleep(Duration::from_secs(1));
    }
    let outcome = rt.block_on(bench).expect("bench task").expect("bench");
    let sent = outcome.records.len();
    let down = agent.metrics();
    let failures = counter(&down, "tokenscope_otlp_export_failures_total");
    let dropped = counter(&down, "tokenscope_otlp_spans_dropped_total");
    let max_rss = rss_kb.iter().copied().max().unwrap_or(0);
    println!(
        "outage of {:.0?}: {sent} requests, {failures} failed exports, {dropped} spans dropped, \
         RSS {} .. {} MB",
        began.elapsed(),
        rss_kb.iter().copied().min().unwrap_or(0) / 1024,
        max_rss / 1024
    );
    assert!(sent > 60, "light load for 30 s: {sent} requests");
    assert!(failures >= 3.0, "the agent kept retrying: {failures}");
    assert!(dropped > 0.0, "a 64-span queue overflowed: {dropped}");
    assert_eq!(
        counter(&down, "tokenscope_otlp_spans_exported_total"),
        0.0,
        "nothing exported while down"
    );
    assert!(
        max_rss < 200 * 1024,
        "RSS stayed under 200 MB: {max_rss} kB"
    );
    assert!(agent.alive(), "the agent runs on through the outage");

    // The collector comes back where the agent sends: the kept batch, then new requests.
    let receiver = Receiver::start(collector_port);
    let held = receiver.wait_for(
        "the spans the agent kept through the outage",
        Duration::from_secs(30),
        |s| !roots(s).is_empty(),
    );
    let held_roots: HashSet<String> = roots(&held)
        .iter()
        .filter_map(|s| s["trace_id"].as_str().map(str::to_string))
        .collect();
    let after = rt
        .block_on(bench::run(&BenchConfig {
            requests: Some(5),
            duration: None,
            rate: None,
            ..load(0)
        }))
        .expect("bench after");
    assert_eq!(after.records.len(), 5);
    let spans = receiver.wait_for("the later requests' traces", Duration::from_secs(30), |s| {
        roots(s).len() >= held_roots.len() + 5
    });
    let up = agent.metrics();
    assert!(agent.alive(), "still running");
    assert!(
        counter(&up, "tokenscope_otlp_requests_exported_total") >= 5.0,
        "{up}"
    );
    let stderr = agent.stop();
    rt.block_on(engine.shutdown());
    let dropped_total = counter(&up, "tokenscope_otlp_spans_dropped_total");
    println!(
        "back: {} spans, {} traces received; {dropped_total} spans dropped in all; agent: {stderr}",
        spans.len(),
        roots(&spans).len()
    );
    assert!(
        roots(&spans).len() <= sent + 5,
        "never more traces than requests"
    );
}
