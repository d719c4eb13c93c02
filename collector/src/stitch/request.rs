//! A request chain -> the per-request timeline: stages, and the tokens as
//! they crossed every observation point (engine write, proxy read, proxy
//! write, client read).

use serde::Serialize;

use super::chain::End;
use super::conn::{Connection, Conns, Exchange, Role};
use super::spans::ChainSpans;
use crate::ingest::hosts::split_pid;
use crate::ingest::model::TokenKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PointKind {
    /// The engine wrote the response (its server end).
    EngineWrite,
    /// A proxy read it from upstream (its client end).
    ProxyRead,
    /// A proxy wrote it to its client (its server end).
    ProxyWrite,
    /// The client read it.
    ClientRead,
}

impl PointKind {
    pub fn label(self) -> &'static str {
        match self {
            PointKind::EngineWrite => "engine write",
            PointKind::ProxyRead => "proxy read",
            PointKind::ProxyWrite => "proxy write",
            PointKind::ClientRead => "client read",
        }
    }
}

/// The response as it crossed one observation point.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub kind: PointKind,
    /// Its process (as its own host numbers it in JSON; see `host`).
    #[serde(serialize_with = "crate::ingest::hosts::serialize_pid")]
    pub pid: u32,
    /// The recording it was seen in, when several are joined (`report A B`): 0 is the
    /// first.
    #[serde(skip_serializing_if = "is_zero")]
    pub host: u32,
    pub comm: String,
    /// First token - request start.
    pub ttft_ns: Option<u64>,
    /// Arrival of each token event (CLOCK_MONOTONIC ns).
    pub token_ns: Vec<u64>,
    /// Socket I/Os that carried the response.
    pub ios: u32,
    /// Most token events carried by one I/O (more than 1 = coalescing).
    pub max_tokens_per_io: u32,
    /// `data: [DONE]` was seen here.
    pub done: bool,
    pub compressed: bool,
    /// Encrypted here: response TLS application-data records (arrival ns), in place of tokens.
    pub record_ns: Vec<u64>,
    /// The choice of each token, when there is more than one (OpenAI `n > 1`: each
    /// choice is a token stream of its own for ITL; empty: all are choice 0).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub token_choice: Vec<u32>,
}

impl Point {
    /// Inter-token gaps, in token order: between consecutive tokens of the same choice
    /// (never from one choice's token to another's).
    pub fn itl_ns(&self) -> Vec<u64> {
        let mut gaps = Vec::with_capacity(self.token_ns.len());
        self.itl_into(&mut gaps);
        gaps
    }

    /// `itl_ns` appended to `gaps` (pooling many points' gaps without a vector each).
    pub fn itl_into(&self, gaps: &mut impl Extend<u64>) {
        if self.token_choice.is_empty() {
            return gaps.extend(self.token_ns.windows(2).map(|w| w[1] - w[0]));
        }
        let mut last: Vec<(u32, u64)> = Vec::new();
        for (&t, &c) in self.token_ns.iter().zip(&self.token_choice) {
            match last.iter_mut().find(|(choice, _)| *choice == c) {
                Some((_, prev)) => {
                    gaps.extend(Some(t.saturating_sub(*prev)));
                    *prev = t;
                }
                None => last.push((c, t)),
            }
        }
    }

