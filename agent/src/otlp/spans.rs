//! A finished request -> its spans, one trace per request: a root span for the request,
//! a child per stage where it lay on the timeline (as the Perfetto export lays them out:
//! `Request::spans` when the stitcher placed them, else from their lengths), and a child
//! per observation point from the request's start to its last token there. Tokens are
//! summed up as a few events per point (first, last, the three longest gaps), never one
//! event per token: a long stream would otherwise cost kilobytes a request.
//!
//! Only what `Request` holds crosses: ids, times, method, path (no query), host, status,
//! process names. It holds no prompt, completion or header text, and nothing here adds any.

use collector::analyze::summarize;
use collector::stitch::{Point, PointKind, Request};

use super::ids::{random, TraceContext};
use super::proto::{Event, KeyValue, Span, SpanKind, Status, StatusCode};

/// Inter-token gaps reported per point, the longest first.
const GAP_EVENTS: usize = 3;

/// Span flags bits 8-9: whether the parent is remote is known (8), and it is (9).
const FLAG_HAS_IS_REMOTE: u32 = 0x100;
const FLAG_IS_REMOTE: u32 = 0x200;

/// CLOCK_MONOTONIC (the recording's clock) -> Unix time, by the offset between the two
/// clocks read once at start: spans of one run then keep their exact spacing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    realtime_minus_monotonic_ns: i128,
}

impl Clock {
    pub(crate) fn now() -> Clock {
        let (mono, real) = (
            collector::clock::monotonic_ns(),
            collector::clock::realtime_ns(),
        );
        Clock {
            realtime_minus_monotonic_ns: i128::from(real) - i128::from(mono),
        }
    }

    #[cfg(test)]
    pub(crate) fn with_offset(ns: i128) -> Clock {
        Clock {
            realtime_minus_monotonic_ns: ns,
        }
    }

    pub(crate) fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        let t = i128::from(monotonic_ns) + self.realtime_minus_monotonic_ns;
        u64::try_from(t.max(0)).unwrap_or(u64::MAX)
    }
}

/// `r`'s spans, its root first, in trace `trace_id` when given (else the trace its
/// `traceparent` names, else a new one).
pub(crate) fn request_spans(r: &Request, clock: Clock, trace_id: Option<[u8; 16]>) -> Vec<Span> {
    let tp = r.trace_parent.as_deref();
    let ctx = match trace_id {
        Some(id) => TraceContext::given(id, tp),
        None => TraceContext::of(tp),
    };
    let mut b = Spans {
        ctx,
        clock,
        root_id: random(),
        spans: Vec::new(),
    };
    let stages = stages(r);
    let start = stages.iter().map(|s| s.start).fold(r.start_ns, u64::min);
    let end = stages
        .iter()
        .map(|s| s.end)
        .fold(r.last_seen_ns(), u64::max);
    b.spans.push(b.root(r, start, end));
    let mut engine_wait = None;
    for s in stages {
        let parent = match s.under {
            Under::Root => b.root_id,
            Under::EngineWait => engine_wait.unwrap_or(b.root_id),
        };
        let span = b.child(parent, s.name, s.start, s.end, s.attributes);
        if s.name == "engine wait" {
            engine_wait = span.span_id.as_slice().try_into().ok();
        }
        b.spans.push(span);
    }
    for p in &r.points {
        let span = b.point(r, p);
        b.spans.push(span);
    }
    b.spans
}

struct Spans {
    ctx: TraceContext,
    clock: Clock,
    root_id: [u8; 8],
    spans: Vec<Span>,
}

impl Spans {
    fn span(&self, id: [u8; 8], name: String, start: u64, end: u64) -> Span {
        Span {
            trace_id: self.ctx.trace_id.to_vec(),
            span_id: id.to_vec(),
            trace_state: String::new(),
            parent_span_id: Vec::new(),
            name,
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: self.clock.unix_ns(start),
            end_time_unix_nano: self.clock.unix_ns(end.max(start)),
            attributes: Vec::new(),
            events: Vec::new(),
            status: None,
            flags: u32::from(self.ctx.flags) | FLAG_HAS_IS_REMOTE,
        }
    }

    fn child(
        &self,
        parent: [u8; 8],
        name: &str,
        start: u64,
        end: u64,
        attributes: Vec<KeyValue>,
    ) -> Span {
        let mut s = self.span(random(), name.to_string(), start, end);
        s.parent_span_id = parent.to_vec();
        s.attributes = attributes;
        s.attributes.push(KeyValue::str("tokenscope.stage", name));
        s
    }

