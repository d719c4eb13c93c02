//! The engine's HTTP/1.1 front: the streaming routes of every API the lab speaks (OpenAI
//! Chat/Completions/Responses, Anthropic Messages, Gemini, TGI, Ollama), one engine and
//! scheduler behind them all, and a slow gateway-auth route.
mod anthropic;
mod apis;
mod conn_io;
pub mod error;
mod fields;
mod framing;
mod gemini;
mod ollama;
pub mod openai;
mod responses;
mod tgi;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::api::Api;
use crate::engine::{EngineCore, Prompt, RequestLog, ServedRequest, Submission, TokenEvent};
use crate::words::seed_of;
use apis::Parsed;
use collector::clock::monotonic_ns;
use conn_io::ConnIo;
use error::ApiError;
use framing::{Framer, StreamContext};

/// Largest request body accepted (a 6,000-word prompt is ~40 KiB).
const MAX_BODY_BYTES: usize = 16 << 20;
/// A client that stops sending its body mid-way gets an error, not a hung handler.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Route a gateway's auth_request subrequest calls.
pub const AUTH_PATH: &str = "/_lab/auth";

/// Response body: either a fixed JSON body or an SSE stream fed by the scheduler.
pub enum LabBody {
    Full(Option<Bytes>),
    Sse(SseStream),
}

/// Pulls tokens from the engine and frames them; dropping it (client gone) closes the
/// channel, which makes the scheduler abort the request.
pub struct SseStream {
    request_id: u64,
    log: RequestLog,
    tokens: mpsc::UnboundedReceiver<TokenEvent>,
    /// A token taken before the head was sent, framed first.
    first: Option<TokenEvent>,
    /// The API's opening events, not written yet.
    preamble: Option<Vec<u8>>,
    framer: Box<dyn Framer>,
    keepalive: Option<Keepalive>,
    done: bool,
}

/// The timer of an API's keep-alive events (Anthropic's pings).
struct Keepalive {
    every: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl SseStream {
    fn frame(&mut self, ev: TokenEvent) -> Frame<Bytes> {
        self.done = ev.finished;
        self.log.token(
            self.request_id,
            monotonic_ns(),
            ev.cached_prompt_tokens,
            ev.finished,
        );
        let mut out = self.preamble.take().unwrap_or_default();
        out.extend_from_slice(&self.framer.on_token(&ev));
        Frame::data(Bytes::from(out))
    }

    /// A keep-alive event when its interval has passed since the last one.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Option<Frame<Bytes>> {
        let k = self.keepalive.as_mut()?;
        k.timer.as_mut().poll(cx).is_ready().then(|| {
            let next = tokio::time::Instant::now() + k.every;
            k.timer.as_mut().reset(next);
            Frame::data(Bytes::from(self.framer.keepalive()))
        })
    }
}

impl Body for LabBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            LabBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            LabBody::Sse(s) => {
                if s.done {
                    return Poll::Ready(None);
                }
                if let Some(ev) = s.first.take() {
                    return Poll::Ready(Some(Ok(s.frame(ev))));
                }
                if let Some(p) = s.preamble.take().filter(|p| !p.is_empty()) {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(p)))));
                }
                match s.tokens.poll_recv(cx) {
                    Poll::Pending => match s.poll_keepalive(cx) {
                        Some(frame) => Poll::Ready(Some(Ok(frame))),
                        None => Poll::Pending,
                    },
                    Poll::Ready(None) => {
                        s.done = true;
                        Poll::Ready(None)
                    }
                    Poll::Ready(Some(ev)) => Poll::Ready(Some(Ok(s.frame(ev)))),
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            LabBody::Full(b) => b.is_none(),
            LabBody::Sse(s) => s.done,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            LabBody::Full(Some(b)) => hyper::body::SizeHint::with_exact(b.len() as u64),
            LabBody::Full(None) => hyper::body::SizeHint::with_exact(0),
            LabBody::Sse(_) => hyper::body::SizeHint::default(),
        }
    }
}

