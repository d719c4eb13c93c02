//! `bench`: a streaming load client that times what users feel, in any API the lab speaks
//! (`--api`). One connection per worker, reused while the server keeps it alive; every
//! socket read and stream event timed on CLOCK_MONOTONIC. Metrics follow DESIGN.md
//! section 2 (vllm bench serve's rules), with each API's own token rule (`rules`).
mod arrivals;
pub mod conn;
pub mod decode;
pub mod record;
pub mod report;
pub mod requests;
pub mod rules;
pub mod wire;
#[cfg(test)]
mod wire_tests;

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{
    ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONNECTION, CONTENT_ENCODING, CONTENT_TYPE, HOST,
};
use hyper::{Request, Uri, Version};
use indicatif::{ProgressBar, ProgressStyle};
use thiserror::Error;
use tokio_rustls::TlsConnector;

use crate::api::Api;
use crate::words::pseudo_text;
use arrivals::Dispenser;
use collector::clock::monotonic_ns;
use conn::{Connection, Target};
pub use record::{EventArrival, RequestRecord, SseEvent, SseParser};
pub use report::{BenchReport, Summary};
pub use rules::{TokenKind, TokenMark, WireEvent};
pub use wire::WireParser;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("bad --url {0}: expected http://HOST[:PORT][/PATH] or https://...")]
    Url(String),
    #[error("connect {0}")]
    Connect(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("HTTP: {0}")]
    Http(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("bench needs --requests or --duration")]
    NoLimit,
    #[error("{0}")]
    Config(String),
}

/// What load to send and where.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Server base (`https://host:port`) or a full route (`.../v1/completions`).
    pub url: String,
    /// The API to speak; None: OpenAI Completions, or Chat with `chat`.
    pub api: Option<Api>,
    /// Choices per request (OpenAI `n`).
    pub n: usize,
    /// Ask for a stream (false: one JSON body, OpenAI and Ollama only).
    pub stream: bool,
    /// Ask for reasoning before the answer (Responses `reasoning`, Anthropic `thinking`).
    pub reasoning: bool,
    /// Force a tool call (Responses `tool_choice: "required"`, Anthropic `any`).
    pub tool_call: bool,
    pub concurrency: usize,
    pub requests: Option<u64>,
    pub duration: Option<Duration>,
    /// Request starts per second across all workers (None: as fast as workers allow).
    pub rate: Option<f64>,
    /// Prompt length in words (= tokens for the lab engine).
    pub prompt_tokens: usize,
    /// Leading words every prompt shares (a system prompt).
    pub shared_prefix: usize,
    /// Every `long_prompt_every`-th request sends `long_prompt_tokens` words instead (0: never).
    pub long_prompt_every: u64,
    pub long_prompt_tokens: usize,
    pub max_tokens: usize,
    pub chat: bool,
    pub http2: bool,
    pub insecure: bool,
    pub model: String,
    /// Per request, from start to [DONE].
    pub timeout: Duration,
    /// Show a progress bar on stderr (only when it is a terminal).
    pub progress: bool,
    /// Every n-th request sends `Accept-Encoding: gzip`, as browsers and the openai SDK
    /// do (a gateway with gzip on then compresses the stream): 0 none, 1 all, 2 every
    /// other one (SDK clients beside curl ones).
    pub accept_gzip_every: u64,
    /// Requests sent one by one before the measured load and left out of the results
    /// (they warm caches such as the engine's prefix cache, as a running service has).
    pub warmup_requests: u64,
    /// Sent as `Authorization: Bearer KEY`; never recorded or printed.
    pub api_key: Option<ApiKey>,
}

/// A key whose Debug form does not show it.
#[derive(Clone)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(redacted)")
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            url: "http://127.0.0.1:8000".into(),
            api: None,
            n: 1,
            stream: true,
            reasoning: false,
            tool_call: false,
            concurrency: 8,
            requests: Some(100),
            duration: None,
            rate: None,
            prompt_tokens: 256,
            shared_prefix: 0,
            long_prompt_every: 0,
            long_prompt_tokens: 0,
            max_tokens: 64,
            chat: false,
            http2: false,
            insecure: false,
            model: "lab-model".into(),
            timeout: Duration::from_secs(120),
            progress: true,
            warmup_requests: 0,
            accept_gzip_every: 0,
            api_key: None,
        }
    }
}

