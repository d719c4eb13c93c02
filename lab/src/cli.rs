//! Command-line surface of the `tokenscope-lab` binary (`demo`, `bench`, `engine`,
//! `proxy`, `scenario`) as clap types. Errors become anyhow here.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::bench;
use crate::demo::{self, DemoConfig};
use crate::engine::{Engine, EngineConfig};
use crate::proxy::{NginxProxy, ProxyConfig, ProxyMode};

mod bench_args;

use bench_args::METRICS_HELP;
pub use bench_args::{run_bench, BenchArgs};

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// on/off switch for engine features.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    On,
    Off,
}

impl Switch {
    fn on(self) -> bool {
        self == Switch::On
    }
}

const ABOUT: &str = "The tokenscope lab: a simulated LLM serving chain to profile, and the demo.";
const LONG_ABOUT: &str = "\
The tokenscope lab: a simulated OpenAI-compatible engine (continuous batching, prefix cache,
chunked prefill) doing its GPU work through a stand-in libcuda, real nginx set-ups in front of
it, a streaming load client, and the pathologies tokenscope diagnoses, reproduced on real TCP.

It is a test bench, not part of the profiler: `tokenscope` ships without it. `demo` and
`scenario -o` record with the `tokenscope` binary found beside this one (or in $TOKENSCOPE_BIN,
or on the PATH).";

/// `tokenscope-lab`: the lab's own binary.
#[derive(Parser, Debug)]
#[command(name = "tokenscope-lab", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct LabCli {
    #[command(subcommand)]
    pub command: LabCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum LabCommand {
    /// Run engine + nginx + load, recorded by tokenscope: where TTFT and ITL go.
    Demo(DemoArgs),
    /// Streaming load client for OpenAI, Anthropic, Gemini, TGI and Ollama APIs (vllm bench
    /// serve definitions, each API's own token rule).
    Bench(BenchArgs),
    /// A simulated OpenAI-compatible engine (continuous batching, prefix cache, chunked
    /// prefill) doing its GPU work through a stand-in libcuda.so.1.
    #[command(
        after_help = "Example:\n  tokenscope-lab engine --listen 127.0.0.1:8000 --prefix-cache off --chunked-prefill off"
    )]
    Engine(EngineArgs),
    /// nginx in front of an engine: --tuned (TLS + HTTP/2, keep-alive, no buffering),
    /// --tuned-plain (the same over plain HTTP/1.1) or --untuned (no keep-alive, HTTP/1.0
    /// buffered upstream, gzip, slow auth hop).
    #[command(
        after_help = "Examples:\n  tokenscope-lab proxy --untuned --upstream 127.0.0.1:8000 --listen 127.0.0.1:8080\n  tokenscope-lab proxy --tuned-plain --upstream 127.0.0.1:8000 --listen 127.0.0.1:8081"
    )]
    Proxy(ProxyArgs),
    /// Reproduce one pathology (or its fix) on this machine with real TCP, nginx and the
    /// lab engine, for a few seconds; with -o, tokenscope records it.
    #[command(after_help = "\
Examples:
  tokenscope-lab scenario nagle -o nagle.tsrec && tokenscope report nagle.tsrec
  tokenscope-lab scenario lossy          # needs root and nftables (drops 1 in 10 segments)

Scenarios (positive / negative, and the diagnosis rules they show):
  untuned / tuned-plain            rules 1-5: new connections, proxy buffering, gzip on SSE,
                                   no prefix cache, prefill stalling decodes
  untuned-keepalive, untuned-unbuffered, untuned-no-gzip, untuned-prefix-cache,
  untuned-chunked-prefill          untuned with one of rules 1-5 fixed (its fix measured alone)
  prefill-stall / prefill-stall-fixed
                                   rule 5 alone: long documents prefill whole, stalling every
                                   stream (and the same with chunked prefill)
  queued / queued-fixed            rule 6: an engine running 2 sequences under 8 streams
  nagle / nagle-fixed              rule 7: split writes without TCP_NODELAY, delayed ACK
  lossy / lossless                 rule 8: 1 in 10 of the engine's segments dropped
  slow-client / fast-client        rule 9: a client reading 256 bytes every 10 ms
  gpu-throttled / gpu-cool         rule 10: NVML (scripted stand-in) reports thermal throttling
                                   (and the engine's steps slow with the clock)
  host-bound / host-bound-fixed    rule 11: 8 ms of host work per step with the GPU idle, and
                                   the same work overlapped (vLLM --async-scheduling)
  kv-preempt / kv-preempt-fixed    rule 12: a 320-token KV cache under six streams preempts and
                                   recomputes the newest request")]
    Scenario(ScenarioArgs),
    /// Write a recording N times over, each copy later in time and on its own sockets,
    /// for the scaling bench (`cargo xtask bench scaling`).
    #[command(
        after_help = "Example:\n  tokenscope-lab replicate run.tsrec --times 100 -o run-x100.tsrec"
    )]
    Replicate(crate::replicate::ReplicateArgs),
}

