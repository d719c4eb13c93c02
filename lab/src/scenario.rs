//! Network pathologies on real TCP on this machine, each beside its negative, for the
//! profiler's diagnoses: Nagle's algorithm against a delayed ACK (rule 7), segment loss
//! and retransmission (rule 8), a slow client behind full socket buffers (rule 9). Each
//! run starts the engine on loopback, tells the observer, runs a few seconds of load
//! with a plain client and returns what that client measured, beside the engine's own
//! log of when it handed each token to the connection (same CLOCK_MONOTONIC clock).
mod client;
mod netfilter;
mod outcome;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

use crate::bench::{self, BenchConfig};
use crate::demo::{DemoConfig, DemoObserver};
use crate::engine::{Engine, EngineConfig, EngineError, RequestLog};
use crate::proxy::OneFix;
use crate::words::pseudo_text;
use client::{ClientOptions, ReadStream, StreamClient};
use collector::clock::monotonic_ns;
use netfilter::{kernel_retransmits, SegmentDropper};
pub use outcome::{MeasuredStream, ScenarioOutcome};

/// One side of a scenario pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Engine without TCP_NODELAY writing each chunk in two writes; a keep-alive client.
    Nagle,
    /// The same with TCP_NODELAY.
    NagleFixed,
    /// One in ten of the engine's data segments dropped.
    Lossy,
    /// The same load without drops.
    Lossless,
    /// A client with a 4 KiB receive buffer reading 256 bytes every 10 ms from a fast
    /// stream, against an engine with a 16 KiB send buffer.
    SlowClient,
    /// The same engine and stream, read as fast as it comes.
    FastClient,
    /// The untuned demo, short: no prefix cache, no chunked prefill, nginx without
    /// keep-alive, buffering and gzip (rules 1-5 and their evidence).
    Untuned,
    /// The tuned engine behind nginx tuned but in plain HTTP/1.1 (keep-alive, no
    /// buffering, no gzip), the same load: every hop in the clear, nothing to fix.
    TunedPlain,
    /// The tuned chain with the engine's chunked prefill off, under a load of long
    /// documents (one request in three): each prefills in one step while every other
    /// stream waits (rule 5 alone).
    PrefillStall,
    /// The same load with chunked prefill on (the fix).
    PrefillStallFixed,
    /// An engine that runs 2 sequences at once under 8 concurrent streams (rule 6).
    Queued,
    /// The same load on an engine with room for every stream (the fix: capacity).
    QueuedFixed,
    /// The untuned demo with one of its five causes fixed: each diagnosis's fix measured
    /// alone (the other four rules still fire).
    UntunedFixed(OneFix),
    /// The engine's steps while NVML reports HW thermal throttling (rule 10; the
    /// scripted stand-in libnvidia-ml, see `nvml_script`).
    GpuThrottled,
    /// The same with a busy, unthrottled GPU.
    GpuCool,
    /// An engine whose host loop spends 8 ms per step with the GPU idle (rule 11).
    HostBound,
    /// The same host work overlapped with the GPU's (vLLM --async-scheduling).
    HostBoundFixed,
    /// An engine whose KV cache holds 320 tokens under 6 streams of 64: the newest
    /// running request is preempted and recomputed (rule 12).
    KvPreempt,
    /// The same load with room in the KV cache for every stream.
    KvPreemptFixed,
}

impl Scenario {
    pub fn all() -> [Scenario; 23] {
        [
            Scenario::Nagle,
            Scenario::NagleFixed,
            Scenario::Lossy,
            Scenario::Lossless,
            Scenario::SlowClient,
            Scenario::FastClient,
            Scenario::Untuned,
            Scenario::TunedPlain,
            Scenario::GpuThrottled,
            Scenario::GpuCool,
            Scenario::Queued,
            Scenario::QueuedFixed,
            Scenario::HostBound,
            Scenario::HostBoundFixed,
            Scenario::KvPreempt,
            Scenario::KvPreemptFixed,
            Scenario::PrefillStall,
            Scenario::PrefillStallFixed,
            Scenario::UntunedFixed(OneFix::KeepAlive),
            Scenario::UntunedFixed(OneFix::NoBuffering),
            Scenario::UntunedFixed(OneFix::NoGzip),
            Scenario::UntunedFixed(OneFix::PrefixCache),
            Scenario::UntunedFixed(OneFix::ChunkedPrefill),
        ]
    }