    /// The tokens of the first token's choice (all of them with one choice).
    pub fn first_choice_ns(&self) -> Vec<u64> {
        match self.token_choice.first() {
            None => self.token_ns.clone(),
            Some(&c) => self
                .token_ns
                .iter()
                .zip(&self.token_choice)
                .filter(|(_, &k)| k == c)
                .map(|(&t, _)| t)
                .collect(),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Stages {
    /// TCP handshake (client connect -> established), when this request opened the connection.
    pub connect_ns: Option<u64>,
    /// TLS handshake (ClientHello -> the client's first encrypted record).
    pub tls_ns: Option<u64>,
    /// First -> last request byte sent by the client.
    pub upload_ns: Option<u64>,
    /// The proxy read the request's first byte -> started sending it upstream
    /// (reading the body and any sub-request such as auth_request included).
    pub gateway_ns: Option<u64>,
    /// Sub-requests the proxy made meanwhile (e.g. auth_request), total time.
    pub subrequest_ns: Option<u64>,
    /// The engine read the whole request -> wrote the first token (queue + prefill).
    pub upstream_wait_ns: Option<u64>,
    /// Through a proxy or gateway: the TTFT the hops between the client and the engine
    /// added, the client-most point's TTFT less the engine's own (its first request
    /// byte -> its first token written).
    pub gateway_ttft_ns: Option<u64>,
}

/// Delay of each token between two adjacent observation points.
#[derive(Clone, Debug, Serialize)]
pub struct Forward {
    pub from: PointKind,
    pub to: PointKind,
    /// The two points are on different hosts of a joined timeline (`report A B`): the
    /// hop is the network between them, both hosts' kernels included.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub between_hosts: bool,
    pub delay_ns: Vec<u64>,
}

impl Forward {
    /// `engine write -> proxy read`, or across hosts the network it crossed, client
    /// side first: `gateway -> engine network`.
    pub fn label(&self) -> String {
        fn role(k: PointKind) -> &'static str {
            match k {
                PointKind::EngineWrite => "engine",
                PointKind::ProxyRead | PointKind::ProxyWrite => "gateway",
                PointKind::ClientRead => "client",
            }
        }
        if self.between_hosts {
            format!("{} -> {} network", role(self.to), role(self.from))
        } else {
            format!("{} -> {}", self.from.label(), self.to.label())
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Request {
    pub id: usize,
    pub method: String,
    pub path: String,
    pub host: Option<String>,
    /// The W3C `traceparent` the request carried (the client-most hop that had one):
    /// the agent's spans join that trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<String>,
    pub status: Option<u32>,
    /// The streaming API its events had (`openai-chat`, `anthropic`, ... see
    /// `ingest::model::Api`); `unknown-sse` when none matched (every data event is then
    /// a token); `json` for a plain JSON answer (TTFT to its first body byte, no ITL).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<&'static str>,
    /// Tokens of reasoning and of tool-call arguments among its tokens (first point).
    #[serde(skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u32,
    #[serde(skip_serializing_if = "is_zero")]
    pub tool_tokens: u32,
    #[serde(serialize_with = "crate::ingest::hosts::serialize_pid")]
    pub client_pid: u32,
    pub client_comm: String,
    pub client_addr: String,
    /// connect() when this request opened its connection, else its first request byte.
    pub start_ns: u64,
    pub first_byte_ns: u64,
    pub end_ns: Option<u64>,
    pub new_connection: bool,
    /// Requests its (client-side) connection had carried when this one was finalised,
    /// this one included (all of them when replayed in one batch); 1 = not reused.
    pub connection_requests: usize,
    pub tls: bool,
    /// Seen only as TLS records (no plaintext): timed by record, without tokens.
    pub encrypted: bool,
    /// The client-side hop is HTTP/2 (one stream of a multiplexed connection).
    pub http2: bool,
    /// An HTTP/2 stream already open when the recording began: its tokens are timed
    /// from there, its request head (method, path) is unknown.
    pub attached_mid: bool,
    /// How a proxy hop of this request was joined, when on weaker evidence than the
    /// request itself: `by-response` (a body-less request whose path the proxy
    /// rewrote, joined by its response's first events and time order), `by-tokens` (a
    /// gateway that rewrote the request and re-serialised its events, joined by the
    /// hashed text of the tokens it forwarded). Absent: by body print, or by method and
    /// path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<&'static str>,
    pub coalesced: bool,
    /// The response ended without [DONE] or its framing's end where it was first seen.
    pub truncated: bool,
    /// The recording dropped events, so this request may be missing some.
    pub events_dropped: bool,
    /// Token events whose fingerprint differs between points at the same position.
    pub chunk_mismatches: u32,
    pub stages: Stages,
    /// When the engine end had the whole request (its arrival at the engine).
    pub engine_received_ns: Option<u64>,
    /// Request body bytes, and the hash of each of its whole first KiB (shared
    /// prefixes show there; see protocol::stream). As the last traced hop read it.
    pub body_bytes: Option<u64>,
    #[serde(skip)]
    pub prefix_prints: Vec<u64>,
    /// The timeline's connections (ids) that carried it, client side first.
    #[serde(skip)]
    pub connections: Vec<usize>,
    /// When its client-side connection closed, if it had by the time the request was
    /// finalised (rule 1 reads a close within a second of the response).
    #[serde(skip)]
    pub connection_close_ns: Option<u64>,
    /// TCP retransmits on the connections that carried it, between its start and end
    /// (rule 8).
    #[serde(skip)]
    pub retransmit_ns: Vec<u64>,
    /// Where its chain starts: (request start, connection id, exchange number), the
    /// order requests are numbered in.
    #[serde(skip)]
    pub order: (u64, usize, usize),
    /// Where its stages lay on the hops that carried it (None: built by hand, or its
    /// chain's first exchange is not where it started).
    #[serde(skip)]
    pub spans: Option<ChainSpans>,
    /// GPU steps this request took part in, when the engine's libcuda was probed.
    pub gpu: Option<super::attribution::GpuShare>,
    /// Client side first, engine last.
    pub points: Vec<Point>,
    pub forward: Vec<Forward>,
}

impl Request {
    /// A request known only by one observation point (views and tests that build
    /// requests by hand): its tokens there, nothing else known; start and end from them.
    pub fn at_point(
        id: usize,
        kind: PointKind,
        pid: u32,
        comm: &str,
        token_ns: Vec<u64>,
    ) -> Request {
        let start = token_ns.first().copied().unwrap_or(0);
        Request {
            id,
            method: "POST".into(),
            path: "/v1/completions".into(),
            host: None,
            trace_parent: None,
            status: None,
            api: None,
            reasoning_tokens: 0,
            tool_tokens: 0,
            client_pid: pid,
            client_comm: comm.into(),
            client_addr: "127.0.0.1:40000".into(),
            start_ns: start,
            first_byte_ns: start,
            end_ns: token_ns.last().copied(),
            new_connection: false,
            connection_requests: 1,
            body_bytes: None,
            prefix_prints: Vec::new(),
            connections: Vec::new(),
            connection_close_ns: None,
            retransmit_ns: Vec::new(),
            order: (start, 0, 0),
            spans: None,
            tls: false,
            encrypted: false,
            http2: false,
            attached_mid: false,
            join: None,
            coalesced: false,
            truncated: false,
            events_dropped: false,
            chunk_mismatches: 0,
            stages: Stages::default(),
            engine_received_ns: None,
            gpu: None,
            points: vec![Point {
                kind,
                pid,
                host: split_pid(pid).0,
                comm: comm.into(),
                ttft_ns: None,
                ios: token_ns.len() as u32,
                max_tokens_per_io: u32::from(!token_ns.is_empty()),
                token_ns,
                done: true,
                compressed: false,
                record_ns: Vec::new(),
                token_choice: Vec::new(),
            }],
            forward: Vec::new(),
        }
    }

    pub fn route(&self) -> String {
        match &self.host {
            Some(h) => format!("{h}{}", self.path),
            None => self.path.clone(),
        }
    }

    /// The last moment anything of it was seen: its end, else its last token or TLS
    /// record at any point (where a timeline ends its slice).
    pub fn last_seen_ns(&self) -> u64 {
        let mut end = self.end_ns.unwrap_or(self.start_ns).max(self.start_ns);
        for p in &self.points {
            end = end
                .max(p.token_ns.last().copied().unwrap_or(0))
                .max(p.record_ns.last().copied().unwrap_or(0));
        }
        end
    }

    /// Where the client (or the first traced hop) saw it.
    pub fn first_point(&self) -> Option<&Point> {
        self.points.first()
    }

    pub fn point(&self, kind: PointKind) -> Option<&Point> {
        self.points.iter().find(|p| p.kind == kind)
    }

    /// First token at the first point - first request byte (server-side TTFT).
    pub fn ttft_server_ns(&self) -> Option<u64> {
        Some(
            self.first_point()?
                .token_ns
                .first()?
                .saturating_sub(self.first_byte_ns),
        )
    }

    pub fn tokens(&self) -> usize {
        self.first_point().map_or(0, |p| p.token_ns.len())
    }

    /// (last - first token) / (tokens - 1) at the first point (of one choice).
    pub fn tpot_ns(&self) -> Option<u64> {
        let t = &self.first_point()?.first_choice_ns();
        (t.len() > 1).then(|| (t[t.len() - 1] - t[0]) / (t.len() as u64 - 1))
    }
}

pub fn build(
    id: usize,
    conns: &Conns,
    chain: &[End],
    links: &super::chain::Links,
    dropped: bool,
) -> Request {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let root = chain[0];
    let (rc, rx) = (&conns[&root.0], x(root));
    let Start {
        new_connection,
        connector,
        start_ns,
        first_byte_ns,
    } = start(conns, root, links);
    let last = chain.len() - 1;
    let mut points: Vec<Point> = chain
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let c = &conns[&e.0];
            let kind = match (c.role, i) {
                (Role::Client, 0) if !links.proxies.contains(&c.pid) => PointKind::ClientRead,
                (Role::Client, _) => PointKind::ProxyRead,
                // The last end traced, unless that process is a proxy (a hop it forwarded
                // but that could not be joined upstream, e.g. a stream older than the recording).
                (_, i) if i == last && !links.proxies.contains(&c.pid) => PointKind::EngineWrite,
                _ => PointKind::ProxyWrite,
            };
            point(kind, c, x(e), start_ns)
        })
        .collect();
    if let Some(client) = connector.and_then(|c| mapped_client_point(rc, c, rx, start_ns)) {
        points.insert(0, client);
    }

    let spans = super::spans::chain_spans(new_connection, conns, chain, links);
    let mut stages = stages(&spans, conns, chain, new_connection, connector);
    let engine = x(chain[last]);
    if spans.gateway.is_some() {
        let client = points
            .iter()
            .find(|p| p.kind != PointKind::EngineWrite && !p.token_ns.is_empty());
        let engine_point = points.iter().rfind(|p| p.kind == PointKind::EngineWrite);
        if let (Some(c), Some(e)) = (client.and_then(|c| c.ttft_ns), engine_point) {
            let engine_ttft = e
                .token_ns
                .first()
                .map(|t| t.saturating_sub(engine.request_start_ns));
            stages.gateway_ttft_ns = engine_ttft.map(|t| c.saturating_sub(t));
        }
    }

    let forward = forwards(&points);
    let chunk_mismatches = chunk_mismatches(conns, chain);

    let end_ns = rx.response_end_ns.or(rx.sse.last().map(|e| e.ts_ns));
    // The head as the first end that saw it: a client whose request bytes went untied
    // (a TLS session older than the recording) still has it decoded at the proxy.
    let head = chain
        .iter()
        .map(|&e| x(e))
        .find(|x| !x.method.is_empty())
        .unwrap_or(rx);
    Request {
        id,
        method: head.method.clone(),
        // Without plaintext there is no path; the route is the server it went to.
        path: if rx.encrypted {
            "(encrypted)".into()
        } else {
            head.path.clone()
        },
        host: if rx.encrypted {
            Some(
                if rc.role == Role::Server {
                    rc.local
                } else {
                    rc.remote
                }
                .to_string(),
            )
        } else {
            head.host.clone()
        },
        trace_parent: chain.iter().find_map(|&e| x(e).trace_parent.clone()),
        encrypted: rx.encrypted,
        http2: rx.stream_id.is_some(),
        attached_mid: head.attached_mid,
        join: if chain.iter().any(|e| links.by_tokens.contains(e)) {
            Some("by-tokens")
        } else {
            chain
                .iter()
                .any(|e| links.by_response.contains(e))
                .then_some("by-response")
        },
        status: rx
            .status
            .or_else(|| chain.iter().find_map(|&e| x(e).status)),
        api: api(chain.iter().map(|&e| x(e))),
        reasoning_tokens: rx
            .tokens()
            .filter(|t| t.token == TokenKind::Reasoning)
            .count() as u32,
        tool_tokens: rx.tokens().filter(|t| t.token == TokenKind::Tool).count() as u32,
        client_pid: rc.pid,
        client_comm: rc.comm.clone(),
        client_addr: if rc.role == Role::Client {
            rc.local.to_string()
        } else {
            rc.remote.to_string()
        },
        start_ns,
        first_byte_ns,
        end_ns,
        new_connection,
        connection_requests: rc.exchange_count(),
        connections: chain.iter().map(|e| e.0).collect(),
        connection_close_ns: rc.close_ns,
        order: (rx.request_start_ns, root.0, root.1),
        spans: (rx.request_start_ns == first_byte_ns).then_some(spans),
        retransmit_ns: chain
            .iter()
            .flat_map(|e| conns[&e.0].retransmits.iter().copied())
            .filter(|&t| start_ns <= t && end_ns.is_none_or(|end| t <= end))
            .collect(),
        body_bytes: engine.body_print.or(rx.body_print).map(|p| p.1),
        prefix_prints: if engine.prefix_prints.is_empty() {
            rx.prefix_prints.clone()
        } else {
            engine.prefix_prints.clone()
        },
        tls: rc.tls.is_some(),
        coalesced: points.iter().any(|p| p.max_tokens_per_io > 1),
        truncated: !rx.encrypted && !rx.done() && rx.response_end_ns.is_none(),
        events_dropped: dropped,
        chunk_mismatches,
        stages,
        engine_received_ns: (conns[&chain[last].0].role == Role::Server)
            .then(|| engine.request_end_ns.unwrap_or(engine.request_start_ns)),
        gpu: None,
        points,
        forward,
    }
}

/// When a request started: its connect() when it opened its connection, else its first
/// request byte (at the client's socket when only the server end had plaintext).
struct Start<'a> {
    new_connection: bool,
    /// A server end's client traced only as TLS records: its socket still tells when it
    /// connected and sent.
    connector: Option<&'a Connection>,
    start_ns: u64,
    first_byte_ns: u64,
}

fn start<'a>(conns: &'a Conns, root: End, links: &super::chain::Links) -> Start<'a> {
    let (rc, rx) = (&conns[&root.0], conns[&root.0].exchange(root.1));
    let new_connection = root.1 == 0
        && (rc.connect_ns.is_some() || rc.accept_ns.is_some() || rc.established_ns.is_some());
    // A server end whose client was traced only as TLS records (no plaintext there):
    // the client's own socket still tells when it connected.
    let connector = links
        .peer
        .get(&root.0)
        .and_then(|p| conns.get(p))
        .filter(|p| rc.role == Role::Server && p.role == Role::Client && p.connect_ns.is_some());
    let start_ns = match (new_connection, rc.role) {
        (true, Role::Client) => rc.connect_ns.unwrap_or(rx.request_start_ns),
        (true, _) if connector.is_some() => connector
            .and_then(|c| c.connect_ns)
            .unwrap_or(rx.request_start_ns)
            .min(rx.request_start_ns),
        (true, _) => rc
            .established_ns
            .or(rc.accept_ns)
            .unwrap_or(rx.request_start_ns)
            .min(rx.request_start_ns),
        (false, _) => rx.request_start_ns,
    };
    // That client's socket also tells, through the connection's byte stream, when it
    // sent this request and when it read each token (see stitch::wire).
    let client_sent = connector.and_then(|c| super::wire::peer_send_ns(rc, c, rx.request_start_ns));
    let first_byte_ns = client_sent.map_or(rx.request_start_ns, |t| t.min(rx.request_start_ns));
    let start_ns = if new_connection {
        start_ns
    } else {
        first_byte_ns
    };
    Start {
        new_connection,
        connector,
        start_ns,
        first_byte_ns,
    }
}