/// Runs one `tokenscope-lab` command.
pub fn run(cli: LabCli) -> anyhow::Result<()> {
    match cli.command {
        LabCommand::Demo(args) => {
            let mut observer =
                crate::profiler::RecordingObserver::new().context("demo scratch directory")?;
            run_demo_observed(args, &mut observer)
        }
        LabCommand::Bench(args) => run_bench(args),
        LabCommand::Scenario(args) if args.output.is_some() => {
            crate::profiler::scenario_recorded(args)
        }
        LabCommand::Scenario(args) => run_scenario(args),
        LabCommand::Engine(args) => run_engine(args),
        LabCommand::Proxy(args) => run_proxy(args),
        LabCommand::Replicate(args) => crate::replicate::run(&args),
    }
}

#[derive(Args, Debug, Clone)]
pub struct ScenarioArgs {
    /// Which scenario (see below).
    pub name: crate::scenario::Scenario,
    /// Record it with tokenscope into this file.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Skip the prefill of prompt prefixes seen before (vLLM --enable-prefix-caching).
    #[arg(long, value_enum, default_value = "on")]
    pub prefix_cache: Switch,
    /// Split long prefills into chunks beside decodes (vLLM --enable-chunked-prefill).
    #[arg(long, value_enum, default_value = "on")]
    pub chunked_prefill: Switch,
    /// Fixed cost of every step, ms [default: 15].
    #[arg(long)]
    pub step_overhead_ms: Option<f64>,
    /// Cost per prompt token prefilled, ms [default: 0.2].
    #[arg(long)]
    pub prefill_token_ms: Option<f64>,
    /// Cost per decoding sequence in a step, ms [default: 0.2].
    #[arg(long)]
    pub decode_seq_ms: Option<f64>,
    /// Token budget per step (vLLM --max-num-batched-tokens) [default: 40].
    #[arg(long)]
    pub max_batched_tokens: Option<usize>,
    /// Sequences running at once; more requests queue (vLLM --max-num-seqs) [default: 32].
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Latency of the gateway auth endpoint /_lab/auth, ms [default: 40].
    #[arg(long)]
    pub auth_delay_ms: Option<u64>,
    /// Send `X-Accel-Buffering: no` on streams (nginx then forwards every chunk).
    #[arg(long)]
    pub x_accel_buffering_no: bool,
    /// On exit, write the step log (one JSON line per step) to FILE.
    #[arg(long, value_name = "FILE")]
    pub step_log: Option<PathBuf>,
    /// On exit, write each request's arrival and token write times (JSON lines) to FILE.
    #[arg(long, value_name = "FILE")]
    pub request_log: Option<PathBuf>,
    /// Load this libcuda.so.1 instead of the embedded stand-in in a temp dir (a path that
    /// does not exist yet gets the stand-in, kept: a stable path for uprobes).
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,
    /// KV-cache size in tokens: running sequences past it preempt the newest, which
    /// recomputes later (vLLM V1) [default: unbounded].
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// Host work per step with the GPU idle (output processing, scheduling), ms [default: 0].
    #[arg(long)]
    pub host_overhead_ms: Option<f64>,
    /// Overlap each step's host work with the GPU work before it (vLLM --async-scheduling).
    #[arg(long)]
    pub async_scheduling: bool,
    /// Call the driver's per-thread default stream entry points (cuLaunchKernel_ptsz...),
    /// as engines built with `--default-stream per-thread` do.
    #[arg(long)]
    pub per_thread_stream: bool,
    /// End each step with cuCtxSynchronize_v2 (the whole device) instead of
    /// cuStreamSynchronize, as PyTorch on CUDA 13 does for torch.cuda.synchronize().
    #[arg(long)]
    pub device_sync: bool,
    /// Model name served.
    #[arg(long, default_value = "lab-model")]
    pub model: String,
}

