//! Privileged: TLS and HTTP/2 seen through. Real nginx in front of the lab engine,
//! real curl (OpenSSL) as the client: HTTP/1.1 over TLS, HTTP/2 over TLS (ALPN h2)
//! and cleartext HTTP/2 with prior knowledge (h2c). The OpenSSL uprobes give the
//! plaintext at curl and at nginx, the HTTP/2 decoder turns streams into requests,
//! and each request must come out once, joined from curl to the engine, with every
//! token the client received timed at every point, and no secret in any output: the
//! secrets audit plants every kind (Authorization, Proxy-Authorization, Cookie,
//! Set-Cookie, x-api-key, api-key, a query string, the prompt) and checks the
//! completion text too, on every hop and in every output.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::Path;

use serde_json::Value;
use test_support::*;

const AUTH: &str = "sk-SECRET-auth-4411";
const COOKIE: &str = "session=SECRET-cookie-9a9a";
const API_KEY: &str = "SECRET-x-api-key-77";
const QUERY: &str = "SECRET-query-3131";
const PROMPT: &str = "SECRET-prompt-words-of-the-user";
const PROXY_AUTH: &str = "SECRET-proxy-auth-2b2b";
const AZURE_KEY: &str = "SECRET-api-key-header-6c6c";
/// nginx sets it on every response to curl.
const SET_COOKIE: &str = "sid=SECRET-set-cookie-0e0e";
const TOKENS: usize = 12;

/// How curl speaks to nginx.
#[derive(Clone, Copy, Debug)]
enum Wire {
    Http1Tls,
    Http2Tls,
    H2c,
}

/// Streams one chat completion with curl; returns the token events curl received and
/// the completion's text.
fn stream_with_curl(nginx: &Nginx, wire: Wire) -> (usize, String) {
    let (flag, scheme, port) = match wire {
        Wire::Http1Tls => ("--http1.1", "https", nginx.https_port),
        Wire::Http2Tls => ("--http2", "https", nginx.h2_port),
        Wire::H2c => ("--http2-prior-knowledge", "http", nginx.h2c_port),
    };
    let url = format!("{scheme}://127.0.0.1:{port}/v1/chat/completions?key={QUERY}");
    let body = format!(
        "{{\"model\":\"lab-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"{PROMPT} {wire:?}\"}}],\"stream\":true,\"max_tokens\":{TOKENS}}}"
    );
    let (_, out) = curl(&[
        "-sSNk",
        "-D",
        "-", // the response head too: the Set-Cookie secret was on the wire
        flag,
        "-H",
        &format!("Authorization: Bearer {AUTH}"),
        "-H",
        &format!("Cookie: {COOKIE}"),
        "-H",
        &format!("x-api-key: {API_KEY}"),
        "-H",
        &format!("Proxy-Authorization: Basic {PROXY_AUTH}"),
        "-H",
        &format!("api-key: {AZURE_KEY}"),
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &body,
        &url,
    ]);
    let choices: Vec<Value> = out
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["choices"].as_array().is_some_and(|c| !c.is_empty()))
        .collect();
    let tokens = choices.len();
    assert!(
        out.to_ascii_lowercase()
            .contains(&SET_COOKIE.to_ascii_lowercase()),
        "nginx sent Set-Cookie ({wire:?}):\n{out}"
    );
    let text: String = choices
        .iter()
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str())
        .collect();
    // The last choice event carries finish_reason: one more than max_tokens.
    assert!(
        tokens >= TOKENS,
        "curl ({wire:?}) received the stream:\n{out}"
    );
    (tokens, text)
}

/// What of a completion's text must not leave: the whole of it and every run of
/// three tokens' worth of it (long enough never to occur by chance).
fn completion_pieces(text: &str) -> Vec<String> {
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let mut pieces = vec![text.to_string()];
    pieces.extend(words.windows(3).map(|w| w.concat()));
    pieces.retain(|p| p.trim().len() >= 8);
    pieces
}

