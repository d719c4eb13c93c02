//! bench --json: one line per request with every timestamp, and never the text.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::words::pseudo_text;
use tokenscope_lab::{Engine, EngineConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_carry_timestamps_and_no_prompt_or_completion_text() {
    let e = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts");
    let cfg = BenchConfig {
        url: e.base_url(),
        concurrency: 2,
        requests: Some(4),
        prompt_tokens: 30,
        shared_prefix: 30,
        max_tokens: 8,
        chat: true,
        progress: false,
        timeout: Duration::from_secs(30),
        ..BenchConfig::default()
    };
    let out = bench::run(&cfg).await.expect("bench runs");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("requests.jsonl");
    bench::write_json_lines(&out.records, &path).expect("writes the file");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(lines.len(), 4, "one line per request");
    for l in &lines {
        for key in [
            "connect_start_ns",
            "request_start_ns",
            "first_byte_ns",
            "end_ns",
            "events",
            "new_connection",
        ] {
            assert!(l.get(key).is_some(), "each line has {key}: {l}");
        }
        let events = l["events"].as_array().unwrap();
        assert_eq!(events.len(), 9, "role chunk + 8 tokens, each timed: {l}");
        assert!(events
            .iter()
            .all(|e| e["t_ns"].as_u64().is_some() && e["read"].as_u64().is_some()));
    }
    // The engine's own record of each request lines up with what the client saw.
    let log = e.request_log();
    for r in &out.records {
        let id = r
            .response_id
            .as_deref()
            .expect("bench keeps the response id");
        let served = log
            .by_response_id(id)
            .unwrap_or_else(|| panic!("the engine logged {id}"));
        assert_eq!(served.token_ns.len(), 8, "8 token writes for {id}");
        assert!(served.finished, "{id} finished");
        assert!(
            served.received_ns >= r.request_start_ns,
            "the engine received {id} after the client sent it"
        );
        assert!(
            served.token_ns[0] <= r.first_token_ns().unwrap(),
            "the engine wrote {id}'s first token before the client read it"
        );
    }
    // The shared prompt's words (bench's system prompt) must not leak into the file.
    let prompt = pseudo_text(0x5157_3731, 30);
    let leaked: Vec<&str> = prompt
        .split(' ')
        .filter(|w| w.len() >= 6 && text.contains(&format!("\"{w}")))
        .collect();
    assert!(
        leaked.is_empty(),
        "prompt words leaked into --json: {leaked:?}"
    );
    assert!(
        !text.contains("\"text\"") && !text.contains("\"delta\""),
        "no text fields"
    );
    e.shutdown().await;
}