fn ms_to_ns(ms: f64) -> u64 {
    (ms.max(0.0) * 1e6) as u64
}

impl EngineArgs {
    pub fn to_config(&self) -> EngineConfig {
        let d = EngineConfig::default();
        EngineConfig {
            model: self.model.clone(),
            prefix_cache: self.prefix_cache.on(),
            chunked_prefill: self.chunked_prefill.on(),
            step_overhead_ns: self.step_overhead_ms.map_or(d.step_overhead_ns, ms_to_ns),
            prefill_token_ns: self.prefill_token_ms.map_or(d.prefill_token_ns, ms_to_ns),
            decode_seq_ns: self.decode_seq_ms.map_or(d.decode_seq_ns, ms_to_ns),
            max_batched_tokens: self
                .max_batched_tokens
                .unwrap_or(d.max_batched_tokens)
                .max(1),
            max_running_seqs: self.max_num_seqs.unwrap_or(d.max_running_seqs).max(1),
            auth_delay: self
                .auth_delay_ms
                .map_or(d.auth_delay, Duration::from_millis),
            x_accel_buffering_no: self.x_accel_buffering_no,
            libcuda_path: self.libcuda.clone(),
            per_thread_stream: self.per_thread_stream,
            device_sync: self.device_sync,
            host_overhead_ns: self.host_overhead_ms.map_or(d.host_overhead_ns, ms_to_ns),
            async_scheduling: self.async_scheduling,
            kv_cache_tokens: self.kv_cache_tokens,
            ..d
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// TLS + HTTP/2, keep-alive both sides, proxy_buffering off, gzip off.
    #[arg(long, conflicts_with_all = ["untuned", "tuned_plain"], required_unless_present_any = ["untuned", "tuned_plain"])]
    pub tuned: bool,
    /// As --tuned, over plain HTTP/1.1 to clients (no TLS).
    #[arg(long, conflicts_with = "untuned")]
    pub tuned_plain: bool,
    /// No keep-alive, HTTP/1.0 buffered upstream, gzip on, auth_request hop.
    #[arg(long)]
    pub untuned: bool,
    /// The engine to forward to.
    #[arg(long)]
    pub upstream: SocketAddr,
    /// Address to listen on [default: a free port on 127.0.0.1].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// nginx binary.
    #[arg(long, default_value = "nginx")]
    pub nginx: PathBuf,
}

/// Ctrl-C or SIGTERM (how scripts and test harnesses stop a background process).
async fn wait_for_stop() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
        _ = term.recv() => Ok(()),
    }
}

fn write_lines<T: serde::Serialize>(items: &[T], path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for item in items {
        serde_json::to_writer(&mut f, item)?;
        f.write_all(b"\n")?;
    }
    f.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// `tokenscope-lab scenario NAME` without recording it.
fn run_scenario(a: ScenarioArgs) -> anyhow::Result<()> {
    let out = runtime()?
        .block_on(crate::scenario::run(a.name, &mut demo::NoObserver))
        .with_context(|| format!("scenario {}", a.name))?;
    println!("{}: {}\n{}", a.name, a.name.describe(), out.summary);
    Ok(())
}

/// `tokenscope-lab engine`: serves until Ctrl-C or SIGTERM, then writes its logs.
fn run_engine(a: EngineArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let engine = Engine::start(a.to_config(), a.listen)
            .await
            .context("starting the lab engine")?;
        println!(
            "engine on {} (stand-in GPU: {}, pid {}); Ctrl-C stops",
            engine.base_url(),
            engine.libcuda_path().display(),
            std::process::id()
        );
        wait_for_stop().await?;
        if let Some(c) = engine.cuda_call_counts() {
            println!(
                "stand-in driver calls: {} kernel launches, {} graph launches, {} copies, {} synchronisations ({} through _ptsz entry points, {} of the whole device)",
                c.launch_kernel, c.graph_launch, c.memcpy_dtoh_async, c.stream_synchronize, c.per_thread_stream, c.ctx_synchronize
            );
        }
        let (steps, requests) = (engine.step_log(), engine.request_log());
        engine.shutdown().await;
        if let Some(path) = &a.step_log {
            write_lines(&steps.snapshot(), path)?;
        }
        if let Some(path) = &a.request_log {
            write_lines(&requests.snapshot(), path)?;
        }
        Ok(())
    })
}