/// Where a request's time went before its first token: the lengths of its chain's
/// spans (handshakes, upload, the proxy's hold and its sub-requests), and the engine's
/// wait.
fn stages(
    spans: &ChainSpans,
    conns: &Conns,
    chain: &[End],
    new_connection: bool,
    connector: Option<&Connection>,
) -> Stages {
    let len = |s: Option<(u64, u64)>| s.map(|(a, b)| b.saturating_sub(a));
    // The client's own socket, when only it saw the handshake.
    let connect = match connector {
        Some(c) if new_connection => c.handshake(),
        _ => spans.connect,
    };
    let last = chain[chain.len() - 1];
    let engine = conns[&last.0].exchange(last.1);
    Stages {
        connect_ns: len(connect),
        tls_ns: len(spans.tls),
        upload_ns: len(spans.upload),
        gateway_ns: len(spans.gateway),
        subrequest_ns: (!spans.subrequests.is_empty()).then(|| {
            spans
                .subrequests
                .iter()
                .map(|(_, a, b)| b.saturating_sub(*a))
                .sum()
        }),
        upstream_wait_ns: (conns[&last.0].role == Role::Server)
            .then(|| {
                let received = engine.request_end_ns.unwrap_or(engine.request_start_ns);
                let first = engine.tokens().next()?;
                Some(first.ts_ns.saturating_sub(received))
            })
            .flatten(),
        gateway_ttft_ns: None,
    }
}