    pub fn name(&self) -> &'static str {
        match self {
            Scenario::Nagle => "nagle",
            Scenario::NagleFixed => "nagle-fixed",
            Scenario::Lossy => "lossy",
            Scenario::Lossless => "lossless",
            Scenario::SlowClient => "slow-client",
            Scenario::FastClient => "fast-client",
            Scenario::Untuned => "untuned",
            Scenario::TunedPlain => "tuned-plain",
            Scenario::PrefillStall => "prefill-stall",
            Scenario::PrefillStallFixed => "prefill-stall-fixed",
            Scenario::Queued => "queued",
            Scenario::QueuedFixed => "queued-fixed",
            Scenario::UntunedFixed(OneFix::KeepAlive) => "untuned-keepalive",
            Scenario::UntunedFixed(OneFix::NoBuffering) => "untuned-unbuffered",
            Scenario::UntunedFixed(OneFix::NoGzip) => "untuned-no-gzip",
            Scenario::UntunedFixed(OneFix::PrefixCache) => "untuned-prefix-cache",
            Scenario::UntunedFixed(OneFix::ChunkedPrefill) => "untuned-chunked-prefill",
            Scenario::GpuThrottled => "gpu-throttled",
            Scenario::GpuCool => "gpu-cool",
            Scenario::HostBound => "host-bound",
            Scenario::HostBoundFixed => "host-bound-fixed",
            Scenario::KvPreempt => "kv-preempt",
            Scenario::KvPreemptFixed => "kv-preempt-fixed",
        }
    }

    /// The profiler's diagnosis rules the scenario exercises (positive or negative).
    pub fn rules(&self) -> &'static [u8] {
        match self {
            Scenario::Nagle | Scenario::NagleFixed => &[7],
            Scenario::Lossy | Scenario::Lossless => &[8],
            Scenario::SlowClient | Scenario::FastClient => &[9],
            Scenario::Untuned | Scenario::TunedPlain | Scenario::UntunedFixed(_) => {
                &[1, 2, 3, 4, 5]
            }
            Scenario::PrefillStall | Scenario::PrefillStallFixed => &[5],
            Scenario::Queued | Scenario::QueuedFixed => &[6],
            Scenario::GpuThrottled | Scenario::GpuCool => &[10],
            Scenario::HostBound | Scenario::HostBoundFixed => &[11],
            Scenario::KvPreempt | Scenario::KvPreemptFixed => &[12],
        }
    }

    /// For the GPU scenarios: the script of the stand-in libnvidia-ml.so.1 the recorder
    /// should sample (`tokenscope record --nvml-lib`; format in nvml-sampler/standin).
    pub fn nvml_script(&self) -> Option<&'static str> {
        match self {
            // gpu mem sm memclk used power temp throttle tx rx; the last row repeats.
            Scenario::GpuThrottled => Some(concat!(
                "devices 1\nname 0 Stand-in H200\nuuid 0 GPU-5ce7a710-0000-4000-8000-000000000000\n",
                "row 0 97 61 1980 2619 2147483648 650000 79 0x0 1000 1000\n",
                "row 0 98 62 1410 2619 2147483648 700000 91 0x40 1000 1000\n",
            )),
            Scenario::GpuCool => Some(concat!(
                "devices 1\nname 0 Stand-in H200\nuuid 0 GPU-5ce7a710-0000-4000-8000-000000000000\n",
                "row 0 97 61 1980 2619 2147483648 650000 62 0x0 1000 1000\n",
            )),
            _ => None,
        }
    }

    /// True for the side that has the pathology, false for its negative.
    pub fn has_pathology(&self) -> bool {
        matches!(
            self,
            Scenario::Nagle
                | Scenario::Lossy
                | Scenario::SlowClient
                | Scenario::Untuned
                | Scenario::UntunedFixed(_)
                | Scenario::PrefillStall
                | Scenario::Queued
                | Scenario::GpuThrottled
                | Scenario::HostBound
                | Scenario::KvPreempt
        )
    }

    /// The set-up in words.
    pub fn describe(&self) -> &'static str {
        match self {
            Scenario::Nagle => {
                "engine without TCP_NODELAY writes each chunk in two writes; one keep-alive \
                 client sends request after request"
            }
            Scenario::NagleFixed => {
                "engine with TCP_NODELAY writes each chunk in two writes; one keep-alive \
                 client sends request after request"
            }
            Scenario::Lossy => {
                "nftables drops 1 in 10 of the engine's data segments; four clients stream"
            }
            Scenario::Lossless => "no drops; four clients stream",
            Scenario::SlowClient => {
                "engine SO_SNDBUF 16 KiB streams fast; the client has SO_RCVBUF 4 KiB and \
                 reads 256 bytes every 10 ms"
            }
            Scenario::FastClient => {
                "engine SO_SNDBUF 16 KiB streams fast; the client reads as fast as it comes"
            }
            Scenario::Untuned => {
                "the untuned demo for 10 s: no prefix cache, no chunked prefill; nginx without \
                 keep-alive, buffering on, gzip on (one client in four accepts it)"
            }
            Scenario::TunedPlain => {
                "the tuned engine behind nginx in plain HTTP/1.1 (keep-alive, buffering off, \
                 gzip off), the same load"
            }
            Scenario::PrefillStall => {
                "the tuned chain with the engine's chunked prefill off; one request in three \
                 pastes a 1500-word document, which prefills in one step while every other \
                 stream waits"
            }
            Scenario::PrefillStallFixed => "the same load with chunked prefill on",
            Scenario::Queued => {
                "engine runs at most 2 sequences at once; 8 concurrent clients stream 24 requests"
            }
            Scenario::QueuedFixed => {
                "the same 8 clients on an engine that runs every sequence at once"
            }
            Scenario::UntunedFixed(OneFix::KeepAlive) => {
                "untuned with keep-alive to clients (rule 1's fix alone; the engine hop stays HTTP/1.0)"
            }
            Scenario::UntunedFixed(OneFix::NoBuffering) => {
                "untuned with proxy_buffering off (rule 2's fix alone)"
            }
            Scenario::UntunedFixed(OneFix::NoGzip) => {
                "untuned with event streams left out of gzip_types (rule 3's fix alone)"
            }
            Scenario::UntunedFixed(OneFix::PrefixCache) => {
                "untuned with the engine's prefix cache on (rule 4's fix alone)"
            }
            Scenario::UntunedFixed(OneFix::ChunkedPrefill) => {
                "untuned with the engine's chunked prefill on (rule 5's fix alone)"
            }
            Scenario::GpuThrottled => {
                "engine under load while NVML reports HW thermal throttling (SM clock 1410 MHz, \
                 every step 1980/1410 times as long as on the cool GPU)"
            }
            Scenario::GpuCool => "engine under load while NVML reports a busy, unthrottled GPU",
            Scenario::HostBound => {
                "engine whose host loop spends 8 ms per step (output processing, scheduling) \
                 with the GPU idle; four clients stream"
            }
            Scenario::HostBoundFixed => {
                "the same 8 ms of host work per step overlapped with the GPU's (vLLM \
                 --async-scheduling)"
            }
            Scenario::KvPreempt => {
                "engine with a 320-token KV cache; six clients stream 64 tokens each: the \
                 newest running request is preempted and recomputed"
            }
            Scenario::KvPreemptFixed => "the same load with room in the KV cache for every stream",
        }
    }

    /// The network scenarios' set-up (None for the others, which `run` sets up itself).
    fn plan(&self) -> Option<Plan> {
        match self {
            // Linux acknowledges a small segment as soon as the client reads it, unless the
            // socket is interactive ("pingpong": it sent data soon after receiving); then
            // the ACK waits for the 40 ms delayed-ACK timer, whose firing ends that mode. A
            // client sending request after request on one connection re-enters it each
            // time, so every stream but the first waits once: its second token sits behind
            // the unacknowledged head + first token until the timer fires. A single long
            // stream would show at most one such stall.
            Scenario::Nagle | Scenario::NagleFixed => Some(Plan {
                engine: EngineConfig {
                    tcp_nodelay: *self == Scenario::NagleFixed,
                    split_chunk_writes: true,
                    ..EngineConfig::default()
                },
                clients: vec![ClientOptions::prompt_reader()],
                requests_per_client: 24,
                max_tokens: 8,
                drop_one_in: None,
            }),
            Scenario::Lossy | Scenario::Lossless => Some(Plan {
                engine: EngineConfig {
                    // Most losses are repaired by the next token's SACK within a step or
                    // two; a timeout needs a lost last segment or a lost retransmission,
                    // so the load is 48 streams of 48 tokens at ~9 ms a token.
                    step_overhead_ns: 8_000_000,
                    ..EngineConfig::default()
                },
                clients: vec![ClientOptions::prompt_reader(); 4],
                requests_per_client: 12,
                max_tokens: 48,
                drop_one_in: (*self == Scenario::Lossy).then_some(10),
            }),
            Scenario::SlowClient | Scenario::FastClient => Some(Plan {
                engine: EngineConfig {
                    // ~300 tokens/s: far faster than the slow client reads.
                    step_overhead_ns: 3_000_000,
                    send_buffer_bytes: Some(16 << 10),
                    ..EngineConfig::default()
                },
                clients: vec![if *self == Scenario::SlowClient {
                    ClientOptions {
                        recv_buffer: Some(4 << 10),
                        read_size: 256,
                        pause_per_read: Duration::from_millis(10),
                    }
                } else {
                    ClientOptions::prompt_reader()
                }],
                requests_per_client: 1,
                max_tokens: 500,
                drop_one_in: None,
            }),
            Scenario::Untuned
            | Scenario::TunedPlain
            | Scenario::PrefillStall
            | Scenario::PrefillStallFixed
            | Scenario::Queued
            | Scenario::QueuedFixed
            | Scenario::UntunedFixed(_)
            | Scenario::GpuThrottled
            | Scenario::GpuCool
            | Scenario::HostBound
            | Scenario::HostBoundFixed
            | Scenario::KvPreempt
            | Scenario::KvPreemptFixed => None,
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scenario {
    type Err = ScenarioError;

    fn from_str(s: &str) -> Result<Scenario, ScenarioError> {
        Scenario::all()
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| ScenarioError::Unknown(s.to_string()))
    }
}

#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error(
        "unknown scenario {0:?} (nagle, nagle-fixed, lossy, lossless, slow-client, fast-client, \
         untuned, tuned-plain, queued, queued-fixed, gpu-throttled, gpu-cool, host-bound, \
         host-bound-fixed, kv-preempt, kv-preempt-fixed, untuned-keepalive, untuned-unbuffered, untuned-no-gzip, \
         untuned-prefix-cache, untuned-chunked-prefill, prefill-stall, prefill-stall-fixed)"
    )]
    Unknown(String),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("nft not found: apt-get install nftables")]
    NftMissing,
    #[error("nft could not {action}: {message}")]
    Nft {
        action: &'static str,
        message: String,
    },
    #[error("client: {0}")]
    Client(String),
    #[error("demo: {0}")]
    Demo(#[from] crate::demo::DemoError),
    #[error("bench: {0}")]
    Bench(#[from] crate::bench::BenchError),
    #[error("the engine has no record of response {0}")]
    Unmatched(String),
}

/// What a scenario sets up and sends.
struct Plan {
    engine: EngineConfig,
    clients: Vec<ClientOptions>,
    /// Requests each client sends one after another on its connection.
    requests_per_client: usize,
    max_tokens: usize,
    /// Drop one in this many of the engine's data segments.
    drop_one_in: Option<u32>,
}

/// Words in each prompt: a short question, so a request is mostly its stream.
const PROMPT_WORDS: usize = 8;
/// One request must not hang a scenario.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl Scenario {
    /// The demo chain's settings for the scenarios made of it (untuned, tuned-plain and
    /// the single fixes): 10 s, every hop in the clear.
    pub fn demo_config(self) -> Option<DemoConfig> {
        let fix = match self {
            Scenario::Untuned | Scenario::TunedPlain => None,
            Scenario::UntunedFixed(f) => Some(f),
            // More streams and a document every third request, so that the stalls are
            // more than 1 in 100 token gaps (ITL p99); the documents shorter, so that the
            // engine keeps up.
            Scenario::PrefillStall | Scenario::PrefillStallFixed => {
                return Some(DemoConfig {
                    tuned: true,
                    unchunked: self == Scenario::PrefillStall,
                    plain: true,
                    duration: Duration::from_secs(10),
                    rate: 3.0,
                    concurrency: 8,
                    long_prompt_every: 3,
                    // The shared system prompt, then 1500 words of its own.
                    long_prompt_tokens: 3500,
                    max_tokens: 48,
                    progress: false,
                    ..DemoConfig::default()
                });
            }
            _ => return None,
        };
        Some(DemoConfig {
            tuned: self == Scenario::TunedPlain,
            fix,
            plain: true,
            duration: Duration::from_secs(10),
            rate: 2.0,
            // Few clients, each sending request after request, as a service's callers
            // do (24 workers at 2/s would each send one request in 10 s).
            concurrency: 6,
            long_prompt_every: 10,
            max_tokens: 48,
            progress: false,
            ..DemoConfig::default()
        })
    }
}