/// `tokenscope-lab proxy`: nginx until Ctrl-C or SIGTERM.
fn run_proxy(a: ProxyArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let mode = if a.tuned {
            ProxyMode::Tuned
        } else if a.tuned_plain {
            ProxyMode::TunedPlain
        } else {
            ProxyMode::Untuned
        };
        let proxy = NginxProxy::start(ProxyConfig {
            listen: a.listen,
            nginx: a.nginx.clone(),
            ..ProxyConfig::new(mode, a.upstream)
        })
        .await
        .context("starting nginx")?;
        println!(
            "{mode} nginx on {} (pid {}, config in {}); Ctrl-C stops",
            proxy.url(),
            proxy.pid(),
            proxy.dir().display()
        );
        wait_for_stop().await
    })
}

/// The whole chain on one machine, untuned or tuned.
#[derive(Args, Debug, Clone)]
#[command(
    about = "Run engine + nginx + load on this machine and report what users feel",
    long_about = "Starts the lab engine, an nginx gateway and a bench load: chat requests with a \
shared 2,000-word system prompt and an occasional 6,000-word document. Untuned (the default): \
no prefix cache, no chunked prefill, nginx without keep-alive, buffering an HTTP/1.0 upstream, \
gzip on and an auth hop. --tuned: prefix cache, chunked prefill, nginx with TLS + HTTP/2, \
keep-alive and proxy_buffering off. Needs nginx and openssl.",
    after_help = "Examples:\n  tokenscope-lab demo\n  tokenscope-lab demo --tuned --duration 30s\n  tokenscope-lab demo --compare",
    after_long_help = METRICS_HELP
)]
pub struct DemoArgs {
    /// Remove every cause: prefix cache, chunked prefill, tuned nginx.
    #[arg(long, conflicts_with = "compare")]
    pub tuned: bool,
    /// Run untuned, then tuned, and print both reports and a side-by-side table.
    #[arg(long)]
    pub compare: bool,
    /// How long to send load.
    #[arg(long, default_value = "30s", value_parser = collector::duration::parse)]
    pub duration: Duration,
    /// Request arrivals per second, Poisson [default: 1.45].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Most requests in flight at once [default: 24].
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Write the bench's per-request JSON lines to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Untuned side: TLS (HTTP/1.1) on the client hop too, as production edges have.
    #[arg(long)]
    pub client_tls: bool,
}

/// `tokenscope-lab demo [--tuned | --compare]` without the profiler: prints the set-up and the bench report(s).
pub fn run_demo(args: DemoArgs) -> anyhow::Result<()> {
    run_demo_observed(args, &mut demo::NoObserver)
}

