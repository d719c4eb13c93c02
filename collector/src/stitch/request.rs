//! A request chain -> the per-request timeline: stages, and the tokens as
//! they crossed every observation point (engine write, proxy read, proxy
//! write, client read).

use serde::Serialize;

use super::spans::ChainSpans;
use crate::ingest::hosts::split_pid;

mod build;

pub use build::build;
#[cfg(test)]
pub(super) use build::max_per_io;

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
    /// The response head's I/O here (its status line), when seen: what a token written
    /// apart from it may wait behind (Nagle, rule 7).
    #[serde(skip)]
    pub head_ns: Option<u64>,
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

/// A hop between two adjacent observation points of a request. Each token's delay over
/// it is its time at `to` less its time at `from` (`delays`): derived from the points'
/// token times, not kept twice.
#[derive(Clone, Debug, Serialize)]
pub struct Forward {
    pub from: PointKind,
    pub to: PointKind,
    /// The two points are on different hosts of a joined timeline (`report A B`): the
    /// hop is the network between them, both hosts' kernels included.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub between_hosts: bool,
    /// The request's `points[to_point]` is the `to` end; `points[to_point + 1]` the
    /// `from` end (points go client side first).
    #[serde(skip)]
    pub to_point: usize,
}

impl Forward {
    /// The hop from `points[to_point + 1]` to `points[to_point]`.
    pub fn between(points: &[Point], to_point: usize) -> Forward {
        let (to, from) = (&points[to_point], &points[to_point + 1]);
        Forward {
            from: from.kind,
            to: to.kind,
            between_hosts: split_pid(to.pid).0 != split_pid(from.pid).0,
            to_point,
        }
    }

    /// Each token's delay over the hop, in token order, for the tokens both ends saw;
    /// `points` are the request's.
    pub fn delays<'a>(&self, points: &'a [Point]) -> impl Iterator<Item = u64> + Clone + 'a {
        let times = |i: usize| points.get(i).map_or(&[][..], |p| &p.token_ns[..]);
        times(self.to_point)
            .iter()
            .zip(times(self.to_point + 1))
            .map(|(to, from)| to.saturating_sub(*from))
    }

    /// `delays`, collected.
    pub fn delay_ns(&self, points: &[Point]) -> Vec<u64> {
        self.delays(points).collect()
    }

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

/// Serialized with each hop's per-token delays (see `impl Serialize for Request`).
#[derive(Clone, Debug, Serialize)]
#[serde(remote = "Self")]
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
    /// Engine side first. Serialized last, each hop with its `delay_ns`.
    #[serde(skip)]
    pub forward: Vec<Forward>,
}

/// A request as JSON: its fields, then its hops, each with the delay of every token
/// over it (`delay_ns`), computed from the points as it is written.
impl Serialize for Request {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Fields<'a>(#[serde(with = "Request")] &'a Request);
        #[derive(Serialize)]
        struct Hop<'a> {
            #[serde(flatten)]
            hop: &'a Forward,
            delay_ns: Vec<u64>,
        }
        #[derive(Serialize)]
        struct WithHops<'a> {
            #[serde(flatten)]
            fields: Fields<'a>,
            forward: Vec<Hop<'a>>,
        }
        WithHops {
            fields: Fields(self),
            forward: self
                .forward
                .iter()
                .map(|hop| Hop {
                    hop,
                    delay_ns: hop.delay_ns(&self.points),
                })
                .collect(),
        }
        .serialize(s)
    }
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
                head_ns: None,
                done: true,
                compressed: false,
                record_ns: Vec::new(),
                token_choice: Vec::new(),
            }],
            forward: Vec::new(),
        }
    }

    pub fn route(&self) -> String {
        route(self.host.as_deref(), &self.path)
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

/// A request's route from its parts (`Request::route`): the host, when known, then the path.
pub fn route(host: Option<&str>, path: &str) -> String {
    match host {
        Some(h) => format!("{h}{path}"),
        None => path.to_string(),
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
