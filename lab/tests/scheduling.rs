//! The engine's scheduling pathologies, measured by bench over real TCP: chunked prefill
//! and the prefix cache.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use tokenscope_lab::bench::{self, BenchConfig, RequestRecord};
use tokenscope_lab::{Engine, EngineConfig, StepKind};

async fn engine(cfg: EngineConfig) -> Engine {
    Engine::start(cfg, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts")
}

fn load(
    url: String,
    concurrency: usize,
    requests: u64,
    prompt: usize,
    max_tokens: usize,
) -> BenchConfig {
    BenchConfig {
        url,
        concurrency,
        requests: Some(requests),
        prompt_tokens: prompt,
        max_tokens,
        progress: false,
        timeout: Duration::from_secs(60),
        ..BenchConfig::default()
    }
}

/// Four running streams, then a 4,000-word prompt once they are decoding.
async fn long_prompt_mid_stream(e: &Engine, tokens: usize) -> (Vec<RequestRecord>, RequestRecord) {
    let streams = tokio::spawn(bench::run_owned(load(e.base_url(), 4, 4, 8, tokens)));
    // Mid-stream: wait until the four are all decoding.
    e.step_log()
        .wait_for(|s| s.kind == StepKind::Decode && s.decode_seqs == 4 && s.index > 10)
        .await;
    let long = bench::run(&load(e.base_url(), 1, 1, 4000, 2))
        .await
        .expect("long prompt bench runs");
    let streams = streams.await.unwrap().expect("stream bench runs");
    assert!(
        streams.records.iter().all(|r| r.ok) && long.records[0].ok,
        "all requests complete: {:?}",
        streams.records.iter().map(|r| &r.error).collect::<Vec<_>>()
    );
    (streams.records, long.records[0].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchunked_long_prefill_stalls_running_streams_for_its_whole_prefill() {
    let e = engine(EngineConfig {
        chunked_prefill: false,
        prefix_cache: false,
        ..EngineConfig::default()
    })
    .await;
    let (streams, _) = long_prompt_mid_stream(&e, 200).await;
    let steps = e.step_log().snapshot();
    let prefill = steps
        .iter()
        .find(|s| s.kind == StepKind::Prefill && s.prefill_tokens >= 4000)
        .expect("the 4,000-word prompt prefilled in one step");
    let worst_gap = streams
        .iter()
        .map(|r| r.itl_ns().into_iter().max().unwrap_or(0))
        .min()
        .unwrap();
    eprintln!(
        "unchunked: smallest worst gap {worst_gap} ns, prefill {} ns",
        prefill.duration_ns()
    );
    assert!(
        worst_gap >= prefill.duration_ns(),
        "every running stream has an ITL gap ({worst_gap} ns) at least as long as the prefill ({} ns)",
        prefill.duration_ns()
    );
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_prefill_keeps_running_streams_p99_itl_under_twice_a_decode_step() {
    // A 28-token step budget keeps a mixed step ~1.3x a decode step: margin for a busy CI.
    let e = engine(EngineConfig {
        chunked_prefill: true,
        prefix_cache: false,
        max_batched_tokens: 28,
        ..EngineConfig::default()
    })
    .await;
    let (streams, long) = long_prompt_mid_stream(&e, 300).await;
    let steps = e.step_log().snapshot();
    let decode: Vec<u64> = steps
        .iter()
        .filter(|s| s.kind == StepKind::Decode && s.decode_seqs == 4)
        .map(|s| s.duration_ns())
        .collect();
    let decode_step = decode.iter().sum::<u64>() / decode.len() as u64;
    let mixed = steps.iter().filter(|s| s.kind == StepKind::Mixed).count();
    assert!(
        mixed > 10,
        "the long prompt was prefilled in chunks beside decodes ({mixed} mixed steps)"
    );
    let first_long = long.first_token_ns().unwrap();
    assert!(
        streams
            .iter()
            .all(|r| r.events.last().unwrap().t_ns > first_long),
        "the streams were still running when the long prompt finished prefill"
    );
    let mut itl: Vec<u64> = streams.iter().flat_map(|r| r.itl_ns()).collect();
    itl.sort_unstable();
    let p99 = itl[(itl.len() * 99) / 100];
    eprintln!("chunked: p99 ITL {p99} ns, decode step {decode_step} ns, {mixed} mixed steps");
    assert!(
        p99 < 2 * decode_step,
        "running streams' p99 ITL {p99} ns stays under 2x the decode step {decode_step} ns"
    );
    e.shutdown().await;
}

async fn repeated_system_prompt_ttft(prefix_cache: bool) -> u64 {
    let e = engine(EngineConfig {
        prefix_cache,
        chunked_prefill: false,
        ..EngineConfig::default()
    })
    .await;
    let out = bench::run(&BenchConfig {
        shared_prefix: 2000,
        ..load(e.base_url(), 1, 4, 2040, 4)
    })
    .await
    .expect("bench runs");
    assert!(out.records.iter().all(|r| r.ok), "all requests complete");
    // Skip the first request: it is the one that fills the cache.
    let mut ttft: Vec<u64> = out.records[1..]
        .iter()
        .map(|r| r.ttft_ns().unwrap())
        .collect();
    ttft.sort_unstable();
    e.shutdown().await;
    ttft[ttft.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_cache_cuts_ttft_of_a_repeated_system_prompt_at_least_5x() {
    let off = repeated_system_prompt_ttft(false).await;
    let on = repeated_system_prompt_ttft(true).await;
    eprintln!("prefix cache: median TTFT on {on} ns, off {off} ns");
    assert!(
        on * 5 <= off,
        "prefix cache on: median TTFT {on} ns must be at least 5x below off: {off} ns"
    );
}
