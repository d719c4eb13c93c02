//! Real nginx between bench and the engine: the untuned gateway coalesces the token stream
//! and closes every connection; the tuned one does neither.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use tokenscope_lab::bench::{self, BenchConfig, BenchOutcome};
use tokenscope_lab::proxy::{NginxProxy, ProxyConfig, ProxyMode};
use tokenscope_lab::{Engine, EngineConfig};

async fn through_proxy(
    engine_cfg: EngineConfig,
    mode: ProxyMode,
    http2: bool,
    accept_gzip: bool,
) -> BenchOutcome {
    let engine = Engine::start(engine_cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts");
    let proxy = NginxProxy::start(ProxyConfig::new(mode, engine.addr()))
        .await
        .expect("nginx starts (Debian packages nginx and openssl)");
    let out = bench::run(&BenchConfig {
        url: proxy.url(),
        concurrency: 2,
        requests: Some(6),
        prompt_tokens: 20,
        max_tokens: 60,
        http2,
        accept_gzip_every: u64::from(accept_gzip),
        insecure: true,
        progress: false,
        timeout: Duration::from_secs(60),
        ..BenchConfig::default()
    })
    .await
    .expect("bench runs");
    let failures: Vec<_> = out.records.iter().filter_map(|r| r.error.clone()).collect();
    assert!(
        failures.is_empty(),
        "every request through {mode} nginx completes: {failures:?}\n{}",
        proxy.error_log()
    );
    drop(proxy);
    engine.shutdown().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untuned_nginx_coalesces_events_and_opens_a_connection_per_request() {
    let out = through_proxy(EngineConfig::default(), ProxyMode::Untuned, false, false).await;
    let r = &out.report;
    assert_eq!(
        r.new_connections, r.requests,
        "without keep-alive every request opens a new connection"
    );
    assert_eq!(
        r.reconnects,
        r.requests - 2,
        "all but each worker's first are reconnects"
    );
    assert!(
        r.coalesced_tokens * 2 > r.output_tokens,
        "a buffering gateway delivers several events per read: {} of {} coalesced",
        r.coalesced_tokens,
        r.output_tokens
    );
    assert!(
        out.records.iter().all(|x| x.tls_done_ns.is_none()),
        "untuned is plain HTTP"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tuned_nginx_over_h2_reuses_connections_and_forwards_each_event() {
    let out = through_proxy(EngineConfig::default(), ProxyMode::Tuned, true, false).await;
    let r = &out.report;
    assert!(
        r.new_connections <= 2 && r.reconnects == 0,
        "with keep-alive only each worker's first request connects ({} of {}, {} reconnects)",
        r.new_connections,
        r.requests,
        r.reconnects
    );
    assert_eq!(
        r.coalesced_tokens, 0,
        "each token arrives in a read of its own"
    );
    let first = &out.records[0];
    assert!(
        first.tls_done_ns.is_some() && first.http_version == "2",
        "tuned is TLS with HTTP/2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_accel_buffering_no_from_the_engine_turns_nginx_buffering_off() {
    let out = through_proxy(
        EngineConfig {
            x_accel_buffering_no: true,
            ..EngineConfig::default()
        },
        ProxyMode::Untuned,
        false,
        false,
    )
    .await;
    assert_eq!(
        out.report.coalesced_tokens, 0,
        "X-Accel-Buffering: no makes nginx forward every chunk as it comes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untuned_gzip_holds_the_whole_stream_for_clients_that_accept_it() {
    let out = through_proxy(EngineConfig::default(), ProxyMode::Untuned, false, true).await;
    for r in &out.records {
        let reads: std::collections::HashSet<u64> = r.events.iter().map(|e| e.read).collect();
        assert!(
            reads.len() <= 2,
            "gzip behind a buffering upstream delivers the stream in one or two reads, not {}",
            reads.len()
        );
    }
}