    fn root(&self, r: &Request, start: u64, end: u64) -> Span {
        let name = match (r.method.is_empty(), r.path.is_empty()) {
            (false, false) => format!("{} {}", r.method, r.path),
            (false, true) => r.method.clone(),
            // An HTTP/2 stream already open when the recording began: its head is unknown.
            (true, _) => "HTTP".to_string(),
        };
        let mut s = self.span(self.root_id, name, start, end);
        s.kind = SpanKind::Server as i32;
        if let Some(parent) = self.ctx.parent {
            s.parent_span_id = parent.to_vec();
            s.flags |= FLAG_IS_REMOTE;
        }
        s.attributes = root_attributes(r);
        let failed = match r.status {
            Some(code) if code >= 500 => Some(format!("HTTP {code}")),
            _ if r.truncated => Some("the response ended before its end of stream".to_string()),
            _ => None,
        };
        s.status = failed.map(|message| Status {
            message,
            code: StatusCode::Error as i32,
        });
        s
    }

    /// From the request's start to the point's last token (or TLS record).
    fn point(&self, r: &Request, p: &Point) -> Span {
        let last = p
            .token_ns
            .last()
            .or(p.record_ns.last())
            .copied()
            .or(p.ttft_ns.map(|t| r.start_ns + t))
            .unwrap_or(r.start_ns);
        let mut s = self.span(random(), p.kind.label().to_string(), r.start_ns, last);
        s.parent_span_id = self.root_id.to_vec();
        s.attributes = point_attributes(r, p);
        s.events = token_events(p, self.clock);
        s
    }
}

/// Where a stage span hangs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Under {
    Root,
    EngineWait,
}

struct Stage {
    name: &'static str,
    start: u64,
    end: u64,
    under: Under,
    attributes: Vec<KeyValue>,
}

fn stage(name: &'static str, start: u64, end: u64) -> Stage {
    Stage {
        name,
        start,
        end: end.max(start),
        under: Under::Root,
        attributes: Vec::new(),
    }
}

/// The stages that apply, in time order, as the Perfetto export places them: where the
/// stitcher placed them on the hops (`Request::spans`), else from their lengths (connect
/// from the request's start, upload from its first byte); the engine's wait from the
/// request's arrival there to its first token, split into queue and prefill when GPU
/// steps were joined; decode from the engine's first token to its last.
fn stages(r: &Request) -> Vec<Stage> {
    let st = &r.stages;
    let placed = r.spans.as_ref();
    let mut out = Vec::new();
    let connect = placed.and_then(|s| s.connect);
    let connect = connect.or(st.connect_ns.map(|c| (r.start_ns, r.start_ns + c)));
    if let Some((a, b)) = connect {
        out.push(stage("connect", a, b));
    }
    if let Some((a, b)) = placed.and_then(|s| s.tls) {
        out.push(stage("tls", a, b));
    }
    let upload = placed.and_then(|s| s.upload);
    let upload = upload.or(st.upload_ns.map(|u| (r.first_byte_ns, r.first_byte_ns + u)));
    if let Some((a, b)) = upload {
        out.push(stage("upload", a, b));
    }
    if let Some((a, b)) = placed.and_then(|s| s.gateway) {
        out.push(stage("gateway", a, b));
    }
    for (_, a, b) in placed.map(|s| s.subrequests.as_slice()).unwrap_or_default() {
        // The sub-request's path stays out of the name (span names are low-cardinality).
        out.push(stage("subrequest", *a, *b));
    }
    let engine = r.point(PointKind::EngineWrite);
    let first = engine.and_then(|p| p.token_ns.first().copied());
    if let (Some(received), Some(first)) = (r.engine_received_ns, first) {
        out.push(stage("engine wait", received, first));
        if let Some((g, q)) = r.gpu.as_ref().and_then(|g| Some((g, g.queue_ns?))) {
            let queued = (received + q).min(first);
            let mut queue = stage("queue", received, queued);
            queue.under = Under::EngineWait;
            out.push(queue);
            let mut prefill = stage("prefill", queued, first);
            prefill.under = Under::EngineWait;
            prefill.attributes = vec![
                KeyValue::int("tokenscope.gpu.prefill_steps", i64::from(g.prefill_steps)),
                KeyValue::double("tokenscope.gpu.prefill_s", secs(g.prefill_ns)),
            ];
            out.push(prefill);
        }
    }
    if let Some(p) = engine.filter(|p| p.token_ns.len() > 1) {
        let (a, b) = (p.token_ns[0], p.token_ns[p.token_ns.len() - 1]);
        let mut decode = stage("decode", a, b);
        decode
            .attributes
            .push(KeyValue::int("tokenscope.tokens", p.token_ns.len() as i64));
        if let Some(g) = &r.gpu {
            decode.attributes.extend([
                KeyValue::int("tokenscope.gpu.decode_steps", i64::from(g.decode_steps)),
                KeyValue::int("tokenscope.gpu.stalled_gaps", g.stalled_by.len() as i64),
            ]);
        }
        out.push(decode);
    }
    out
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The GenAI semantic conventions' operation: `chat` for chat APIs, `text_completion`
/// for completions, `generate_content` for Gemini, else tokenscope's API label.
fn operation(r: &Request) -> Option<&'static str> {
    let by_path = || {
        if r.path.contains("chat") {
            Some("chat")
        } else if r.path.ends_with("/completions") || r.path.contains("generate") {
            Some("text_completion")
        } else {
            None
        }
    };
    match r.api {
        Some("openai-chat" | "anthropic") => Some("chat"),
        Some("openai-completions" | "tgi") => Some("text_completion"),
        Some("gemini") => Some("generate_content"),
        Some(api @ ("openai" | "ollama")) => by_path().or(Some(api)),
        Some(api) => Some(api),
        None => by_path(),
    }
}