/// The API of the first exchange of the chain whose events tell it; `json` for a plain
/// JSON answer.
fn api<'a>(mut exchanges: impl Iterator<Item = &'a Exchange> + Clone) -> Option<&'static str> {
    if let Some(api) = exchanges.clone().find_map(Exchange::api) {
        return Some(api.label());
    }
    exchanges.any(|x| x.json).then_some("json")
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Per hop, how long each token took from the end nearer the engine to the one before.
fn forwards(points: &[Point]) -> Vec<Forward> {
    points
        .windows(2)
        .rev()
        .map(|w| Forward {
            from: w[1].kind,
            to: w[0].kind,
            between_hosts: split_pid(w[0].pid).0 != split_pid(w[1].pid).0,
            delay_ns: w[0]
                .token_ns
                .iter()
                .zip(&w[1].token_ns)
                .map(|(d, u)| d.saturating_sub(*u))
                .collect(),
        })
        .collect()
}

/// Tokens whose chunk differs from one hop to the next (a proxy re-chunked the stream).
fn chunk_mismatches(conns: &Conns, chain: &[End]) -> u32 {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let mut chunk_mismatches = 0;
    for w in chain.windows(2) {
        let (a, b) = (x(w[0]), x(w[1]));
        chunk_mismatches += a
            .tokens()
            .zip(b.tokens())
            .filter(|(p, q)| p.fingerprint != q.fingerprint)
            .count() as u32;
    }
    chunk_mismatches
}