impl BenchConfig {
    /// The API spoken: `api`, else OpenAI Chat with `chat`, else OpenAI Completions.
    pub fn api(&self) -> Api {
        match (self.api, self.chat) {
            (Some(api), _) => api,
            (None, true) => Api::OpenAiChat,
            (None, false) => Api::OpenAiCompletions,
        }
    }
}

/// Records of every request and their summary.
#[derive(Debug, Clone)]
pub struct BenchOutcome {
    pub records: Vec<RequestRecord>,
    pub report: BenchReport,
}

struct Endpoint {
    target: Target,
    authority: String,
    path: String,
}

fn parse_url(cfg: &BenchConfig) -> Result<Endpoint, BenchError> {
    let uri: Uri = cfg
        .url
        .parse()
        .map_err(|_| BenchError::Url(cfg.url.clone()))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(BenchError::Url(cfg.url.clone())),
    };
    let host = uri.host().ok_or_else(|| BenchError::Url(cfg.url.clone()))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .ok_or_else(|| BenchError::Url(cfg.url.clone()))?;
    let path = match uri.path() {
        "" | "/" => cfg.api().route(&cfg.model),
        _ => uri
            .path_and_query()
            .map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string()),
    };
    Ok(Endpoint {
        target: Target {
            host,
            port,
            tls,
            http2: cfg.http2,
            insecure: cfg.insecure,
        },
        authority,
        path,
    })
}

/// The prompt of request `index`: the shared prefix, then words of its own.
pub fn prompt_words(cfg: &BenchConfig, index: u64, run_seed: u64) -> (String, String, usize) {
    // Long prompts fall mid-cycle (index every/2, then every `every`), so short runs see one.
    let total = if cfg.long_prompt_every > 0
        && index % cfg.long_prompt_every == cfg.long_prompt_every / 2
    {
        cfg.long_prompt_tokens
    } else {
        cfg.prompt_tokens
    };
    let shared = cfg.shared_prefix.min(total);
    let prefix = pseudo_text(0x5157_3731, shared);
    let own = pseudo_text(run_seed ^ index.wrapping_mul(0x9e37_79b9), total - shared);
    (prefix, own, total)
}

/// `run` for a configuration moved in (for tokio::spawn).
pub async fn run_owned(cfg: BenchConfig) -> Result<BenchOutcome, BenchError> {
    run(&cfg).await
}

/// Runs the load and returns every request's record plus the report.
pub async fn run(cfg: &BenchConfig) -> Result<BenchOutcome, BenchError> {
    if cfg.requests.is_none() && cfg.duration.is_none() {
        return Err(BenchError::NoLimit);
    }
    requests::check(cfg)?;
    let endpoint = Arc::new(parse_url(cfg)?);
    let tls = if endpoint.target.tls {
        Some(conn::tls_connector(&endpoint.target)?)
    } else {
        None
    };
    let run_seed = monotonic_ns();
    let mut warm = None;
    for i in 0..cfg.warmup_requests {
        let rec = one_request(
            cfg,
            &endpoint,
            tls.as_ref(),
            &mut warm,
            0,
            i,
            run_seed.rotate_left(17),
        )
        .await;
        if let Some(e) = rec.error {
            return Err(BenchError::Http(format!("warm-up request failed: {e}")));
        }
    }
    drop(warm);
    let start_ns = monotonic_ns();
    let dispenser = Arc::new(Dispenser {
        next: Mutex::new((0, 0.0, 0x1a2b_3c4d)),
        start_ns,
        limit: cfg.requests,
        deadline_ns: cfg.duration.map(|d| start_ns + d.as_nanos() as u64),
        rate: cfg.rate,
    });
    let progress = progress_bar(cfg);
    let shared = Arc::new(cfg.clone());
    let workers = cfg.concurrency.max(1);
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let (cfg, endpoint, tls, dispenser, progress) = (
            shared.clone(),
            endpoint.clone(),
            tls.clone(),
            dispenser.clone(),
            progress.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            let mut conn: Option<Connection> = None;
            while let Some(index) = dispenser.next().await {
                let rec = one_request(
                    &cfg,
                    &endpoint,
                    tls.as_ref(),
                    &mut conn,
                    w as u32,
                    index,
                    run_seed,
                )
                .await;
                progress.inc(1);
                out.push(rec);
            }
            out
        }));
    }
    let mut records = Vec::new();
    for t in tasks {
        records.extend(t.await.unwrap_or_default());
    }
    progress.finish_and_clear();
    records.sort_by_key(|r| r.index);
    let report = BenchReport::from_records(&records, workers, monotonic_ns() - start_ns);
    Ok(BenchOutcome { records, report })
}

