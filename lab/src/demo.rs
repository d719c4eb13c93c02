//! `tokenscope-lab demo`: engine + nginx + bench on one machine. Untuned reproduces the classic
//! slow stream (no prefix cache, no chunked prefill, a buffering gateway without
//! keep-alive); tuned removes each cause. Only the mechanisms differ, never a sleep.
use std::time::Duration;

use thiserror::Error;

use crate::bench::{self, BenchConfig, BenchError, BenchOutcome};
use crate::engine::{Engine, EngineConfig, EngineError, Step};
use crate::proxy::{NginxProxy, OneFix, ProxyConfig, ProxyError, ProxyMode};

#[derive(Debug, Error)]
pub enum DemoError {
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("proxy: {0}")]
    Proxy(#[from] ProxyError),
    #[error("bench: {0}")]
    Bench(#[from] BenchError),
}

/// The demo's workload: an agent-style app with a long shared system prompt.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    pub tuned: bool,
    /// Tuned in plain HTTP/1.1 to clients instead of TLS + HTTP/2 (every hop in the clear).
    pub plain: bool,
    /// Untuned with TLS (HTTP/1.1) on the client hop: what most production edges add.
    pub client_tls: bool,
    pub duration: Duration,
    /// Request arrivals per second (open loop, as users arrive on their own).
    pub rate: f64,
    /// Most requests in flight at once.
    pub concurrency: usize,
    /// Words of the system prompt every request shares.
    pub system_prompt_tokens: usize,
    /// Words of each request's own question.
    pub question_tokens: usize,
    /// Every n-th request pastes a long document instead.
    pub long_prompt_every: u64,
    pub long_prompt_tokens: usize,
    pub max_tokens: usize,
    pub progress: bool,
    /// Untuned with one of its causes fixed.
    pub fix: Option<OneFix>,
    /// Tuned, but the engine's chunked prefill off (rule 5's cause alone).
    pub unchunked: bool,
    /// Requests sent (and left out of the bench's figures) before the load starts.
    pub warmup_requests: u64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            tuned: false,
            plain: false,
            client_tls: false,
            duration: Duration::from_secs(30),
            rate: 1.45,
            concurrency: 24,
            system_prompt_tokens: 2000,
            question_tokens: 40,
            long_prompt_every: 40,
            long_prompt_tokens: 6000,
            max_tokens: 96,
            progress: true,
            fix: None,
            unchunked: false,
            warmup_requests: 1,
        }
    }
}

/// What a demo run measured.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    pub tuned: bool,
    pub engine: std::net::SocketAddr,
    pub proxy_url: String,
    pub bench: BenchOutcome,
    pub steps: Vec<Step>,
    /// What the observer (the profiler) reported for this side.
    pub profile: Option<String>,
}

/// Watches each side of the demo: tokenscope records while the load runs.
pub trait DemoObserver {
    /// The engine and the proxy listen; the load starts when this returns.
    fn ready(&mut self, tuned: bool, engine: std::net::SocketAddr, proxy: std::net::SocketAddr);
    /// The load finished; returns what to print after the bench's report.
    fn finished(&mut self, tuned: bool) -> Option<String>;
    /// Both sides ran: what to print after the side-by-side table.
    fn compared(&mut self, _untuned: &DemoOutcome, _tuned: &DemoOutcome) -> Option<String> {
        None
    }
    /// The observer draws on the terminal while the load runs: no progress bar then.
    fn takes_terminal(&self) -> bool {
        false
    }
}

/// The demo on its own, observed by nobody.
pub struct NoObserver;

impl DemoObserver for NoObserver {
    fn ready(&mut self, _: bool, _: std::net::SocketAddr, _: std::net::SocketAddr) {}
    fn finished(&mut self, _: bool) -> Option<String> {
        None
    }
}

impl DemoConfig {
    /// The engine set-up of this side of the demo.
    pub fn engine_config(&self) -> EngineConfig {
        match (self.tuned, self.fix) {
            (true, _) => EngineConfig {
                chunked_prefill: !self.unchunked,
                ..EngineConfig::tuned()
            },
            (false, Some(OneFix::PrefixCache)) => EngineConfig {
                prefix_cache: true,
                ..EngineConfig::untuned()
            },
            (false, Some(OneFix::ChunkedPrefill)) => EngineConfig {
                chunked_prefill: true,
                max_batched_tokens: EngineConfig::tuned().max_batched_tokens,
                ..EngineConfig::untuned()
            },
            (false, _) => EngineConfig::untuned(),
        }
    }