/// The client-read point of a client seen only as TLS records: each token the server
/// wrote, at the client's read that took in its bytes. None unless every token maps.
fn mapped_client_point(
    server: &Connection,
    client: &Connection,
    x: &Exchange,
    start_ns: u64,
) -> Option<Point> {
    let mut token_ns = Vec::new();
    let mut per_read: std::collections::HashMap<usize, u32> = std::collections::HashMap::new();
    for t in x.tokens() {
        let (ts, read) = super::wire::peer_read_ns(server, client, t.ts_ns)?;
        token_ns.push(ts);
        *per_read.entry(read).or_default() += 1;
    }
    Some(Point {
        kind: PointKind::ClientRead,
        pid: client.pid,
        host: split_pid(client.pid).0,
        comm: client.comm.clone(),
        ttft_ns: token_ns.first().map(|t| t.saturating_sub(start_ns)),
        token_ns,
        ios: per_read.len() as u32,
        max_tokens_per_io: per_read.values().copied().max().unwrap_or(0),
        done: x.done(),
        compressed: x.compressed,
        record_ns: Vec::new(),
        token_choice: choices(x),
    })
}

/// Each token's choice, when some token is not choice 0.
fn choices(x: &Exchange) -> Vec<u32> {
    if x.tokens().all(|t| t.choice == 0) {
        return Vec::new();
    }
    x.tokens().map(|t| t.choice).collect()
}

