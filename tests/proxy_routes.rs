//! Privileged: one real nginx, three locations to the lab engine: `/buf/` with
//! `proxy_buffering on` and small buffers, `/stream/` streaming, `/gz/` with `gzip on` for
//! event streams (every client accepts gzip there). The buffering rule fires for `/buf/` only and the gzip
//! rule for `/gz/` only, each naming its location: a process that mixes behaviours is
//! diagnosed per route, never averaged away.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::EngineConfig;

/// The three locations, proxied to `up` (the prefix is stripped upstream). The two that
/// hold tokens keep nginx's defaults upstream (HTTP/1.0, close-delimited, buffered), as
/// an untuned gateway does; `/stream/` is tuned.
fn locations(up: std::net::SocketAddr) -> String {
    let held = format!("proxy_pass http://{up}/; proxy_http_version 1.0; proxy_buffering on;");
    format!(
        "location /buf/ {{ {held} proxy_buffer_size 4k; proxy_buffers 4 4k; }} \
         location /stream/ {{ proxy_pass http://{up}/; proxy_http_version 1.1; \
         proxy_set_header Connection \"\"; proxy_buffering off; }} \
         location /gz/ {{ {held} gzip on; gzip_proxied any; gzip_types text/event-stream; }}"
    )
}

fn diagnoses_of(report: &Value, rule: u64) -> Vec<(String, String)> {
    report["diagnoses"]
        .as_array()
        .expect("diagnoses")
        .iter()
        .filter(|d| d["rule"] == rule)
        .map(|d| {
            (
                d["scope"].as_str().unwrap_or("").to_string(),
                d["finding"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn buffering_and_gzip_are_diagnosed_in_the_location_that_has_them() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = lab_engine(&rt, EngineConfig::default());
    let nginx = Nginx::start(dir.path(), &locations(engine.addr()));
    let ports = [
        engine.addr().port().to_string(),
        nginx.http_port.to_string(),
    ];
    let rec = Recorder::start(dir.path(), &["--port", &ports[0], "--port", &ports[1]]);
    for (prefix, gzip) in [("buf", 0), ("stream", 0), ("gz", 1)] {
        let outcome = rt
            .block_on(bench::run(&BenchConfig {
                url: format!(
                    "http://127.0.0.1:{}/{prefix}/v1/chat/completions",
                    nginx.http_port
                ),
                concurrency: 4,
                requests: Some(8),
                prompt_tokens: 60,
                max_tokens: 48,
                chat: true,
                accept_gzip_every: gzip,
                progress: false,
                timeout: Duration::from_secs(60),
                ..BenchConfig::default()
            }))
            .unwrap_or_else(|e| panic!("bench /{prefix}/: {e}"));
        let failed: Vec<(u16, &Option<String>)> = outcome
            .records
            .iter()
            .filter(|r| !r.ok)
            .map(|r| (r.status, &r.error))
            .collect();
        assert!(
            failed.is_empty(),
            "/{prefix}/: every stream succeeded: {failed:?}"
        );
    }
    let path = rec.path.clone();
    rec.stop();
    drop(nginx);
    rt.block_on(engine.shutdown());

    let report = report_json(&path);
    for (rule, location) in [(2, "/buf/"), (3, "/gz/")] {
        let found = diagnoses_of(&report, rule);
        assert_eq!(
            found.len(),
            1,
            "rule {rule} once, for {location} only: {found:#?}\n{:#}",
            report["diagnoses"]
        );
        let (scope, finding) = &found[0];
        assert!(
            scope.contains(&format!("{location}v1/chat/completions"))
                && scope.starts_with("nginx/"),
            "rule {rule} scoped to nginx's {location}: {scope}"
        );
        assert!(
            finding.contains(&format!("on {location}v1/chat/completions,")),
            "rule {rule}'s finding names the location: {finding}"
        );
    }
}

/// EventSource-style `GET` streams through nginx carry no body to join the proxy's two
/// sides by. Where nginx keeps the path (`/v1/`), method and path join them; where it
/// strips a prefix (`/events/` -> `/`), the response's first events and time order do,
/// and the request says `join: by-response`. Each request appears once, joined from curl
/// to the engine, with the proxy's hold (the gateway stage) measured.
#[test]
fn get_streams_without_a_body_are_joined_end_to_end() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = lab_engine(&rt, EngineConfig::default());
    let up = engine.addr();
    let stream = "proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off;";
    let nginx = Nginx::start(
        dir.path(),
        &format!(
            "location /events/ {{ proxy_pass http://{up}/; {stream} }} \
             location /v1/ {{ proxy_pass http://{up}; {stream} }}"
        ),
    );
    let ports = [up.port().to_string(), nginx.http_port.to_string()];
    let rec = Recorder::start(dir.path(), &["--port", &ports[0], "--port", &ports[1]]);
    const EACH: usize = 6;
    let curls: Vec<std::process::Child> = ["events/v1", "v1"]
        .iter()
        .flat_map(|prefix| (0..EACH).map(move |i| (prefix, i)))
        .map(|(prefix, i)| {
            std::process::Command::new("curl")
                .args(["-sSN", "--fail"])
                .arg(format!(
                    "http://127.0.0.1:{}/{prefix}/completions?prompt=get+stream+{prefix}+{i}&max_tokens=12",
                    nginx.http_port
                ))
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("curl")
        })
        .collect();
    for c in curls {
        let out = c.wait_with_output().expect("curl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("data: [DONE]"),
            "curl streamed to the end: {text}"
        );
    }
    let path = rec.path.clone();
    rec.stop();
    drop(nginx);
    rt.block_on(engine.shutdown());

    let report = report_json(&path);
    let requests = report["requests"].as_array().expect("requests");
    for (prefix, join) in [
        ("/events/v1/completions", Some("by-response")),
        ("/v1/completions", None),
    ] {
        let mine: Vec<&Value> = requests
            .iter()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
            .collect();
        assert_eq!(mine.len(), EACH, "{prefix}: each GET once: {mine:#?}");
        for r in mine {
            assert_eq!(r["method"], "GET");
            assert_eq!(
                point_kinds(r),
                ["client_read", "proxy_write", "proxy_read", "engine_write"],
                "{prefix}: request {} joined from curl to the engine",
                r["id"]
            );
            assert_eq!(r["join"].as_str(), join, "{prefix}: how it was joined");
            assert_eq!(
                tokens_at(r, "client_read"),
                tokens_at(r, "engine_write"),
                "{prefix}: every token at both ends"
            );
            assert!(
                r["stages"]["gateway_ns"].as_u64().is_some(),
                "{prefix}: the proxy's hold is a stage: {}",
                r["stages"]
            );
        }
    }
    check_report_schema(&report).expect("schema");
}