    /// The load of this side: same prompts either way, HTTP/2 over TLS when tuned.
    pub fn bench_config(&self, url: String) -> BenchConfig {
        BenchConfig {
            url,
            concurrency: self.concurrency,
            rate: Some(self.rate),
            requests: None,
            duration: Some(self.duration),
            prompt_tokens: self.system_prompt_tokens + self.question_tokens,
            shared_prefix: self.system_prompt_tokens,
            long_prompt_every: self.long_prompt_every,
            long_prompt_tokens: self.long_prompt_tokens,
            max_tokens: self.max_tokens,
            chat: true,
            http2: self.tuned && !self.plain,
            insecure: true,
            progress: self.progress,
            warmup_requests: self.warmup_requests,
            // One client in four accepts gzip; the others (curl, many HTTP libraries)
            // do not ask for it.
            accept_gzip_every: 4,
            ..BenchConfig::default()
        }
    }
}

/// Runs one side of the demo and tears everything down.
pub async fn run(cfg: &DemoConfig) -> Result<DemoOutcome, DemoError> {
    run_observed(cfg, &mut NoObserver).await
}

/// [`run`], telling `observer` when the load starts and ends.
pub async fn run_observed(
    cfg: &DemoConfig,
    observer: &mut dyn DemoObserver,
) -> Result<DemoOutcome, DemoError> {
    let engine =
        Engine::start(cfg.engine_config(), "127.0.0.1:0".parse().expect("literal")).await?;
    let mode = match (cfg.tuned, cfg.plain, cfg.client_tls) {
        (true, false, _) => ProxyMode::Tuned,
        (true, true, _) => ProxyMode::TunedPlain,
        (false, _, false) => ProxyMode::Untuned,
        (false, _, true) => ProxyMode::UntunedTls,
    };
    let proxy = NginxProxy::start(ProxyConfig {
        fix: cfg.fix,
        ..ProxyConfig::new(mode, engine.addr())
    })
    .await?;
    let proxy_url = proxy.url();
    observer.ready(cfg.tuned, engine.addr(), proxy.addr());
    let bench = bench::run(&cfg.bench_config(proxy_url.clone())).await;
    let profile = observer.finished(cfg.tuned);
    let bench = bench?;
    let steps = engine.step_log().snapshot();
    let engine_addr = engine.addr();
    drop(proxy);
    engine.shutdown().await;
    Ok(DemoOutcome {
        tuned: cfg.tuned,
        engine: engine_addr,
        proxy_url,
        bench,
        steps,
        profile,
    })
}

/// The set-up in words, printed above the report.
pub fn describe(cfg: &DemoConfig) -> String {
    let side = if cfg.tuned {
        "tuned: prefix cache on, chunked prefill on; nginx with TLS + HTTP/2, keep-alive \
         both sides, proxy_buffering off, gzip off"
    } else {
        "untuned: prefix cache off, chunked prefill off; nginx without keep-alive, HTTP/1.0 \
         upstream with proxy_buffering on, gzip on, auth_request hop"
    };
    let side = if cfg.client_tls && !cfg.tuned {
        format!("{side}; TLS on the client hop")
    } else {
        side.to_string()
    };
    format!(
        "tokenscope-lab demo ({side})\nload: {:.1} requests/s (at most {} in flight) for {:.0} s, chat, {}-word shared system \
         prompt + {}-word question, every {}th request a {}-word document, {} tokens out; one client \
         in four accepts gzip\n",
        cfg.rate,
        cfg.concurrency,
        cfg.duration.as_secs_f64(),
        cfg.system_prompt_tokens,
        cfg.question_tokens,
        cfg.long_prompt_every,
        cfg.long_prompt_tokens,
        cfg.max_tokens
    )
}

/// The seed article's three numbers side by side: TTFT p95, mean ITL, p99 ITL.
pub fn comparison_table(untuned: &DemoOutcome, tuned: &DemoOutcome) -> String {
    let (u, t) = (&untuned.bench.report, &tuned.bench.report);
    let row = |name: &str, a: f64, b: f64| {
        format!(
            "{name:<14} {a:>10.0} {b:>10.0} {:>9.1}x\n",
            if b > 0.0 { a / b } else { 0.0 }
        )
    };
    let mut out = format!(
        "{:<14} {:>10} {:>10} {:>10}\n",
        "(ms)", "untuned", "tuned", "factor"
    );
    out += &row("TTFT p95", u.ttft_ms.p95, t.ttft_ms.p95);
    out += &row("mean ITL", u.itl_ms.mean, t.itl_ms.mean);
    out += &row("p99 ITL", u.itl_ms.p99, t.itl_ms.p99);
    out
}