/// Runs one scenario and tears everything down (the nftables rule included, also on
/// error).
pub async fn run(
    s: Scenario,
    observer: &mut dyn DemoObserver,
) -> Result<ScenarioOutcome, ScenarioError> {
    let Some(plan) = s.plan() else {
        return run_lab_load(s, observer).await;
    };
    let engine =
        Engine::start(plan.engine.clone(), "127.0.0.1:0".parse().expect("literal")).await?;
    let addr = engine.addr();
    let dropper = match plan.drop_one_in {
        Some(n) => Some(SegmentDropper::install(addr.port(), n)?),
        None => None,
    };
    observer.ready(false, addr, addr);
    let retransmits_before = kernel_retransmits();
    let started = monotonic_ns();
    let load = run_load(&plan, addr).await;
    let load_time = Duration::from_nanos(monotonic_ns() - started);
    let retransmits = kernel_retransmits()
        .zip(retransmits_before)
        .map(|(after, before)| after.saturating_sub(before));
    let dropped_segments = dropper.as_ref().map(SegmentDropper::dropped).transpose();
    drop(dropper);
    let profile = observer.finished(false);
    let streams = load.and_then(|reads| match_engine_log(reads, &engine.request_log()));
    engine.shutdown().await;
    let mut outcome = ScenarioOutcome {
        scenario: s,
        summary: String::new(),
        engine: addr,
        streams: streams?,
        retransmits,
        dropped_segments: dropped_segments?,
        load_time,
        profile,
    };
    outcome.summary = outcome.summarize();
    Ok(outcome)
}

