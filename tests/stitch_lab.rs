//! Privileged: stitching checked against ground truth. The lab engine behind
//! real nginx, loaded by bench (whose own timestamps are the reference), while
//! `tokenscope record` watches; then `tokenscope report --json` is compared
//! with bench's per-request records.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig, RequestRecord};
use tokenscope_lab::proxy::{NginxProxy, ProxyConfig, ProxyMode};
use tokenscope_lab::{Engine, EngineConfig};

/// Runs `load` through nginx in `mode` while recording; returns bench's records and the report.
fn run(mode: ProxyMode, load: BenchConfig) -> (Vec<RequestRecord>, Value) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    rt.block_on(async {
        let engine = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("engine");
        let proxy = NginxProxy::start(ProxyConfig::new(mode, engine.addr()))
            .await
            .expect("nginx");
        let ports = [
            engine.addr().port().to_string(),
            proxy.addr().port().to_string(),
        ];
        let rec = Recorder::start(dir.path(), &["--port", &ports[0], "--port", &ports[1]]);
        let outcome = bench::run(&BenchConfig {
            url: proxy.url(),
            ..load
        })
        .await
        .expect("bench");
        let path = rec.path.clone();
        rec.stop();
        drop(proxy);
        engine.shutdown().await;
        let report = report_json(&path);
        if let Ok(keep) = std::env::var("TOKENSCOPE_KEEP_RECORDING") {
            std::fs::copy(&path, keep).expect("keep the recording");
        }
        (outcome.records, report)
    })
}

fn load(concurrency: usize, requests: u64, max_tokens: usize) -> BenchConfig {
    BenchConfig {
        concurrency,
        requests: Some(requests),
        prompt_tokens: 120,
        shared_prefix: 100,
        max_tokens,
        progress: false,
        timeout: Duration::from_secs(120),
        ..BenchConfig::default()
    }
}

/// One request's point against bench's record of it: the same token count, and the
/// TTFT and ITL errors (bench's clock is the reference).
fn compare_with_bench(
    r: &Value,
    at: &Value,
    b: &RequestRecord,
    ttft_err: &mut Vec<u64>,
    itl_err: &mut Vec<u64>,
) {
    let tokens: Vec<u64> = at["token_ns"].as_array().unwrap().iter().map(ns).collect();
    assert_eq!(
        tokens.len(),
        b.events.iter().filter(|e| e.choice).count(),
        "token count of request {}",
        r["id"]
    );
    ttft_err.push(off_range(
        ns(&at["ttft_ns"]),
        b.ttft_range().expect("bench ttft"),
    ));
    // An outlier says which side moved (CI saw 3 of 192 at 2.5 ms once; never alone).
    if *ttft_err.last().unwrap() > 1_000_000 {
        eprintln!(
            "TTFT outlier, request {}: ours {} (start {}, first byte {}, first token {}); bench start {}, sent {:?}, first token {:?}, range {:?}, new connection {}",
            r["id"],
            ns(&at["ttft_ns"]),
            ns(&r["start_ns"]),
            ns(&r["first_byte_ns"]),
            tokens[0],
            b.request_start_ns,
            b.request_sent_ns,
            b.first_token_ns(),
            b.ttft_range(),
            b.new_connection
        );
    }
    let gaps = tokens.windows(2).map(|w| w[1] - w[0]);
    itl_err.extend(gaps.zip(b.itl_ns()).map(|(a, b)| a.abs_diff(b)));
}

#[test]
fn keep_alive_streams_through_nginx_match_the_bench_exactly_once() {
    let (records, report) = run(ProxyMode::TunedPlain, load(32, 192, 24));
    assert!(
        records.iter().all(|r| r.ok),
        "every bench request succeeded"
    );
    let requests: Vec<&Value> = report["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["path"] == "/v1/completions")
        .collect();
    assert_eq!(
        requests.len(),
        records.len(),
        "every request the bench sent appears exactly once"
    );

    // Pair them: per client connection (bench's local port), in order.
    let mut by_port: HashMap<u16, Vec<&Value>> = HashMap::new();
    for r in &requests {
        let port: u16 = r["client_addr"]
            .as_str()
            .unwrap()
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        by_port.entry(port).or_default().push(r);
    }
    let mut bench_by_port: HashMap<u16, Vec<&RequestRecord>> = HashMap::new();
    for b in &records {
        bench_by_port.entry(b.local_port).or_default().push(b);
    }
    assert_eq!(
        by_port.len(),
        bench_by_port.len(),
        "one traced client connection per bench connection"
    );
    let (mut ttft_err, mut itl_err) = (Vec::new(), Vec::new());
    for (port, mut bs) in bench_by_port {
        let mut rs = by_port
            .remove(&port)
            .unwrap_or_else(|| panic!("bench connection :{port} is in the report"));
        bs.sort_by_key(|b| b.request_start_ns);
        rs.sort_by_key(|r| ns(&r["first_byte_ns"]));
        assert_eq!(bs.len(), rs.len(), "requests on :{port}");
        for (b, r) in bs.iter().zip(rs) {
            let kinds = point_kinds(r);
            assert_eq!(
                kinds,
                ["client_read", "proxy_write", "proxy_read", "engine_write"],
                "request {} joined across nginx",
                r["id"]
            );
            assert_eq!(
                r["chunk_mismatches"], 0,
                "no chunk of request {} belongs to another",
                r["id"]
            );
            let client = point(r, "client_read").unwrap();
            compare_with_bench(r, client, b, &mut ttft_err, &mut itl_err);
        }
    }
    assert_within_a_millisecond(
        "HTTP/1.1 through nginx (client read vs bench)",
        "TTFT",
        ttft_err,
        itl_err,
    );
}

#[test]
fn untuned_nginx_shows_forward_delay_and_coalescing_while_the_engine_stays_flat() {
    let (records, report) = run(ProxyMode::Untuned, load(4, 8, 64));
    assert!(records.iter().all(|r| r.ok));
    let overall = &report["overall"];
    let delay = &overall["forward"]["proxy read -> proxy write"];
    let engine_itl = &overall["itl"]["engine_write"];
    println!(
        "untuned: proxy forward delay p50 {} p99 {} ns; engine ITL p50 {} p99 {} ns; coalesced {}",
        delay["p50_ns"],
        delay["p99_ns"],
        engine_itl["p50_ns"],
        engine_itl["p99_ns"],
        overall["coalesced"]
    );
    assert!(
        ns(&delay["p99_ns"]) > 20 * MS,
        "buffering holds tokens at the proxy: {delay}"
    );
    assert!(
        ns(&overall["coalesced"]) >= 4,
        "most requests arrive coalesced: {}",
        overall["coalesced"]
    );
    let requests = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["path"] == "/v1/completions");
    for r in requests {
        assert!(
            ns(&point(r, "proxy_write").expect("proxy write")["max_tokens_per_io"]) > 1
                || r["coalesced"] == true
        );
    }
    assert!(
        ns(&engine_itl["p99_ns"]) < 3 * ns(&engine_itl["p50_ns"]),
        "the engine's own ITL stays flat: {engine_itl}"
    );
    let subrequests = &overall["stages"]["subrequests"];
    assert!(
        ns(&subrequests["count"]) >= 8,
        "the auth_request hop is attributed as a sub-request: {subrequests} {:#}",
        report["routes"]
    );
}