fn progress_bar(cfg: &BenchConfig) -> ProgressBar {
    if !cfg.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (pb, template) = match cfg.requests {
        Some(n) => (
            ProgressBar::new(n),
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} requests",
        ),
        None => (
            ProgressBar::no_length(),
            "{spinner} [{elapsed_precise}] {pos} requests done",
        ),
    };
    pb.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

fn failed(mut rec: RequestRecord, why: String) -> RequestRecord {
    rec.ok = false;
    rec.error = Some(why);
    rec.end_ns = monotonic_ns();
    rec
}

async fn one_request(
    cfg: &BenchConfig,
    endpoint: &Endpoint,
    tls: Option<&TlsConnector>,
    slot: &mut Option<Connection>,
    worker: u32,
    index: u64,
    run_seed: u64,
) -> RequestRecord {
    let (body, prompt_tokens) = requests::body(cfg, index, run_seed);
    let mut rec = blank_record(cfg, index, worker, prompt_tokens, slot.is_none());
    if slot.is_none() {
        match conn::connect(&endpoint.target, tls).await {
            Ok(c) => *slot = Some(c),
            Err(e) => {
                rec.connect_start_ns = Some(rec.request_start_ns);
                return failed(rec, e.to_string());
            }
        }
    }
    let conn = slot.as_mut().expect("connected above");
    rec.local_port = conn.local_port;
    if rec.new_connection {
        rec.connect_start_ns = Some(conn.connect_start_ns);
        rec.connect_done_ns = Some(conn.connect_done_ns);
        rec.tls_done_ns = conn.tls_done_ns;
    }
    let req = match build_request(cfg, endpoint, conn.http2, index, body) {
        Ok(r) => r,
        Err(e) => return failed(rec, e),
    };
    let deadline = tokio::time::Instant::now() + cfg.timeout;
    conn.stats.arm();
    rec.request_start_ns = monotonic_ns();
    let resp = match tokio::time::timeout_at(deadline, conn.send(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            *slot = None;
            return failed(rec, e.to_string());
        }
        Err(_) => {
            *slot = None;
            return failed(rec, "timed out waiting for the response".into());
        }
    };
    // The first request byte is when it reached the socket, not when hyper got it.
    if let Some(t) = conn.stats.first_write_after_arm() {
        rec.request_start_ns = t;
        rec.request_sent_ns = conn.stats.first_write_done();
    }
    rec.status = resp.status().as_u16();
    let header = |name| resp.headers().get(name).and_then(|v| v.to_str().ok());
    let request_id = header("x-request-id")
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(str::to_string);
    let closing = resp.version() == Version::HTTP_10
        || header(CONNECTION.as_str()).is_some_and(|v| v.eq_ignore_ascii_case("close"));
    let mut decoder = match decode::BodyDecoder::for_encoding(header(CONTENT_ENCODING.as_str())) {
        Ok(d) => d,
        Err(e) => {
            *slot = None;
            return failed(rec, e);
        }
    };
    let mut parser = WireParser::new(cfg.api(), cfg.stream);
    let broken = read_stream(
        resp.into_body(),
        &mut decoder,
        &mut parser,
        &conn.stats,
        deadline,
        &mut rec,
    )
    .await;
    rec.end_ns = monotonic_ns();
    rec.first_byte_ns = conn.stats.first_read_after_arm();
    if rec.response_id.is_none() {
        rec.response_id = request_id;
    }
    judge(cfg, &mut rec, broken);
    let reusable = !closing
        && rec.error.is_none()
        && tokio::time::timeout(Duration::from_secs(5), conn.reusable())
            .await
            .unwrap_or(false);
    if !reusable {
        *slot = None;
    }
    rec
}

/// A request's record before it is sent.
fn blank_record(
    cfg: &BenchConfig,
    index: u64,
    worker: u32,
    prompt_tokens: usize,
    new_connection: bool,
) -> RequestRecord {
    RequestRecord {
        index,
        worker,
        ok: false,
        error: None,
        status: 0,
        http_version: if cfg.http2 { "2" } else { "1.1" },
        new_connection,
        connect_start_ns: None,
        connect_done_ns: None,
        tls_done_ns: None,
        request_start_ns: monotonic_ns(),
        request_sent_ns: None,
        first_byte_ns: None,
        end_ns: 0,
        prompt_tokens: prompt_tokens as u32,
        max_tokens: cfg.max_tokens as u32,
        usage_completion_tokens: None,
        done_seen: false,
        response_id: None,
        local_port: 0,
        events: Vec::new(),
        api: cfg.api().name(),
        stream: cfg.stream,
        choices: cfg.n as u32,
        first_body_ns: None,
        non_token_events: 0,
    }
}

