//! bench --api against the lab engine over loopback, for every API: 16 concurrent streams,
//! every request ok, each choice's token count is what the engine generated, and the
//! engine's own record of each request matches the client's.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::BTreeMap;
use std::time::Duration;

use tokenscope_lab::api::Api;
use tokenscope_lab::bench::{self, BenchConfig, BenchOutcome, TokenKind};
use tokenscope_lab::{Engine, EngineConfig};

const STREAMS: usize = 16;
const MAX_TOKENS: usize = 12;

async fn engine(cfg: EngineConfig) -> Engine {
    Engine::start(cfg, "127.0.0.1:0".parse().expect("literal address"))
        .await
        .expect("engine starts")
}

fn load(e: &Engine, api: Api) -> BenchConfig {
    BenchConfig {
        url: e.base_url(),
        api: Some(api),
        concurrency: STREAMS,
        requests: Some(STREAMS as u64),
        prompt_tokens: 24,
        shared_prefix: 16,
        max_tokens: MAX_TOKENS,
        progress: false,
        timeout: Duration::from_secs(60),
        ..BenchConfig::default()
    }
}

async fn run(cfg: &BenchConfig) -> BenchOutcome {
    let api = cfg.api();
    let out = bench::run(cfg)
        .await
        .unwrap_or_else(|e| panic!("{api}: bench runs: {e}"));
    assert_eq!(out.records.len(), STREAMS, "{api}: one record per request");
    for r in &out.records {
        assert!(r.ok, "{api}: request {} ok: {:?}", r.index, r.error);
        assert_eq!(r.api, api.name(), "{api}: the record names its API");
    }
    out
}

/// Content tokens per choice index of one request.
fn per_choice(r: &bench::RequestRecord) -> BTreeMap<u32, usize> {
    let mut m = BTreeMap::new();
    for e in r.events.iter().filter(|e| e.content) {
        *m.entry(e.choice_index).or_insert(0) += 1;
    }
    m
}

/// The engine served each request the client saw, with one token write per step.
fn engine_agrees(e: &Engine, out: &BenchOutcome, api: Api) {
    let log = e.request_log();
    for r in &out.records {
        let id = r
            .response_id
            .as_deref()
            .unwrap_or_else(|| panic!("{api}: request {} kept its response id", r.index));
        let served = log
            .by_response_id(id)
            .unwrap_or_else(|| panic!("{api}: the engine logged {id}"));
        assert_eq!(
            served.token_ns.len(),
            MAX_TOKENS,
            "{api}: the engine generated {MAX_TOKENS} tokens for {id}"
        );
        if let (Some(first), Some(&written)) = (r.first_token_ns(), served.token_ns.first()) {
            assert!(
                written <= first,
                "{api}: {id}'s first token was written before the client read it"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_streams_the_engines_tokens_to_sixteen_clients() {
    let e = engine(EngineConfig::default()).await;
    for api in Api::ALL {
        let out = run(&load(&e, api)).await;
        for r in &out.records {
            assert_eq!(
                per_choice(r),
                BTreeMap::from([(0, MAX_TOKENS)]),
                "{api}: request {} heard {MAX_TOKENS} tokens",
                r.index
            );
            assert_eq!(
                r.usage_completion_tokens,
                Some(MAX_TOKENS as u32),
                "{api}: the server's own count agrees"
            );
            assert_eq!(
                r.itl_ns().len(),
                r.events.len() - 1,
                "{api}: one gap per token after the first"
            );
            assert!(
                r.first_body_ns.is_some(),
                "{api}: the body's first byte is timed"
            );
        }
        assert_eq!(
            out.report.output_tokens,
            STREAMS * MAX_TOKENS,
            "{api}: the report counts every token"
        );
        engine_agrees(&e, &out, api);
    }
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_choices_are_two_series_of_their_own() {
    let e = engine(EngineConfig::default()).await;
    for api in [Api::OpenAiChat, Api::OpenAiCompletions] {
        let out = run(&BenchConfig {
            n: 2,
            ..load(&e, api)
        })
        .await;
        for r in &out.records {
            assert_eq!(
                per_choice(r),
                BTreeMap::from([(0, MAX_TOKENS), (1, MAX_TOKENS)]),
                "{api}: both choices carry every step's token"
            );
            let events = r.events.len();
            assert_eq!(
                r.itl_ns().len(),
                events - 2,
                "{api}: gaps are taken within each choice, never between them"
            );
            assert_eq!(r.choices, 2);
            assert_eq!(r.usage_completion_tokens, Some(2 * MAX_TOKENS as u32));
        }
        engine_agrees(&e, &out, api);
    }
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_answers_have_no_tokens_and_time_their_first_byte() {
    let e = engine(EngineConfig::default()).await;
    for api in [
        Api::OpenAiChat,
        Api::OpenAiCompletions,
        Api::OllamaGenerate,
        Api::OllamaChat,
    ] {
        let out = run(&BenchConfig {
            stream: false,
            ..load(&e, api)
        })
        .await;
        for r in &out.records {
            assert!(
                r.events.is_empty(),
                "{api}: a JSON body has no token events"
            );
            assert_eq!(
                r.first_token_ns(),
                r.first_body_ns,
                "{api}: its first token is its first body byte"
            );
            assert!(r.itl_ns().is_empty(), "{api}: and no ITL");
            assert_eq!(r.usage_completion_tokens, Some(MAX_TOKENS as u32));
        }
        assert_eq!(
            out.report.output_tokens,
            STREAMS * MAX_TOKENS,
            "{api}: the report counts the server's tokens"
        );
        engine_agrees(&e, &out, api);
    }
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_and_tool_calls_stream_as_their_own_kinds_between_pings() {
    // Pings every 20 ms: several land between the tokens of each stream.
    let e = engine(EngineConfig {
        ping_interval: Duration::from_millis(20),
        ..EngineConfig::default()
    })
    .await;
    for api in [Api::OpenAiResponses, Api::Anthropic] {
        let out = run(&BenchConfig {
            reasoning: true,
            tool_call: true,
            ..load(&e, api)
        })
        .await;
        for r in &out.records {
            let kinds: Vec<TokenKind> = r.events.iter().map(|e| e.kind).collect();
            let reasoning = kinds.iter().filter(|k| **k == TokenKind::Reasoning).count();
            assert_eq!(
                (reasoning, kinds.len()),
                (MAX_TOKENS / 2, MAX_TOKENS),
                "{api}: half the tokens reason, then the tool call's arguments"
            );
            assert!(
                kinds[reasoning..].iter().all(|k| *k == TokenKind::Tool),
                "{api}: the rest are tool arguments: {kinds:?}"
            );
        }
        engine_agrees(&e, &out, api);
    }
    let anthropic = run(&load(&e, Api::Anthropic)).await;
    // message_start, block start, ping, block stop, message_delta, message_stop: 6 without
    // the timed pings.
    assert!(
        anthropic.records.iter().any(|r| r.non_token_events > 6),
        "timed pings arrived mid-stream: {:?}",
        anthropic
            .records
            .iter()
            .map(|r| r.non_token_events)
            .collect::<Vec<_>>()
    );
    e.shutdown().await;
}
