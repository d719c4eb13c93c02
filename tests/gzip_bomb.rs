//! Privileged: a gzip bomb on a traced event stream. Real nginx serves 1 GiB of zeros,
//! gzip-compressed, as a `text/event-stream` with `Content-Encoding: gzip` in 4 KiB
//! writes (so the recorder captures every byte and inflates as it goes), between
//! ordinary token streams through the same nginx. The recorder inflates the bomb to
//! its limit and no further (counted in the report), and the streams around it are
//! read whole.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::process::Command;

use test_support::*;

const STREAMS: usize = 3;

fn stream(port: u16) -> String {
    let body = r#"{"model":"lab-model","prompt":"hello","max_tokens":8,"stream":true}"#;
    let (_, out) = curl(&[
        "-sN",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
        &format!("http://127.0.0.1:{port}/v1/completions"),
    ]);
    out
}

#[test]
fn a_gzip_bomb_is_cut_at_the_inflate_limit_and_the_streams_around_it_are_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bomb = dir.path().join("bomb.gz");
    let made = Command::new("sh")
        .arg("-c")
        .arg("head -c 1073741824 /dev/zero | gzip -1 > \"$0\"")
        .arg(&bomb)
        .status()
        .expect("sh");
    assert!(made.success(), "gzip the bomb");
    let compressed = std::fs::metadata(&bomb).unwrap().len();

    let (rt, engine, nginx) = engine_behind_nginx_with(
        dir.path(),
        &format!(
            "location = /bomb {{ alias {}; default_type text/event-stream; \
             add_header Content-Encoding gzip; gzip off; sendfile off; output_buffers 1 4k; }}",
            bomb.display()
        ),
    );
    let port = nginx.http_port;
    let rec = Recorder::start(dir.path(), &["--port", &port.to_string()]);
    let before: Vec<String> = (0..STREAMS).map(|_| stream(port)).collect();
    let (_, got) = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download}",
        &format!("http://127.0.0.1:{port}/bomb"),
    ]);
    assert_eq!(
        got.trim(),
        compressed.to_string(),
        "curl took the whole bomb"
    );
    let after: Vec<String> = (0..STREAMS).map(|_| stream(port)).collect();
    let path = rec.path.clone();
    let said = rec.stop();
    drop(nginx);
    rt.block_on(engine.shutdown());
    for out in before.iter().chain(&after) {
        assert!(out.contains("[DONE]"), "each stream ran to its end: {out}");
    }

    let report = report_json(&path);
    // Cut once per end that inflated it: nginx's send side, and curl's read side when
    // its first reads were captured whole (8 MiB of zeros inflate from ~8 KB of gzip -1;
    // a larger first read is captured in part and not inflated). CI saw both.
    let cuts = report["protocols"]["limits"]["inflate"].as_u64();
    assert!(
        matches!(cuts, Some(1 | 2)),
        "the bomb was cut at the limit, at one or both ends: {} (recorder said: {said})",
        report["protocols"]
    );
    let requests = report["requests"].as_array().expect("requests");
    let streams: Vec<&serde_json::Value> = requests
        .iter()
        .filter(|r| r["path"] == "/v1/completions")
        .collect();
    assert_eq!(streams.len(), 2 * STREAMS, "every stream around the bomb");
    for r in &streams {
        let client = point(r, "client_read").expect("client read point");
        assert_eq!(
            client["token_ns"].as_array().map(Vec::len),
            Some(8),
            "request {}: its 8 tokens are read whole",
            r["id"]
        );
    }
    let out = Command::new(profiler())
        .arg("report")
        .arg(&path)
        .output()
        .expect("tokenscope report");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = format!(
        "limit: gzip streams cut at the 8 MiB inflate limit: {} (their events past it are not read)",
        cuts.unwrap_or(0)
    );
    assert!(text.contains(&line), "{line}\n{text}");
}