#[test]
fn curl_over_tls_http2_and_h2c_through_nginx_is_read_in_plaintext_end_to_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (rt, engine, nginx) = engine_behind_nginx_with(
        dir.path(),
        &format!("add_header Set-Cookie \"{SET_COOKIE}\" always;"),
    );
    let up = engine.addr();
    let ports: Vec<String> = [up.port(), nginx.https_port, nginx.h2_port, nginx.h2c_port]
        .iter()
        .map(u16::to_string)
        .collect();
    let mut filter = Vec::new();
    for p in &ports {
        filter.extend(["--port", p.as_str()]);
    }
    let rec = Recorder::start(dir.path(), &filter);
    let wires = [Wire::Http1Tls, Wire::Http2Tls, Wire::H2c];
    let (received, texts): (Vec<usize>, Vec<String>) =
        wires.iter().map(|&w| stream_with_curl(&nginx, w)).unzip();
    let path = rec.path.clone();
    let stderr = rec.stop();
    drop(nginx);
    rt.block_on(engine.shutdown());

    let report = report_json(&path);
    let requests = report["requests"].as_array().expect("requests");
    let described: Vec<String> = requests
        .iter()
        .map(|r| {
            format!(
                "{} {} tls={} http2={} points={:?}",
                r["method"],
                r["path"],
                r["tls"],
                r["http2"],
                point_kinds(r)
            )
        })
        .collect();
    assert_eq!(
        requests.len(),
        wires.len(),
        "one request per curl, none made of control frames: {described:#?}\n{stderr}"
    );
    for ((wire, tls, http2), received) in [
        (Wire::Http1Tls, true, false),
        (Wire::Http2Tls, true, true),
        (Wire::H2c, false, true),
    ]
    .into_iter()
    .zip(received)
    {
        let r = requests
            .iter()
            .find(|r| r["tls"] == tls && r["http2"] == http2)
            .unwrap_or_else(|| panic!("a {wire:?} request in {described:#?}"));
        assert_eq!(
            (r["method"].as_str(), r["path"].as_str()),
            (Some("POST"), Some("/v1/chat/completions")),
            "{wire:?}: decoded head"
        );
        assert_eq!(
            point_kinds(r),
            ["client_read", "proxy_write", "proxy_read", "engine_write"],
            "{wire:?}: joined from curl to the engine"
        );
        for kind in ["client_read", "proxy_write", "proxy_read", "engine_write"] {
            assert_eq!(
                tokens_at(r, kind),
                received,
                "{wire:?}: every token curl received is timed at {kind}"
            );
        }
        assert_eq!(
            r["chunk_mismatches"], 0,
            "{wire:?}: chunks agree across hops"
        );
        assert_eq!(r["encrypted"], false, "{wire:?}: read in plaintext");
        if tls {
            assert!(
                r["stages"]["tls_ns"].as_u64().is_some_and(|t| t > 0),
                "{wire:?}: the TLS handshake is a stage: {}",
                r["stages"]
            );
        }
    }
    let completions: Vec<String> = texts.iter().flat_map(|t| completion_pieces(t)).collect();
    assert!(
        completions.len() > 3 * wires.len(),
        "curl received completion text: {texts:?}"
    );
    let mut secrets = vec![
        AUTH, COOKIE, API_KEY, QUERY, PROMPT, PROXY_AUTH, AZURE_KEY, SET_COOKIE,
    ];
    secrets.extend(completions.iter().map(String::as_str));
    assert_no_secrets_in_outputs(&path, dir.path(), &secrets);
    check_untied(&path);
}

/// Every plaintext call was tied to its socket (the sessions began while recording).
fn check_untied(path: &Path) {
    let (header, _) = read_recording(path);
    assert_eq!(header.tls_untied, 0, "TLS calls with no socket");
}

/// The untuned demo side with TLS on its client hop (bench on rustls, nginx on
/// OpenSSL): nginx's plaintext tells each request, so the network rules still fire.
#[test]
fn untuned_demo_with_tls_on_the_client_hop_still_yields_rules_1_2_3() {
    let recording = demo_recording(
        &demo_stdout(&["--client-tls", "--duration", "20s"]),
        "untuned.tsrec",
    );
    let report = report_json(&recording);
    let protocols = &report["protocols"];
    assert!(
        protocols["tls_plaintext"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("nginx/")),
        "nginx's TLS is read in plaintext: {protocols}"
    );
    assert_eq!(
        report["overall"]["encrypted"], 0,
        "no request is left to TLS record timing"
    );
    for rule in 1..=3 {
        assert_rule_with_evidence(&report, rule);
    }
    let rule1 = report["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"] == 1)
        .expect("rule 1");
    println!("rule 1 with TLS on the client hop: {}", rule1["finding"]);
}
