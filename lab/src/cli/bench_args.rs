//! `tokenscope-lab bench`'s flags, their help (the metrics and each API's token rule),
//! and how they become a `BenchConfig`.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::runtime;
use crate::api::{Api, MAX_CHOICES};
use crate::bench::{self, BenchConfig};

pub(super) const METRICS_HELP: &str = "\
Metrics (DESIGN.md section 2, the rules of vllm bench serve):
  request start  connect() when the connection was opened for this request, else the first
                 request byte; TTFT therefore includes TCP and TLS handshakes as a user
                 feels them. 'TTFT server' starts at the first request byte instead.
  first token    the first token event by the API's rule (below); with --no-stream, the
                 first byte of the JSON body.
  TTFT           first token - request start.
  ITL            gap between consecutive token events of the same choice, one sample per
                 event, pooled across requests. Events that arrive in the same socket read
                 count as gap 0: that is the signal of coalescing (a buffering proxy).
  TPOT           (last event - first event) / (events - 1), per choice, pooled per request.
  E2E            end of stream - request start.
Token events per --api (lab/API-SHAPES.md has the wire shapes):
  openai-chat, openai-completions  an SSE data event whose `choices` is non-empty (the
                 chat role chunk too; not the usage chunk); [DONE] ends.
  openai-responses  response.output_text.delta, response.reasoning_text.delta,
                 response.reasoning_summary_text.delta, response.function_call_arguments.delta;
                 response.completed ends.
  anthropic      content_block_delta of text_delta, thinking_delta or input_json_delta;
                 message_stop ends (ping, message_start, block start/stop, message_delta
                 are not tokens).
  gemini         an event with a non-empty candidates[].content.parts[].text; the one
                 with finishReason ends (a token too when it has text).
  tgi            an event whose token is not special; the one with generated_text ends.
  ollama-*       an NDJSON line with \"done\": false and non-empty response /
                 message.content (or thinking); \"done\": true ends and is not a token.
  SSE comments (': ...') are never events.
Percentiles p50/p90/p95/p99/p99.9 interpolate linearly (as numpy); never averaged.
All timestamps are CLOCK_MONOTONIC nanoseconds, the profiler's clock.";