fn point(kind: PointKind, c: &Connection, x: &Exchange, start_ns: u64) -> Point {
    // Sized once: collected from the filter it doubled to 128 slots for 65 tokens, and a
    // window of finished requests (top) holds four of these per request.
    let mut token_ns = Vec::with_capacity(x.sse.len());
    token_ns.extend(x.tokens().map(|t| t.ts_ns));
    // A plain JSON answer's first token is its first body byte.
    let first = token_ns
        .first()
        .copied()
        .or_else(|| x.json.then_some(x.response_body_ns).flatten());
    Point {
        kind,
        pid: c.pid,
        host: split_pid(c.pid).0,
        comm: c.comm.clone(),
        ttft_ns: first.map(|t| t.saturating_sub(start_ns)),
        token_ns,
        ios: x.response_ios,
        max_tokens_per_io: max_per_io(|| x.tokens().map(|t| t.io)),
        done: x.done(),
        compressed: x.compressed,
        record_ns: x.records_ns.clone(),
        token_choice: choices(x),
    }
}

/// The most tokens one I/O carried. An exchange numbers its response I/Os as they come,
/// so a token's I/O never goes down and equal ones are neighbours: runs, not a map
/// (built for every point of every request). Sorted first should that ever not hold.
pub(super) fn max_per_io<I: Iterator<Item = u32>>(ios: impl Fn() -> I) -> u32 {
    let longest_run = |ios: &mut dyn Iterator<Item = u32>| -> Option<u32> {
        let (mut prev, mut run, mut max) = (None, 0, 0);
        for io in ios {
            match prev {
                Some(p) if p == io => run += 1,
                Some(p) if p > io => return None,
                _ => run = 1,
            }
            prev = Some(io);
            max = max.max(run);
        }
        Some(max)
    };
    longest_run(&mut ios()).unwrap_or_else(|| {
        let mut sorted: Vec<u32> = ios().collect();
        sorted.sort_unstable();
        longest_run(&mut sorted.into_iter()).expect("sorted")
    })
}
