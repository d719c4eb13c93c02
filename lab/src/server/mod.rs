//! The engine's HTTP/1.1 front: OpenAI routes, SSE streaming, a slow gateway-auth route.
mod conn_io;
pub mod openai;

use std::convert::Infallible;
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

use crate::engine::{EngineCore, Prompt, RequestLog, ServedRequest, Submission, TokenEvent};
use crate::words::seed_of;
use collector::clock::monotonic_ns;
use conn_io::ConnIo;
use openai::{ApiError, Endpoint, GenerationRequest, StreamFormatter};

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
    formatter: StreamFormatter,
    done: bool,
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
        Frame::data(self.formatter.on_token(&ev))
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
                match s.tokens.poll_recv(cx) {
                    Poll::Pending => Poll::Pending,
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

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
        let core = core.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let core = core.clone();
                async move { Ok::<_, Infallible>(route(core, req).await) }
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

async fn route(core: EngineCore, req: Request<Incoming>) -> Response<LabBody> {
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/health") => json_response(200, Bytes::new()),
        (&Method::GET, "/v1/models") => {
            json_response(200, openai::models_body(&core.cfg, unix_now()))
        }
        (_, AUTH_PATH) => {
            // The gateway's auth service: its latency is the hop's cost.
            tokio::time::sleep(core.cfg.auth_delay).await;
            let mut r = Response::new(LabBody::Full(None));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        (&Method::POST, "/v1/completions") => generate(core, req, Endpoint::Completions).await,
        (&Method::POST, "/v1/chat/completions") => {
            generate(core, req, Endpoint::ChatCompletions).await
        }
        (_, "/health" | "/v1/models" | "/v1/completions" | "/v1/chat/completions") => {
            error_response(&ApiError::new(
                405,
                "invalid_request_error",
                format!("method {} not allowed on {path}", req.method()),
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

async fn generate(
    core: EngineCore,
    req: Request<Incoming>,
    endpoint: Endpoint,
) -> Response<LabBody> {
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let gen = match openai::parse_request(endpoint, &body, &core.cfg) {
        Ok(g) => g,
        Err(e) => return error_response(&e),
    };
    let prompt = Prompt::from_text(&gen.prompt_text, core.cfg.block_size);
    let prompt_tokens = prompt.tokens;
    let id_num = core.next_request_id();
    let id = match endpoint {
        Endpoint::Completions => format!("cmpl-lab-{id_num}"),
        Endpoint::ChatCompletions => format!("chatcmpl-lab-{id_num}"),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let submitted = core.submit(Submission {
        id: id_num,
        prompt,
        max_tokens: gen.max_tokens,
        seed: seed_of(&gen.prompt_text),
        sink: tx,
    });
    if !submitted {
        return error_response(&engine_stopped());
    }
    core.requests.received(ServedRequest {
        request_id: id_num,
        response_id: id.clone(),
        stream: gen.stream,
        prompt_tokens: prompt_tokens as u32,
        cached_prompt_tokens: 0,
        received_ns: monotonic_ns(),
        token_ns: Vec::new(),
        finished: false,
    });
    let created = unix_now();
    if gen.stream {
        let mut sse = SseStream {
            request_id: id_num,
            log: core.requests.clone(),
            tokens: rx,
            first: None,
            formatter: StreamFormatter::new(&gen, id, created, prompt_tokens),
            done: false,
        };
        if core.cfg.split_chunk_writes {
            // The head then leaves with the first token, in one write.
            match sse.tokens.recv().await {
                Some(ev) => sse.first = Some(ev),
                None => return error_response(&engine_stopped()),
            }
        }
        stream_response(&core, sse)
    } else {
        full_response(&core, &gen, id_num, id, created, prompt_tokens, rx).await
    }
}

fn stream_response(core: &EngineCore, sse: SseStream) -> Response<LabBody> {
    let mut r = Response::new(LabBody::Sse(sse));
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if core.cfg.x_accel_buffering_no {
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    }
    r
}

async fn full_response(
    core: &EngineCore,
    gen: &GenerationRequest,
    request_id: u64,
    id: String,
    created: u64,
    prompt_tokens: usize,
    mut rx: mpsc::UnboundedReceiver<TokenEvent>,
) -> Response<LabBody> {
    let mut tokens = Vec::new();
    while let Some(ev) = rx.recv().await {
        let done = ev.finished;
        core.requests
            .token(request_id, monotonic_ns(), ev.cached_prompt_tokens, done);
        tokens.push(ev);
        if done {
            break;
        }
    }
    if !tokens.last().is_some_and(|t| t.finished) {
        return error_response(&engine_stopped());
    }
    json_response(
        200,
        openai::full_response(gen, &id, created, prompt_tokens, &tokens),
    )
}