fn json_response(status: u16, body: Bytes) -> Response<LabBody> {
    let mut r = Response::new(LabBody::Full(Some(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn engine_stopped() -> ApiError {
    ApiError::new(503, "ServiceUnavailable", "engine stopped")
}

fn error_response(e: &ApiError) -> Response<LabBody> {
    json_response(e.status, e.body())
}

/// The error in the shape `api`'s clients parse.
fn api_error_response(api: Api, e: &ApiError) -> Response<LabBody> {
    json_response(e.status, e.body_for(api))
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Accepts connections until `shutdown` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    core: EngineCore,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of descriptors and the like: keep serving the connections we have.
                Err(_) => { tokio::time::sleep(Duration::from_millis(10)).await; continue; }
            },
            _ = shutdown.changed() => return,
        };
        conn_io::configure(&stream, &core.cfg);
        let io = ConnIo::new(stream, core.cfg.split_chunk_writes);
        let last_read = io.last_read();
        let core = core.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let core = core.clone();
                // The read that brought this request's head (hyper hands it over after it).
                let read_ns = last_read.load(std::sync::atomic::Ordering::Relaxed);
                async move { Ok::<_, Infallible>(route(core, req, read_ns).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = conn_shutdown.changed() => {}
            }
        });
    }
}

/// The API a generation route speaks.
fn api_of_path(path: &str) -> Option<Api> {
    match path {
        "/v1/completions" => Some(Api::OpenAiCompletions),
        "/v1/chat/completions" => Some(Api::OpenAiChat),
        "/v1/responses" => Some(Api::OpenAiResponses),
        "/v1/messages" => Some(Api::Anthropic),
        "/generate_stream" => Some(Api::Tgi),
        "/api/generate" => Some(Api::OllamaGenerate),
        "/api/chat" => Some(Api::OllamaChat),
        p if gemini::model_of_path(p).is_some() => Some(Api::Gemini),
        _ => None,
    }
}

async fn route(core: EngineCore, req: Request<Incoming>, read_ns: u64) -> Response<LabBody> {
    // The request's head is in: its first bytes arrived with the connection's last read
    // (the handler may run later on a busy runtime).
    let now = monotonic_ns();
    let head_ns = if read_ns > 0 && read_ns <= now {
        read_ns
    } else {
        now
    };
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let api = api_of_path(&path);
    if let (Some(api), &Method::POST) = (api, &method) {
        return generate(core, req, api, head_ns).await;
    }
    if let (Some(Api::OpenAiCompletions), &Method::GET) = (api, &method) {
        // EventSource can only GET: the request rides in the query, with no body.
        let query = req.uri().query().unwrap_or("").to_string();
        return match query_request(&query) {
            Ok(body) => {
                generate_body(core, Api::OpenAiCompletions, &path, None, body, head_ns).await
            }
            Err(e) => api_error_response(Api::OpenAiCompletions, &e),
        };
    }
    match (&method, path.as_str()) {
        (&Method::GET, "/health") => json_response(200, Bytes::new()),
        (&Method::GET, "/v1/models") => {
            json_response(200, openai::models_body(&core.cfg, unix_now().as_secs()))
        }
        (_, AUTH_PATH) => {
            // The gateway's auth service: its latency is the hop's cost.
            tokio::time::sleep(core.cfg.auth_delay).await;
            let mut r = Response::new(LabBody::Full(None));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        (_, p) if api.is_some() || matches!(p, "/health" | "/v1/models") => {
            error_response(&ApiError::new(
                405,
                "invalid_request_error",
                format!("method {method} not allowed on {path}"),
            ))
        }
        _ => error_response(&ApiError::new(
            404,
            "NotFoundError",
            format!("no route {path}"),
        )),
    }
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES);
    match tokio::time::timeout(BODY_READ_TIMEOUT, body.collect()).await {
        Err(_) => Err(ApiError::new(
            408,
            "invalid_request_error",
            "request body timed out",
        )),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            413,
            "invalid_request_error",
            format!("request body exceeds {MAX_BODY_BYTES} bytes"),
        )),
        Ok(Err(_)) => Err(ApiError::bad_request(
            "request body could not be read",
            None,
        )),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