/// `HOST:PORT` (or `[v6]:PORT`) -> (host, port); a bare host has no port.
fn host_port(host: &str) -> (&str, Option<u16>) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((h, tail)) => (h, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h, Some(port)),
            Err(_) => (host, None),
        },
        _ => (host, None),
    }
}

/// The client-most point that saw the response's first token.
fn client_most(r: &Request) -> Option<&Point> {
    r.points.iter().find(|p| p.ttft_ns.is_some())
}

fn root_attributes(r: &Request) -> Vec<KeyValue> {
    let mut a = Vec::new();
    if !r.method.is_empty() {
        a.push(KeyValue::str("http.request.method", r.method.as_str()));
    }
    if !r.path.is_empty() {
        a.push(KeyValue::str("url.path", r.path.as_str()));
    }
    if let Some(h) = &r.host {
        let (host, port) = host_port(h);
        a.push(KeyValue::str("server.address", host));
        if let Some(p) = port {
            a.push(KeyValue::int("server.port", i64::from(p)));
        }
    }
    if let Some(s) = r.status {
        a.push(KeyValue::int("http.response.status_code", i64::from(s)));
    }
    let (client, client_port) = host_port(&r.client_addr);
    a.push(KeyValue::str("client.address", client));
    if let Some(p) = client_port {
        a.push(KeyValue::int("client.port", i64::from(p)));
    }
    if let Some(op) = operation(r) {
        a.push(KeyValue::str("gen_ai.operation.name", op));
    }
    if let Some(p) = client_most(r) {
        let ttft = secs(p.ttft_ns.unwrap_or(0));
        a.push(KeyValue::double(
            "gen_ai.response.time_to_first_chunk",
            ttft,
        ));
        a.push(KeyValue::double("tokenscope.ttft_s", ttft));
        a.push(KeyValue::str("tokenscope.ttft_point", p.kind.label()));
    }
    if let Some(api) = r.api {
        a.push(KeyValue::str("tokenscope.api", api));
    }
    a.push(KeyValue::int("tokenscope.tokens", r.tokens() as i64));
    if let Some(p) = r.first_point() {
        push_itl(&mut a, p);
    }
    if let Some(t) = r.tpot_ns() {
        a.push(KeyValue::double("tokenscope.tpot_s", secs(t)));
    }
    if let Some(g) = r.stages.gateway_ttft_ns {
        // The TTFT the hops added: a difference of two TTFTs, with no one place on the
        // timeline, so an attribute rather than a span.
        a.push(KeyValue::double("tokenscope.gateway_ttft_s", secs(g)));
    }
    if r.reasoning_tokens > 0 {
        a.push(KeyValue::int(
            "tokenscope.reasoning_tokens",
            i64::from(r.reasoning_tokens),
        ));
    }
    if r.tool_tokens > 0 {
        a.push(KeyValue::int(
            "tokenscope.tool_tokens",
            i64::from(r.tool_tokens),
        ));
    }
    if let Some(j) = r.join {
        a.push(KeyValue::str("tokenscope.join", j));
    }
    a.extend([
        KeyValue::str("tokenscope.client_comm", r.client_comm.as_str()),
        KeyValue::int("tokenscope.client_pid", i64::from(r.client_pid)),
        KeyValue::bool("tokenscope.new_connection", r.new_connection),
        KeyValue::bool("tokenscope.tls", r.tls),
        KeyValue::bool("tokenscope.http2", r.http2),
        KeyValue::bool("tokenscope.coalesced", r.coalesced),
        KeyValue::bool("tokenscope.truncated", r.truncated),
        KeyValue::bool("tokenscope.events_dropped", r.events_dropped),
        KeyValue::int("tokenscope.start_monotonic_ns", r.start_ns as i64),
    ]);
    a
}