#[test]
fn tuned_nginx_forwards_every_token_within_a_millisecond() {
    let (records, report) = run(ProxyMode::TunedPlain, load(4, 8, 64));
    assert!(records.iter().all(|r| r.ok));
    let delay = &report["overall"]["forward"]["proxy read -> proxy write"];
    println!(
        "tuned: proxy forward delay p50 {} p99 {} ns",
        delay["p50_ns"], delay["p99_ns"]
    );
    assert!(
        ns(&delay["count"]) >= 8 * 60,
        "every token timed at the proxy: {delay}"
    );
    assert!(
        ns(&delay["p99_ns"]) < MS,
        "forward delay p99 < 1 ms: {delay}"
    );
}

/// The tuned demo side: TLS + HTTP/2 to clients (bench on rustls: its own socket
/// shows only TLS records), HTTP/1.1 keep-alive upstream. nginx's OpenSSL plaintext
/// and the HTTP/2 decoder give every request once; the client's reads of the bytes
/// nginx wrote for each token give its client-read point, timed as bench timed it.
#[test]
fn tls_and_http2_through_nginx_every_request_once_within_a_millisecond_of_bench() {
    let cfg = BenchConfig {
        http2: true,
        insecure: true,
        // Eight streams at once on the shared connection. At 32 on these 2-core machines,
        // 1-2% of first tokens reach bench's stream task over 1 ms after its socket read
        // (rustls + hyper's connection task + a wake-up): bench's own latency, not the wire.
        ..load(8, 128, 24)
    };
    let (records, report) = run(ProxyMode::Tuned, cfg);
    assert!(
        records.iter().all(|r| r.ok && r.http_version == "2"),
        "every bench request succeeded over HTTP/2"
    );
    let all = report["requests"].as_array().expect("requests");
    let requests: Vec<&Value> = all
        .iter()
        .filter(|r| r["path"] == "/v1/completions")
        .collect();
    assert_eq!(
        (all.len(), requests.len()),
        (records.len(), records.len()),
        "every bench request appears exactly once, none made of control frames"
    );
    for r in &requests {
        let kinds = point_kinds(r);
        assert_eq!(
            kinds,
            ["client_read", "proxy_write", "proxy_read", "engine_write"],
            "request {} joined from the client's socket to the engine",
            r["id"]
        );
        assert_eq!(r["http2"], true);
        assert_eq!(r["chunk_mismatches"], 0);
    }
    assert!(
        report["protocols"]["h2_control_frames"].as_u64().unwrap() > 0,
        "control frames were seen and counted: {}",
        report["protocols"]
    );
    // Streams share a connection, so pair each request with the bench record closest to
    // it in time (request start and first token, one clock): the pair that explains both.
    let first_token = |r: &Value| ns(&r["points"][0]["token_ns"][0]);
    let mut costs: Vec<(u64, usize, usize)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        for (j, b) in records.iter().enumerate() {
            let cost = ns(&r["first_byte_ns"]).abs_diff(b.request_start_ns)
                + first_token(r).abs_diff(b.first_token_ns().expect("bench first token"));
            costs.push((cost, i, j));
        }
    }
    costs.sort_unstable();
    let (mut used_r, mut used_b) = (vec![false; requests.len()], vec![false; records.len()]);
    let (mut ttft_err, mut itl_err) = (Vec::new(), Vec::new());
    for (_, i, j) in costs {
        if used_r[i] || used_b[j] {
            continue;
        }
        (used_r[i], used_b[j]) = (true, true);
        let (r, b) = (requests[i], &records[j]);
        compare_with_bench(r, &r["points"][0], b, &mut ttft_err, &mut itl_err);
    }
    assert_within_a_millisecond(
        "TLS + HTTP/2 through nginx (client read vs bench)",
        "TTFT",
        ttft_err,
        itl_err,
    );
}