/// Serves one generation request of `api`: validate, hand to the scheduler, then stream
/// the API's framing of the tokens (or write the whole body after the last one).
async fn generate(
    core: EngineCore,
    req: Request<Incoming>,
    api: Api,
    head_ns: u64,
) -> Response<LabBody> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return api_error_response(api, &e),
    };
    generate_body(core, api, &path, query.as_deref(), body, head_ns).await
}

/// `GET /v1/completions?prompt=..&max_tokens=N`: the completion request as its JSON body
/// (streamed: an event stream is what an EventSource reads).
fn query_request(query: &str) -> Result<Bytes, ApiError> {
    let mut prompt = None;
    let mut max_tokens = None;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "prompt" => prompt = Some(percent_decode(v)),
            "max_tokens" => max_tokens = v.parse::<u64>().ok(),
            _ => {}
        }
    }
    let prompt = prompt.ok_or_else(|| ApiError::bad_request("GET needs ?prompt=", None))?;
    let mut body = serde_json::json!({ "prompt": prompt, "stream": true });
    if let Some(n) = max_tokens {
        body["max_tokens"] = n.into();
    }
    Ok(Bytes::from(body.to_string()))
}

/// `+` and `%XX` of a query value (invalid escapes kept as they are).
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn generate_body(
    core: EngineCore,
    api: Api,
    path: &str,
    query: Option<&str>,
    body: Bytes,
    head_ns: u64,
) -> Response<LabBody> {
    let parsed = match Parsed::parse(api, path, query, &body, &core.cfg) {
        Ok(p) => p,
        Err(e) => return api_error_response(api, &e),
    };
    let prompt = Prompt::from_text(parsed.prompt_text(), core.cfg.block_size);
    let prompt_tokens = prompt.tokens;
    let id_num = core.next_request_id();
    let now = unix_now();
    let received_ns = monotonic_ns();
    let framer = parsed.framer(StreamContext {
        request_id: id_num,
        model: parsed.model(&core.cfg).to_string(),
        created_unix: now.as_secs(),
        created_unix_ns: now.as_nanos(),
        received_ns,
        prompt_tokens,
    });
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = core.submit(Submission {
        id: id_num,
        prompt,
        max_tokens: parsed.max_tokens(),
        seed: seed_of(parsed.prompt_text()),
        sink: tx,
    });
    if !submitted {
        return api_error_response(api, &engine_stopped());
    }
    core.requests.received(ServedRequest {
        request_id: id_num,
        response_id: framer.response_id().to_string(),
        stream: parsed.stream(),
        prompt_tokens: prompt_tokens as u32,
        cached_prompt_tokens: 0,
        head_ns,
        received_ns,
        token_ns: Vec::new(),
        finished: false,
    });
    if parsed.stream() {
        stream_response(&core, api, id_num, framer, rx).await
    } else {
        whole_response(&core, api, id_num, framer, rx).await
    }
}

async fn stream_response(
    core: &EngineCore,
    api: Api,
    request_id: u64,
    mut framer: Box<dyn Framer>,
    rx: mpsc::UnboundedReceiver<TokenEvent>,
) -> Response<LabBody> {
    let keepalive = framer.sends_keepalives().then(|| Keepalive {
        every: core.cfg.ping_interval,
        timer: Box::pin(tokio::time::sleep(core.cfg.ping_interval)),
    });
    let content_type = framer.content_type();
    let id = HeaderValue::from_str(framer.response_id()).ok();
    let mut sse = SseStream {
        request_id,
        log: core.requests.clone(),
        tokens: rx,
        first: None,
        preamble: Some(framer.preamble()),
        framer,
        keepalive,
        done: false,
    };
    if core.cfg.split_chunk_writes {
        // The head then leaves with the first token, in one write.
        match sse.tokens.recv().await {
            Some(ev) => sse.first = Some(ev),
            None => return api_error_response(api, &engine_stopped()),
        }
    }
    let mut r = Response::new(LabBody::Sse(sse));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(id) = id {
        h.insert("x-request-id", id);
    }
    if core.cfg.x_accel_buffering_no {
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    }
    r
}

