//! The engine's OpenAI surface over real TCP: SSE framing, errors, the step log and the
//! stand-in libcuda.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use test_support::http::{curl_status, words};
use tokenscope_lab::{Engine, EngineConfig, StepKind};

async fn engine(cfg: EngineConfig) -> Engine {
    Engine::start(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts")
}

fn curl_blocking(args: Vec<String>) -> tokio::task::JoinHandle<(u16, String)> {
    tokio::task::spawn_blocking(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        curl_status(&a)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_sees_vllm_sse_framing_for_both_routes() {
    let e = engine(EngineConfig::default()).await;
    let url = e.base_url();
    let (code, body) = curl_blocking(vec![
        "-N".into(),
        format!("{url}/v1/completions"),
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        r#"{"model":"lab-model","prompt":"hello there lab","max_tokens":5,"stream":true}"#.into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 200, "streaming completion answers 200: {body}");
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 6, "5 token events then [DONE]: {body:?}");
    assert!(
        events.iter().all(|e| e.starts_with("data: ")),
        "every SSE event is `data: ...`: {body:?}"
    );
    assert_eq!(
        events[5], "data: [DONE]",
        "the stream ends with data: [DONE]"
    );
    let first: serde_json::Value = serde_json::from_str(&events[0][6..]).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert!(
        first["choices"][0]["text"].as_str().is_some(),
        "a choice with text"
    );

    let (code, body) = curl_blocking(vec![
        "-N".into(),
        format!("{url}/v1/chat/completions"),
        "-d".into(),
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,
            "stream_options":{"include_usage":true}}"#
            .into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 200, "streaming chat answers 200");
    let events: Vec<&str> = body.split("\n\n").filter(|e| !e.is_empty()).collect();
    // role chunk, 3 tokens, usage, [DONE]
    assert_eq!(
        events.len(),
        6,
        "role + 3 tokens + usage + [DONE]: {body:?}"
    );
    let usage: serde_json::Value = serde_json::from_str(&events[4][6..]).unwrap();
    assert_eq!(
        usage["usage"]["completion_tokens"], 3,
        "usage counts 3 tokens"
    );
    assert_eq!(usage["choices"].as_array().map(Vec::len), Some(0));

    let (_, head) = curl_blocking(vec![
        "-N".into(),
        "-i".into(),
        format!("{url}/v1/completions"),
        "-d".into(),
        r#"{"prompt":"x","max_tokens":2,"stream":true}"#.into(),
    ])
    .await
    .unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("transfer-encoding: chunked")
            && head.contains("content-type: text/event-stream"),
        "HTTP/1.1 streams are chunked text/event-stream: {head}"
    );
    assert!(
        !head.contains("x-accel-buffering"),
        "the engine does not switch proxy buffering off by default"
    );

    let (code, body) = curl_blocking(vec![format!("{url}/v1/models")])
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("lab-model"), "models lists lab-model");
    let (code, _) = curl_blocking(vec![format!("{url}/health")]).await.unwrap();
    assert_eq!(code, 200, "health is 200");
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_json_400s_and_the_server_survives() {
    let e = engine(EngineConfig::default()).await;
    let url = e.base_url();
    for body in [
        "{nope",
        "",
        "[]",
        r#"{"prompt": 12}"#,
        r#"{"prompt": "x", "max_tokens": -1}"#,
        r#"{"prompt": "x", "max_tokens": 1e9}"#,
        r#"{"prompt": "x", "stream": "true"}"#,
    ] {
        let (code, out) = curl_blocking(vec![
            format!("{url}/v1/completions"),
            "-d".into(),
            body.into(),
        ])
        .await
        .unwrap();
        assert_eq!(
            code, 400,
            "malformed body {body:?} must give 400, got {out}"
        );
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|_| panic!("error is JSON: {out}"));
        assert!(
            v["error"]["message"].is_string(),
            "OpenAI error shape: {out}"
        );
    }
    let (code, _) = curl_blocking(vec![
        format!("{url}/v1/chat/completions"),
        "-d".into(),
        r#"{"messages":"hi"}"#.into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 400, "messages must be a list");
    let (code, _) = curl_blocking(vec![
        format!("{url}/v1/completions"),
        "-d".into(),
        r#"{"model":"other","prompt":"x"}"#.into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 404, "unknown model is 404");
    // Still serving after all that.
    let (code, body) = curl_blocking(vec![
        format!("{url}/v1/completions"),
        "-d".into(),
        r#"{"prompt":"a b c","max_tokens":2}"#.into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 200, "a good request still works: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(v["usage"]["prompt_tokens"], 3, "prompt tokens = words");
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stand_in_libcuda_is_called_once_per_step_as_the_step_log_says() {
    let e = engine(EngineConfig {
        chunked_prefill: true,
        max_batched_tokens: 40,
        ..EngineConfig::default()
    })
    .await;
    let url = e.base_url();
    let a = curl_blocking(vec![
        format!("{url}/v1/completions"),
        "-d".into(),
        format!(r#"{{"prompt":"{}","max_tokens":6}}"#, words(100, "a")),
    ]);
    let b = curl_blocking(vec![
        format!("{url}/v1/completions"),
        "-d".into(),
        format!(r#"{{"prompt":"{}","max_tokens":3}}"#, words(5, "b")),
    ]);
    assert_eq!(a.await.unwrap().0, 200);
    assert_eq!(b.await.unwrap().0, 200);
    let counts = e
        .cuda_call_counts()
        .expect("the stand-in exports its counters");
    let steps = e.step_log().snapshot();
    assert!(!steps.is_empty(), "steps were logged");
    let kernels_expected: u64 = steps
        .iter()
        .map(|s| {
            let chunks = s.requests.iter().filter(|r| r.prefill_tokens > 0).count() as u64;
            chunks * e.config().kernels_per_prefill as u64
        })
        .sum();
    let graphs_expected = steps.iter().filter(|s| s.kind != StepKind::Prefill).count() as u64;
    assert_eq!(counts.init, 1, "cuInit once");
    assert_eq!(
        counts.launch_kernel,
        kernels_expected,
        "cuLaunchKernel: {} per prefill chunk in the log",
        e.config().kernels_per_prefill
    );
    assert_eq!(
        counts.graph_launch, graphs_expected,
        "one cuGraphLaunch per decode/mixed step"
    );
    assert_eq!(
        counts.memcpy_dtoh_async,
        steps.len() as u64,
        "one token copy per step"
    );
    assert_eq!(
        counts.stream_synchronize,
        steps.len() as u64,
        "one sync per step"
    );
    assert!(
        steps.iter().any(|s| s.kind == StepKind::Prefill)
            || steps.iter().any(|s| s.kind == StepKind::Mixed),
        "prefill work was logged"
    );
    for s in &steps {
        assert!(
            s.duration_ns() + 1_000_000 >= s.cost_ns,
            "cuStreamSynchronize waits out the step's simulated time: {s:?}"
        );
    }
    let path = e.libcuda_path().to_path_buf();
    assert!(path.ends_with("libcuda.so.1"), "loaded as libcuda.so.1");
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        maps.contains(path.to_str().unwrap()),
        "the engine process maps the stand-in at {}",
        path.display()
    );
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_stream_is_aborted() {
    let e = engine(EngineConfig::default()).await;
    let url = e.base_url();
    // curl gives up after 0.5 s of a 1,000-token stream (~15 s).
    let cut = curl_blocking(vec![
        "-N".into(),
        "-m".into(),
        "0.5".into(),
        format!("{url}/v1/completions"),
        "-d".into(),
        r#"{"prompt":"long one","max_tokens":1000,"stream":true}"#.into(),
    ]);
    let _ = cut.await.unwrap();
    let (code, _) = curl_blocking(vec![
        format!("{url}/v1/completions"),
        "-d".into(),
        r#"{"prompt":"short","max_tokens":2}"#.into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 200, "the engine keeps serving");
    let steps = e.step_log().snapshot();
    let with_cut = steps
        .iter()
        .filter(|s| s.requests.iter().any(|r| r.request_id == 1))
        .count();
    assert!(
        with_cut < 200,
        "the abandoned request stops being scheduled ({with_cut} steps, not ~1000)"
    );
    let last = steps.last().expect("steps were logged");
    assert!(
        last.requests.iter().all(|r| r.request_id != 1),
        "the abandoned request is gone by the time the next one finishes"
    );
    e.shutdown().await;
}
