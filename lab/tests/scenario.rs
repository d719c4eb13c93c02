//! The network scenarios reproduce their pathology on real TCP and their negatives do
//! not, by what the client measured (and the kernel counted). Root for nftables; run one
//! at a time (`--test-threads=1`): they share the loopback and the kernel's counters.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use tokenscope_lab::demo::NoObserver;
use tokenscope_lab::scenario::{self, Scenario, ScenarioOutcome};

async fn run(s: Scenario) -> ScenarioOutcome {
    let outcome = scenario::run(s, &mut NoObserver)
        .await
        .unwrap_or_else(|e| panic!("scenario {s} runs: {e}"));
    eprintln!("{}", outcome.summary);
    assert!(
        outcome.tokens() > 0,
        "{s}: the client read tokens: {}",
        outcome.summary
    );
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nagle_holds_the_next_token_for_the_delayed_ack_and_nodelay_does_not() {
    let nagle = run(Scenario::Nagle).await;
    assert!(
        nagle.gaps_between_ms(35.0, 60.0) >= 10,
        "nagle: at least 10 client gaps of 35-60 ms (a delayed ACK): {}",
        nagle.summary
    );
    let fixed = run(Scenario::NagleFixed).await;
    // What Nagle adds is a hold between the engine's write and the client's read; a
    // client gap the engine's own steps made (a busy CI machine) is not one.
    assert!(
        fixed.delays().max < 10.0,
        "nagle-fixed: no token held 10 ms between the engine's write and the client's \
         read with TCP_NODELAY (Nagle held them up to ~30 ms): {}",
        fixed.summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_segments_are_retransmitted_after_itl_spikes_and_without_drops_none() {
    let lossy = run(Scenario::Lossy).await;
    assert!(
        lossy.dropped_segments.unwrap_or(0) > 0,
        "lossy: the rule dropped segments: {}",
        lossy.summary
    );
    assert!(
        lossy.retransmits.unwrap_or(0) > 0,
        "lossy: the kernel retransmitted: {}",
        lossy.summary
    );
    assert!(
        lossy.gaps_between_ms(150.0, f64::INFINITY) > 0,
        "lossy: some client gaps over 150 ms (a retransmission timeout): {}",
        lossy.summary
    );
    let lossless = run(Scenario::Lossless).await;
    assert_eq!(
        lossless.gaps_between_ms(150.0, f64::INFINITY),
        0,
        "lossless: no client gap over 150 ms: {}",
        lossless.summary
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_falls_ever_further_behind_the_engine_and_a_fast_one_does_not() {
    let slow = run(Scenario::SlowClient).await;
    assert!(
        slow.last_token_delay_ms() >= 200.0,
        "slow-client: the last token reached the client 200+ ms after the engine wrote it: {}",
        slow.summary
    );
    assert!(
        slow.last_token_delay_ms() > 10.0 * slow.first_token_delay_ms().max(1.0),
        "slow-client: the delay grew over the stream: {}",
        slow.summary
    );
    let fast = run(Scenario::FastClient).await;
    assert!(
        fast.last_token_delay_ms() < 20.0,
        "fast-client: the last token arrived within 20 ms of its write: {}",
        fast.summary
    );
}