/// [`run_demo`] with an observer (tokenscope records each side and adds its report).
pub fn run_demo_observed(
    args: DemoArgs,
    observer: &mut dyn demo::DemoObserver,
) -> anyhow::Result<()> {
    let d = DemoConfig::default();
    let cfg = DemoConfig {
        tuned: args.tuned,
        client_tls: args.client_tls,
        duration: args.duration,
        concurrency: args.concurrency.unwrap_or(d.concurrency).max(1),
        rate: args.rate.unwrap_or(d.rate),
        progress: !observer.takes_terminal(),
        ..d
    };
    let rt = runtime()?;
    let sides: Vec<bool> = if args.compare {
        vec![false, true]
    } else {
        vec![cfg.tuned]
    };
    let mut outcomes = Vec::new();
    for tuned in sides {
        let cfg = DemoConfig {
            tuned,
            ..cfg.clone()
        };
        print!("{}", demo::describe(&cfg));
        let out = rt
            .block_on(demo::run_observed(&cfg, observer))
            .context("demo")?;
        println!("via {}", out.proxy_url);
        print!("{}", out.bench.report);
        println!();
        if let Some(profile) = &out.profile {
            println!("{profile}");
        }
        outcomes.push(out);
    }
    if let Some(path) = &args.json {
        let records: Vec<_> = outcomes
            .iter()
            .flat_map(|o| o.bench.records.iter().cloned())
            .collect();
        bench::write_json_lines(&records, path)?;
    }
    if let [untuned, tuned] = &outcomes[..] {
        print!("{}", demo::comparison_table(untuned, tuned));
        if let Some(more) = observer.compared(untuned, tuned) {
            print!("{more}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Api;

    use LabCommand as Cmd;

    fn parse(args: &[&str]) -> Result<Cmd, clap::Error> {
        LabCli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|t| t.command)
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        LabCli::command().debug_assert();
    }

    #[test]
    fn command_lines_parse_as_documented() {
        let Ok(Cmd::Bench(b)) = parse(&[
            "bench",
            "--url",
            "https://h:8443",
            "--http2",
            "--duration",
            "30s",
        ]) else {
            panic!("bench with --duration parses");
        };
        let c = b.to_config();
        assert_eq!(
            (c.requests, c.duration),
            (None, Some(Duration::from_secs(30)))
        );
        assert!(c.http2 && c.url == "https://h:8443");
        let Ok(Cmd::Bench(b)) = parse(&["bench", "--url", "http://h"]) else {
            panic!("bench with only --url parses");
        };
        assert_eq!(b.to_config().requests, Some(100), "100 requests by default");
        assert!(
            parse(&[
                "bench",
                "--url",
                "http://h",
                "--requests",
                "5",
                "--duration",
                "5s"
            ])
            .is_err(),
            "--requests and --duration conflict"
        );
        let Ok(Cmd::Engine(e)) = parse(&[
            "engine",
            "--prefix-cache",
            "off",
            "--chunked-prefill",
            "off",
        ]) else {
            panic!("lab engine parses");
        };
        let cfg = e.to_config();
        assert!(
            !cfg.prefix_cache && !cfg.chunked_prefill,
            "switches turn features off"
        );
        assert_eq!(
            cfg.step_overhead_ns,
            EngineConfig::default().step_overhead_ns
        );
        assert!(
            parse(&["proxy", "--upstream", "127.0.0.1:1"]).is_err(),
            "proxy needs a mode"
        );
        assert!(
            parse(&["proxy", "--tuned", "--untuned", "--upstream", "127.0.0.1:1"]).is_err(),
            "one mode only"
        );
        assert!(
            parse(&[
                "proxy",
                "--tuned-plain",
                "--untuned",
                "--upstream",
                "127.0.0.1:1"
            ])
            .is_err(),
            "one mode only"
        );
        assert!(matches!(
            parse(&["proxy", "--tuned-plain", "--upstream", "127.0.0.1:1"]),
            Ok(Cmd::Proxy(p)) if p.tuned_plain && !p.tuned && !p.untuned
        ));
        assert!(matches!(parse(&["demo", "--tuned"]), Ok(Cmd::Demo(d)) if d.tuned));
        assert!(
            parse(&["demo", "--tuned", "--compare"]).is_err(),
            "--compare runs both sides"
        );
    }

    #[test]
    fn bench_api_flags_parse_and_default_to_todays_behaviour() {
        let Ok(Cmd::Bench(b)) = parse(&["bench", "--url", "http://h", "--chat"]) else {
            panic!("bench --chat parses");
        };
        let c = b.to_config();
        assert_eq!(
            (c.api(), c.n, c.stream),
            (Api::OpenAiChat, 1, true),
            "--chat is openai-chat, streaming, one choice"
        );
        let Ok(Cmd::Bench(b)) = parse(&["bench", "--url", "http://h"]) else {
            panic!("bench parses");
        };
        assert_eq!(
            b.to_config().api(),
            Api::OpenAiCompletions,
            "the default API"
        );
        let Ok(Cmd::Bench(b)) = parse(&[
            "bench",
            "--url",
            "http://h",
            "--api",
            "ollama-generate",
            "--no-stream",
        ]) else {
            panic!("bench --api ollama-generate --no-stream parses");
        };
        let c = b.to_config();
        assert_eq!((c.api(), c.stream), (Api::OllamaGenerate, false));
        let Ok(Cmd::Bench(b)) = parse(&[
            "bench",
            "--url",
            "http://h",
            "--api",
            "openai-chat",
            "--n",
            "2",
        ]) else {
            panic!("bench --n 2 parses");
        };
        assert_eq!(b.to_config().n, 2);
        assert!(
            parse(&["bench", "--url", "http://h", "--chat", "--api", "gemini"]).is_err(),
            "--chat and --api conflict"
        );
        assert!(
            parse(&["bench", "--url", "http://h", "--n", "0"]).is_err(),
            "--n starts at 1"
        );
        assert!(
            parse(&["bench", "--url", "http://h", "--api", "grpc"]).is_err(),
            "unknown APIs are refused"
        );
    }
}