fn push_itl(a: &mut Vec<KeyValue>, p: &Point) {
    if let Some(s) = summarize(&p.itl_ns()) {
        a.push(KeyValue::double("tokenscope.itl_p50_s", secs(s.p50_ns)));
        a.push(KeyValue::double("tokenscope.itl_p99_s", secs(s.p99_ns)));
        a.push(KeyValue::double("tokenscope.itl_max_s", secs(s.max_ns)));
    }
}

fn point_attributes(r: &Request, p: &Point) -> Vec<KeyValue> {
    let mut a = vec![
        KeyValue::str("tokenscope.point", p.kind.label()),
        KeyValue::str("tokenscope.comm", p.comm.as_str()),
        KeyValue::int("tokenscope.pid", i64::from(p.pid)),
        KeyValue::int("tokenscope.tokens", p.token_ns.len() as i64),
        KeyValue::int("tokenscope.ios", i64::from(p.ios)),
        KeyValue::int(
            "tokenscope.max_tokens_per_io",
            i64::from(p.max_tokens_per_io),
        ),
        KeyValue::bool("tokenscope.done", p.done),
    ];
    if let Some(t) = p.ttft_ns {
        a.push(KeyValue::double("tokenscope.ttft_s", secs(t)));
    }
    push_itl(&mut a, p);
    if !p.record_ns.is_empty() {
        a.push(KeyValue::int(
            "tokenscope.tls_records",
            p.record_ns.len() as i64,
        ));
    }
    if p.compressed {
        a.push(KeyValue::bool("tokenscope.compressed", true));
    }
    // How long tokens took to reach this point from the one nearer the engine.
    let hop = r.forward.iter().find(|f| f.to == p.kind);
    if let Some(s) = hop.and_then(|f| summarize(&f.delay_ns(&r.points))) {
        a.push(KeyValue::double("tokenscope.forward_p50_s", secs(s.p50_ns)));
        a.push(KeyValue::double("tokenscope.forward_p99_s", secs(s.p99_ns)));
    }
    a
}

/// First and last token, and the longest gaps (each at the token that ended it), in time
/// order.
fn token_events(p: &Point, clock: Clock) -> Vec<Event> {
    let (Some(&first), Some(&last)) = (p.token_ns.first(), p.token_ns.last()) else {
        return Vec::new();
    };
    let event = |ts: u64, name: &str, attributes: Vec<KeyValue>| Event {
        time_unix_nano: clock.unix_ns(ts),
        name: name.to_string(),
        attributes,
    };
    let mut gaps = gaps(p);
    // Longest first; the earlier of equal gaps.
    gaps.sort_by_key(|&(end, gap)| (std::cmp::Reverse(gap), end));
    gaps.truncate(GAP_EVENTS);
    gaps.sort_by_key(|&(end, _)| end);
    let mut events = vec![event(first, "first_token", Vec::new())];
    for (end, gap) in gaps {
        events.push(event(
            end,
            "gap",
            vec![KeyValue::double("tokenscope.gap_s", secs(gap))],
        ));
    }
    events.push(event(
        last,
        "last_token",
        vec![KeyValue::int("tokenscope.tokens", p.token_ns.len() as i64)],
    ));
    events
}

/// Each inter-token gap as (the token that ended it, its length): `Point::itl_ns` has a
/// gap for every token but the first of its choice, in token order.
fn gaps(p: &Point) -> Vec<(u64, u64)> {
    let mut seen: Vec<u32> = Vec::new();
    let ends = p.token_ns.iter().enumerate().filter_map(|(i, &t)| {
        let choice = p.token_choice.get(i).copied().unwrap_or(0);
        if seen.contains(&choice) {
            Some(t)
        } else {
            seen.push(choice);
            None
        }
    });
    ends.zip(p.itl_ns()).collect()
}

#[cfg(test)]
#[path = "spans_tests.rs"]
mod tests;