/// ok: a 200 whose API's end event arrived and whose body did not break off.
fn judge(cfg: &BenchConfig, rec: &mut RequestRecord, broken: Option<String>) {
    rec.ok = rec.status == 200 && rec.done_seen && broken.is_none();
    rec.error = broken.or_else(|| {
        if rec.status != 200 {
            Some(format!("HTTP {}", rec.status))
        } else if !rec.done_seen {
            let end = requests::end_event(cfg.api(), cfg.stream);
            Some(format!("stream ended without {end}"))
        } else {
            None
        }
    });
}

/// The POST of request `index` on a connection (HTTP/2 wants the full URI, HTTP/1.1 a Host).
fn build_request(
    cfg: &BenchConfig,
    endpoint: &Endpoint,
    http2: bool,
    index: u64,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let uri = if http2 {
        let scheme = if endpoint.target.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", endpoint.authority, endpoint.path)
    } else {
        endpoint.path.clone()
    };
    let api = cfg.api();
    let mut builder = Request::post(uri)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, requests::accept(api, cfg.stream));
    for (name, value) in requests::extra_headers(api) {
        builder = builder.header(*name, *value);
    }
    if !http2 {
        builder = builder.header(HOST, endpoint.authority.as_str());
    }
    if let Some(key) = &cfg.api_key {
        builder = builder.header(AUTHORIZATION, format!("Bearer {}", key.0));
    }
    if cfg.accept_gzip_every > 0 && index.is_multiple_of(cfg.accept_gzip_every) {
        builder = builder.header(ACCEPT_ENCODING, "gzip");
    }
    builder.body(Full::new(body)).map_err(|e| e.to_string())
}

/// Reads the response body to its end, recording each token event with the time of the
/// read that completed it; the reason it broke off, if it did.
async fn read_stream(
    mut body: hyper::body::Incoming,
    decoder: &mut decode::BodyDecoder,
    parser: &mut WireParser,
    stats: &conn::IoStats,
    deadline: tokio::time::Instant,
    rec: &mut RequestRecord,
) -> Option<String> {
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => break,
            Ok(Some(Err(e))) => return Some(format!("body: {e}")),
            Err(_) => return Some("timed out reading the stream".into()),
        };
        let Some(data) = frame.data_ref() else {
            continue;
        };
        // hyper hands over a frame right after the read that completed it.
        let t_ns = stats.last_read_ns.load(Ordering::Acquire);
        let read = stats.reads.load(Ordering::Acquire);
        if rec.first_body_ns.is_none() && !data.is_empty() {
            rec.first_body_ns = Some(t_ns);
        }
        let data = match decoder.push(data) {
            Ok(d) => d,
            Err(e) => return Some(e),
        };
        for ev in parser.push(&data) {
            record_event(rec, ev, t_ns, read);
        }
    }
    let t_ns = stats.last_read_ns.load(Ordering::Acquire);
    let read = stats.reads.load(Ordering::Acquire);
    for ev in parser.finish() {
        record_event(rec, ev, t_ns, read);
    }
    None
}

/// Keeps what one event says: a token's arrival, the end, the usage count, the id.
fn record_event(rec: &mut RequestRecord, ev: WireEvent, t_ns: u64, read: u64) {
    rec.done_seen |= ev.end;
    if rec.response_id.is_none() {
        rec.response_id = ev.id;
    }
    if ev.usage_tokens.is_some() {
        rec.usage_completion_tokens = ev.usage_tokens;
    }
    match ev.token {
        Some(t) => rec.events.push(EventArrival {
            t_ns,
            read,
            choice: true,
            content: t.content,
            choice_index: t.choice_index,
            kind: t.kind,
        }),
        None => rec.non_token_events = rec.non_token_events.saturating_add(1),
    }
}

/// Writes one JSON line per request (timestamps and counts only; no text).
pub fn write_json_lines(records: &[RequestRecord], path: &Path) -> Result<(), BenchError> {
    let err = |source| BenchError::Write {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).map_err(err)?);
    for r in records {
        let line = serde_json::to_string(r).expect("records serialise");
        writeln!(f, "{line}").map_err(err)?;
    }
    f.flush().map_err(err)
}