/// Load a streaming LLM endpoint and report what users feel.
#[derive(Args, Debug, Clone)]
#[command(
    about = "Load a streaming LLM endpoint (OpenAI, Anthropic, Gemini, TGI, Ollama APIs); report TTFT, TPOT, ITL and e2e",
    long_about = "Sends streaming requests of --api (default: /v1/completions, or \
/v1/chat/completions with --chat) from --concurrency workers, each keeping one connection and \
reusing it while the server keeps it alive, and times connect, TLS, the first byte and every \
token event's arrival on CLOCK_MONOTONIC, by that API's own token rule. Prints the \
percentiles; --json writes one line per request with all timestamps (never prompt or \
completion text).",
    after_help = concat!(
        "Examples:\n",
        "  tokenscope-lab bench --url http://127.0.0.1:8000 --requests 200 --concurrency 16\n",
        "  tokenscope-lab bench --url https://gw.local --http2 --chat --duration 60s --rate 5 \\\n",
        "      --prompt-tokens 2100 --shared-prefix 2000 --json requests.jsonl\n",
        "  tokenscope-lab bench --url http://127.0.0.1:8000 --api anthropic --reasoning\n",
        "  tokenscope-lab bench --url http://127.0.0.1:8000 --api openai-chat --n 2\n"
    ),
    after_long_help = METRICS_HELP
)]
pub struct BenchArgs {
    /// Server base URL (http:// or https://); the --api's route (e.g. /v1/completions,
    /// /v1/messages) is appended unless the URL has a path.
    #[arg(long)]
    pub url: String,
    /// Workers (requests in flight at once), one connection each.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Total requests to send [default: 100 unless --duration].
    #[arg(long, conflicts_with = "duration")]
    pub requests: Option<u64>,
    /// Send requests for this long (e.g. 30s, 2m); in-flight ones finish.
    #[arg(long, value_parser = collector::duration::parse)]
    pub duration: Option<Duration>,
    /// Request arrivals per second across workers, as a Poisson process (vllm bench serve's
    /// arrivals) [default: as fast as workers free up].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Prompt length in words (one word = one token in the lab engine).
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: usize,
    /// Leading words shared by every prompt (a system prompt, for prefix caching).
    #[arg(long, default_value_t = 0)]
    pub shared_prefix: usize,
    /// Every N-th request sends --long-prompt-tokens words instead (0: never).
    #[arg(long, default_value_t = 0)]
    pub long_prompt_every: u64,
    /// Length of those long prompts in words.
    #[arg(long, default_value_t = 6000)]
    pub long_prompt_tokens: usize,
    /// Tokens to generate per request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Use /v1/chat/completions (system + user messages); the same as --api openai-chat.
    #[arg(long, conflicts_with = "api")]
    pub chat: bool,
    /// The API to speak, on its own route of --url and with its own token rule
    /// [default: openai-completions, or openai-chat with --chat].
    #[arg(long, value_enum)]
    pub api: Option<Api>,
    /// Choices per request (OpenAI `n`, openai-chat and openai-completions): each choice's
    /// tokens are their own ITL series.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_CHOICES as i64))]
    pub n: u32,
    /// Ask for one JSON body instead of a stream (openai-chat, openai-completions,
    /// ollama-generate, ollama-chat): TTFT is then its first byte, with no ITL.
    #[arg(long)]
    pub no_stream: bool,
    /// Ask for reasoning before the answer (openai-responses `reasoning`, anthropic
    /// `thinking`).
    #[arg(long)]
    pub reasoning: bool,
    /// Force a tool call whose arguments stream as the answer (openai-responses,
    /// anthropic).
    #[arg(long)]
    pub tool_call: bool,
    /// HTTP/2 (ALPN h2 over TLS, prior knowledge over cleartext).
    #[arg(long)]
    pub http2: bool,
    /// Accept any TLS certificate (self-signed lab proxies).
    #[arg(long)]
    pub insecure: bool,
    /// Model name to request.
    #[arg(long, default_value = "lab-model")]
    pub model: String,
    /// Give up on a request after this long.
    #[arg(long, default_value = "120s", value_parser = collector::duration::parse)]
    pub timeout: Duration,
    /// Write one JSON line per request (all timestamps, no text) to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Send Accept-Encoding: gzip (as browsers and the openai SDK do) and decode.
    #[arg(long)]
    pub accept_gzip: bool,
    /// Unmeasured requests sent first, one by one (warm caches as a running service has).
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Send `Authorization: Bearer KEY` (a gateway's key, e.g. LiteLLM's master key).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// No progress bar (it is off anyway when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

impl BenchArgs {
    pub fn to_config(&self) -> BenchConfig {
        BenchConfig {
            url: self.url.clone(),
            api: self.api,
            n: self.n as usize,
            stream: !self.no_stream,
            reasoning: self.reasoning,
            tool_call: self.tool_call,
            concurrency: self.concurrency,
            requests: self.requests.or(if self.duration.is_none() {
                Some(100)
            } else {
                None
            }),
            duration: self.duration,
            rate: self.rate,
            prompt_tokens: self.prompt_tokens,
            shared_prefix: self.shared_prefix,
            long_prompt_every: self.long_prompt_every,
            long_prompt_tokens: self.long_prompt_tokens,
            max_tokens: self.max_tokens,
            chat: self.chat,
            http2: self.http2,
            insecure: self.insecure,
            model: self.model.clone(),
            timeout: self.timeout,
            progress: !self.no_progress,
            warmup_requests: self.warmup,
            accept_gzip_every: u64::from(self.accept_gzip),
            api_key: self.api_key.clone().map(bench::ApiKey),
        }
    }
}

/// `tokenscope-lab bench`: runs the load, prints the report, writes --json.
pub fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    let cfg = args.to_config();
    let out = runtime()?
        .block_on(bench::run(&cfg))
        .with_context(|| format!("bench against {}", cfg.url))?;
    if let Some(path) = &args.json {
        bench::write_json_lines(&out.records, path)?;
    }
    print!("{}", out.report);
    if let Some(e) = out.records.iter().find_map(|r| r.error.as_ref()) {
        eprintln!("first error: {e}");
    }
    Ok(())
}