/// Every client on its own connection, its requests one after another.
async fn run_load(plan: &Plan, addr: SocketAddr) -> Result<Vec<ReadStream>, ScenarioError> {
    let tasks: Vec<_> = plan
        .clients
        .iter()
        .enumerate()
        .map(|(i, opts)| {
            let (opts, requests, max_tokens) =
                (opts.clone(), plan.requests_per_client, plan.max_tokens);
            tokio::spawn(async move {
                let mut client = StreamClient::connect(addr, opts)
                    .await
                    .map_err(|e| format!("connect {addr}: {e}"))?;
                let mut reads = Vec::with_capacity(requests);
                for r in 0..requests {
                    let prompt = pseudo_text((i * 1000 + r) as u64, PROMPT_WORDS);
                    let read =
                        tokio::time::timeout(REQUEST_TIMEOUT, client.complete(&prompt, max_tokens))
                            .await
                            .map_err(|_| format!("request {r} took over {REQUEST_TIMEOUT:?}"))??;
                    reads.push(read);
                }
                Ok::<_, String>(reads)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        let reads = t
            .await
            .map_err(|e| ScenarioError::Client(format!("client task failed: {e}")))?
            .map_err(ScenarioError::Client)?;
        all.extend(reads);
    }
    Ok(all)
}

fn match_engine_log(
    reads: Vec<ReadStream>,
    log: &RequestLog,
) -> Result<Vec<MeasuredStream>, ScenarioError> {
    reads
        .into_iter()
        .map(|r| {
            let served = log
                .by_response_id(&r.response_id)
                .ok_or_else(|| ScenarioError::Unmatched(r.response_id.clone()))?;
            if served.token_ns.len() != r.token_read_ns.len() {
                return Err(ScenarioError::Client(format!(
                    "{}: the client read {} tokens, the engine wrote {}",
                    r.response_id,
                    r.token_read_ns.len(),
                    served.token_ns.len()
                )));
            }
            Ok(MeasuredStream {
                response_id: r.response_id,
                client_port: r.local_port,
                client_read_ns: r.token_read_ns,
                engine_write_ns: served.token_ns,
            })
        })
        .collect()
}

/// The scenarios made of the lab's usual parts: the demo's chain (engine, nginx, bench),
/// or the engine under bench load.
async fn run_lab_load(
    s: Scenario,
    observer: &mut dyn DemoObserver,
) -> Result<ScenarioOutcome, ScenarioError> {
    let started = monotonic_ns();
    let (engine, bench, profile) = match s {
        Scenario::Untuned
        | Scenario::TunedPlain
        | Scenario::PrefillStall
        | Scenario::PrefillStallFixed
        | Scenario::UntunedFixed(_) => {
            let cfg = s.demo_config().expect("a scenario of the demo's chain");
            let out = crate::demo::run_observed(&cfg, observer).await?;
            (out.engine, out.bench, out.profile)
        }
        _ => {
            let config = match s {
                Scenario::Queued => EngineConfig {
                    max_running_seqs: 2,
                    ..EngineConfig::default()
                },
                // A compute-bound step runs at the SM clock: throttled from 1980 to 1410
                // MHz (the stand-in NVML's script), every step takes 1980/1410 as long.
                Scenario::GpuThrottled => {
                    let d = EngineConfig::default();
                    let slow = |ns: u64| ns * 1980 / 1410;
                    EngineConfig {
                        step_overhead_ns: slow(d.step_overhead_ns),
                        prefill_token_ns: slow(d.prefill_token_ns),
                        decode_seq_ns: slow(d.decode_seq_ns),
                        ..d
                    }
                }
                Scenario::HostBound | Scenario::HostBoundFixed => EngineConfig {
                    host_overhead_ns: 8_000_000,
                    async_scheduling: s == Scenario::HostBoundFixed,
                    ..EngineConfig::default()
                },
                Scenario::KvPreempt | Scenario::KvPreemptFixed => EngineConfig {
                    prefix_cache: false,
                    kv_cache_tokens: (s == Scenario::KvPreempt).then_some(320),
                    ..EngineConfig::default()
                },
                _ => EngineConfig::default(),
            };
            let engine = Engine::start(config, "127.0.0.1:0".parse().expect("literal")).await?;
            observer.ready(false, engine.addr(), engine.addr());
            let load = BenchConfig {
                url: engine.base_url(),
                concurrency: match s {
                    Scenario::Queued | Scenario::QueuedFixed => 8,
                    Scenario::KvPreempt | Scenario::KvPreemptFixed => 6,
                    _ => 4,
                },
                requests: Some(24),
                prompt_tokens: 40,
                max_tokens: if matches!(s, Scenario::KvPreempt | Scenario::KvPreemptFixed) {
                    64
                } else {
                    32
                },
                progress: false,
                timeout: REQUEST_TIMEOUT,
                ..BenchConfig::default()
            };
            let bench = bench::run(&load).await;
            let profile = observer.finished(false);
            let addr = engine.addr();
            engine.shutdown().await;
            (addr, bench?, profile)
        }
    };
    let r = &bench.report;
    Ok(ScenarioOutcome {
        scenario: s,
        summary: format!(
            "{s}: {} requests ok, {} failed; TTFT p95 {:.0} ms, ITL p99 {:.0} ms",
            r.ok, r.failed, r.ttft_ms.p95, r.itl_ms.p99
        ),
        engine,
        streams: Vec::new(),
        retransmits: None,
        dropped_segments: None,
        load_time: Duration::from_nanos(monotonic_ns() - started),
        profile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_pairs_share_their_rules() {
        for s in Scenario::all() {
            assert_eq!(s.name().parse::<Scenario>().unwrap(), s, "{s} parses back");
        }
        for pair in Scenario::all()[..18].chunks(2) {
            assert_eq!(
                pair[0].rules(),
                pair[1].rules(),
                "{} and {} pair",
                pair[0],
                pair[1]
            );
            assert!(
                pair[0].has_pathology() && !pair[1].has_pathology(),
                "positive first, negative second"
            );
        }
        assert!(
            "netem".parse::<Scenario>().is_err(),
            "unknown names are errors"
        );
    }

    #[test]
    fn gaps_and_delays_come_from_client_reads_and_engine_writes() {
        let ms = 1_000_000;
        let outcome = ScenarioOutcome {
            scenario: Scenario::Nagle,
            summary: String::new(),
            engine: "127.0.0.1:1".parse().unwrap(),
            streams: vec![MeasuredStream {
                response_id: "cmpl-lab-1".into(),
                client_port: 2,
                client_read_ns: vec![10 * ms, 52 * ms, 67 * ms],
                engine_write_ns: vec![10 * ms, 25 * ms, 40 * ms],
            }],
            retransmits: Some(0),
            dropped_segments: None,
            load_time: Duration::from_secs(1),
            profile: None,
        };
        assert_eq!(outcome.gaps_between_ms(35.0, 60.0), 1, "the 42 ms gap");
        assert_eq!(outcome.gaps().count, 2, "two gaps for three tokens");
        assert_eq!(outcome.last_token_delay_ms(), 27.0, "67 - 40");
        assert_eq!(outcome.first_token_delay_ms(), 0.0, "read as written");
        assert!(
            outcome
                .summarize()
                .contains("1 of 2 client gaps in 35-60 ms"),
            "summary says it: {}",
            outcome.summarize()
        );
    }
}