/// `"stream": false`: waits for the last token, then one JSON body.
async fn whole_response(
    core: &EngineCore,
    api: Api,
    request_id: u64,
    mut framer: Box<dyn Framer>,
    mut rx: mpsc::UnboundedReceiver<TokenEvent>,
) -> Response<LabBody> {
    let mut tokens = Vec::new();
    while let Some(ev) = rx.recv().await {
        let done = ev.finished;
        core.requests
            .token(request_id, monotonic_ns(), ev.cached_prompt_tokens, done);
        // The framer keeps its counts and timings; the streamed bytes are not sent.
        let _ = framer.on_token(&ev);
        tokens.push(ev);
        if done {
            break;
        }
    }
    if !tokens.last().is_some_and(|t| t.finished) {
        return api_error_response(api, &engine_stopped());
    }
    let Some(body) = framer.whole_body(&tokens) else {
        return api_error_response(
            api,
            &ApiError::new(500, "InternalServerError", "this route only streams"),
        );
    };
    let mut r = json_response(200, body);
    if let Ok(id) = HeaderValue::from_str(framer.response_id()) {
        r.headers_mut().insert("x-request-id", id);
    }
    r
}

/// What the server writes for one request of `api` (its route with the query, its body),
/// piece by piece as the connection gets it: the opening events, then each engine
/// token's bytes with a keep-alive after the first where the API sends them; or the
/// whole body for `"stream": false`. The tokens are the scheduler's words for this prompt,
/// made without an engine or a clock: for tests and for the wire-shape examples.
pub fn render_response(
    api: Api,
    route: &str,
    body: &[u8],
    cfg: &crate::engine::EngineConfig,
) -> Result<Vec<Bytes>, ApiError> {
    let (path, query) = route
        .split_once('?')
        .map_or((route, None), |(p, q)| (p, Some(q)));
    let parsed = Parsed::parse(api, path, query, body, cfg)?;
    let prompt = Prompt::from_text(parsed.prompt_text(), cfg.block_size);
    let seed = seed_of(parsed.prompt_text());
    let mut framer = parsed.framer(StreamContext {
        request_id: 1,
        model: parsed.model(cfg).to_string(),
        created_unix: 1_700_000_000,
        created_unix_ns: 1_700_000_000_000_000_000,
        received_ns: monotonic_ns(),
        prompt_tokens: prompt.tokens,
    });
    let max = parsed.max_tokens();
    let tokens: Vec<TokenEvent> = (0..max)
        .map(|i| TokenEvent {
            index: i,
            text: format!(" {}", crate::words::pseudo_word(seed, i as u64)),
            finished: i + 1 == max,
            cached_prompt_tokens: 0,
        })
        .collect();
    let mut out = Vec::new();
    if !parsed.stream() {
        for t in &tokens {
            let _ = framer.on_token(t);
        }
        out.extend(framer.whole_body(&tokens));
        return Ok(out);
    }
    out.push(Bytes::from(framer.preamble()));
    for t in &tokens {
        out.push(Bytes::from(framer.on_token(t)));
        if t.index == 0 && framer.sends_keepalives() {
            out.push(Bytes::from(framer.keepalive()));
        }
    }
    out.retain(|piece| !piece.is_empty());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_get_query_is_the_completion_request() {
        let body = query_request("prompt=hello+wor%6Cd%21&max_tokens=7&x=1").expect("request");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(v["prompt"], "hello world!");
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["stream"], true);
        assert_eq!(percent_decode("100%"), "100%", "a cut escape stays");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert!(query_request("max_tokens=3").is_err(), "a prompt is needed");
    }
}
