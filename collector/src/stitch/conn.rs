//! Events -> connections (per socket address, split at close and reuse) ->
//! exchanges (one HTTP request and its response; many per keep-alive connection).

use std::net::SocketAddr;

use crate::ingest::fast_hash::FastMap;
use crate::ingest::model::{
    event::Body, sniff, Api, CompactString, Direction, Event, Sniff, SseKind, TcpState, TokenKind,
};
use crate::protocol::limits::Limit;
use crate::protocol::{http, tls};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// This end connected (or sent the first request).
    Client,
    /// This end accepted (or received the first request).
    Server,
    Unknown,
}

#[derive(Clone, Debug, Default)]
pub struct TlsTimes {
    pub client_hello_ns: Option<u64>,
    /// The client's first encrypted record: the handshake's end (TLS 1.3 hides
    /// its Finished there; TLS 1.2 sends it after change_cipher_spec).
    pub client_first_app_ns: Option<u64>,
    /// Application-data records that crossed this end, with their time and direction.
    pub app_records: Vec<(u64, Direction)>,
}

/// One TCP connection as seen from one end (one socket).
#[derive(Clone, Debug)]
pub struct Connection {
    pub id: usize,
    pub skaddr: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub pid: u32,
    pub comm: String,
    pub role: Role,
    /// CLOSE -> SYN_SENT: connect() started.
    pub connect_ns: Option<u64>,
    pub established_ns: Option<u64>,
    pub accept_ns: Option<u64>,
    pub close_ns: Option<u64>,
    pub first_ns: u64,
    pub last_ns: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub tls: Option<TlsTimes>,
    pub retransmits: Vec<u64>,
    /// Exchanges still held, numbered from `exchange_base` (an incremental stitch
    /// releases finished ones from the front; see `exchange`).
    pub exchanges: Vec<Exchange>,
    pub exchange_base: usize,
    /// Every exchange numbered below this one has its response ended or is retired:
    /// where the search for the exchange a response I/O answers starts (each token's
    /// I/O went through the answered exchanges a keep-alive connection still held).
    responding_from: usize,
    /// I/Os whose bytes could not be read as HTTP or TLS.
    pub unparsed_ios: u64,
    /// Parser bounds its I/Os reached, by `protocol::limits::Limit` (in `Limit::ALL` order).
    pub limits: [u64; Limit::ALL.len()],
    /// TLS plaintext (OpenSSL uprobes) was seen: exchanges come from it, and the
    /// TLS records only time the handshake.
    pub plaintext: bool,
    /// HTTP/2: exchanges are streams; control frames are counted, never requests.
    pub h2: bool,
    pub h2_control_frames: u64,
    /// Malformed HTTP/2 input (frames skipped) and header fields that referred to
    /// HPACK entries from before the recording (never guessed).
    pub h2_errors: u64,
    pub h2_unknown_headers: u64,
    /// HTTP/2 streams already open when the recording began.
    pub h2_attached_mid: usize,
    /// TLS connections: every socket I/O with its stream offset, so the other end's
    /// plaintext can be mapped onto this end's reads and writes (see stitch::wire).
    pub wire: super::wire::Wire,
    /// SSE events the latest exchange held (room made for the next one's).
    sse_room: usize,
}

/// The most SSE events an exchange makes room for before its first (48 KB).
const SSE_ROOM_MAX: usize = 1024;

/// A token (or other SSE event) as it crossed one end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SseArrival {
    pub ts_ns: u64,
    pub fingerprint: u64,
    pub kind: SseKind,
    pub api: Api,
    /// The choice a token belongs to (OpenAI `n > 1`).
    pub choice: u32,
    pub token: TokenKind,
    /// Its text hashed (0: none, or not read); see `protocol::shape`.
    pub text_print: u64,
    /// Index of the I/O (within this exchange's response) that carried it.
    pub io: u32,
}

/// One HTTP request and its response on one connection end.
#[derive(Clone, Debug, Default)]
pub struct Exchange {
    /// Inline up to 24 bytes, as the head's (a clone per head, not an allocation).
    pub method: CompactString,
    pub path: CompactString,
    pub host: Option<String>,
    /// Its W3C `traceparent` header, when it carried a well-formed one.
    pub trace_parent: Option<String>,
    pub body_print: Option<(u64, u64)>,
    /// Hash of each whole KiB of the request body's first 64 KiB (see protocol::stream).
    pub prefix_prints: Vec<u64>,
    pub request_start_ns: u64,
    pub request_end_ns: Option<u64>,
    pub request_bytes: u64,
    pub response_first_ns: Option<u64>,
    pub response_end_ns: Option<u64>,
    pub status: Option<u32>,
    pub event_stream: bool,
    /// The response is `application/json` (a non-streaming answer: timed to its first
    /// body byte).
    pub json: bool,
    /// The first response I/O that carried body bytes.
    pub response_body_ns: Option<u64>,
    pub compressed: bool,
    pub response_ios: u32,
    pub sse: Vec<SseArrival>,
    /// No plaintext was seen: the exchange was cut from TLS records by direction changes.
    pub encrypted: bool,
    /// For encrypted exchanges: arrival of each response application-data record.
    pub records_ns: Vec<u64>,
    /// HTTP/2: the stream this exchange is.
    pub stream_id: Option<u32>,
    /// HTTP/2: the stream was already open when the recording began (or its head
    /// was lost): timed, but its request head is unknown.
    pub attached_mid: bool,
    /// HTTP/2: RST_STREAM ended it.
    pub reset: bool,
    /// Finalised in a request (or given up) by an incremental stitch: released.
    pub retired: bool,
}

impl Exchange {
    fn request_io(&mut self, ts: u64, bytes: u64, sn: &crate::ingest::model::Sniff) {
        self.request_bytes += bytes;
        if let Some(sniff::Kind::HttpRequest(h)) = &sn.kind {
            self.method = h.method.clone();
            self.path = h.path.clone();
            self.host = http::header(&h.headers, "host").map(str::to_string);
            self.trace_parent = http::header(&h.headers, "traceparent").map(str::to_string);
        }
        if let Some(p) = sn.body_print {
            self.body_print = Some((p.hash, p.length));
        }
        if !sn.prefix_prints.is_empty() {
            self.prefix_prints = sn.prefix_prints.clone();
        }
        if sn.message_end {
            self.request_end_ns = Some(ts);
        }
    }

    fn response_io(&mut self, ts: u64, sn: &crate::ingest::model::Sniff) {
        if let Some(sniff::Kind::HttpResponse(h)) = &sn.kind {
            if (100..200).contains(&h.status) {
                return; // an interim head (100 Continue): the answer is still to come
            }
            self.status = Some(h.status);
            let content_type = http::header(&h.headers, "content-type").unwrap_or_default();
            self.event_stream = content_type.starts_with("text/event-stream")
                || content_type.starts_with("application/x-ndjson");
            self.json = content_type.starts_with("application/json");
        }
        self.response_first_ns.get_or_insert(ts);
        if sn.body_bytes > 0 {
            self.response_body_ns.get_or_insert(ts);
        }
        let io = self.response_ios;
        self.response_ios += 1;
        self.compressed |= sn.compressed;
        self.sse.extend(sn.sse.iter().map(|e| SseArrival {
            ts_ns: ts,
            fingerprint: e.fingerprint,
            kind: e.kind(),
            api: e.api(),
            choice: e.choice,
            token: e.token(),
            text_print: e.text_print,
            io,
        }));
        if sn.message_end {
            self.response_end_ns = Some(ts);
        }
    }

    /// The response's token events: by their API's rule; in a stream of no known
    /// shape, every data event (`Api::Unknown`: counted rather than none at all).
    pub fn tokens(&self) -> impl Iterator<Item = &SseArrival> {
        let unknown = self.api() == Some(Api::Unknown);
        self.sse
            .iter()
            .filter(move |e| e.kind == SseKind::Choice || (unknown && e.kind == SseKind::Data))
    }

    /// Whose stream this is, by its events' shapes: the first event of a known API;
    /// `Unknown` when data events came and none had a known shape; `Openai` for
    /// recordings older than the API field (tokens were OpenAI's choices then).
    pub fn api(&self) -> Option<Api> {
        let known = self
            .sse
            .iter()
            .map(|e| e.api)
            .find(|a| !matches!(a, Api::Unknown | Api::Unspecified));
        if known.is_some() {
            return known;
        }
        if self.sse.iter().any(|e| e.kind == SseKind::Choice) {
            return Some(Api::Openai);
        }
        self.sse
            .iter()
            .any(|e| e.kind == SseKind::Data && e.api == Api::Unknown)
            .then_some(Api::Unknown)
    }

    pub fn done(&self) -> bool {
        self.sse.iter().any(|e| e.kind == SseKind::Done)
    }
}

mod slots;
pub use slots::Conns;

/// Builds connections from events in time order.
pub fn connections(events: &[&Event]) -> Conns {
    let mut t = ConnTracker::default();
    for &ev in events {
        t.push(ev);
    }
    t.conns
}

/// Connections built one event at a time (events in time order).
#[derive(Debug, Default)]
pub struct ConnTracker {
    pub conns: Conns,
    /// Socket address -> the connection open on it.
    open: FastMap<u64, usize>,
    next_id: usize,
}

impl ConnTracker {
    pub fn push(&mut self, ev: &Event) {
        let Some(sock) = ev.sock() else { return };
        let skaddr = sock.skaddr;
        let starts_new = match &ev.body {
            Some(Body::State(s)) => {
                s.new() == TcpState::SynSent
                    || (s.old() == TcpState::SynRecv && s.new() == TcpState::Established)
            }
            _ => false,
        };
        if matches!(&ev.body, Some(Body::State(s)) if s.old() == TcpState::Listen || s.new() == TcpState::Listen)
        {
            return; // listeners and request socks are not connections
        }
        // One lookup in `conns` for an event on an open connection (nearly all of them).
        let open = match self.open.get(&skaddr) {
            Some(i) if !starts_new => self.conns.get_mut(i),
            _ => None,
        };
        let c = match open {
            Some(c) => c,
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.open.insert(skaddr, id);
                self.conns.insert(id, Connection::new(id, ev, sock));
                self.conns.get_mut(&id).expect("inserted")
            }
        };
        c.last_ns = ev.ts_ns;
        if c.pid == 0 && ev.pid != 0 {
            c.pid = ev.pid;
            c.comm = ev.comm.to_string();
        }
        if c.local.port() == 0 && sock.sport != 0 {
            c.local = sock.src(); // connect() binds the local port after SYN_SENT
        }
        match &ev.body {
            Some(Body::State(s)) => {
                match s.new() {
                    TcpState::SynSent => {
                        c.connect_ns = Some(ev.ts_ns);
                        c.role = Role::Client;
                    }
                    TcpState::Established => c.established_ns = Some(ev.ts_ns),
                    TcpState::Close => {
                        c.close_ns = Some(ev.ts_ns);
                        self.open.remove(&skaddr);
                    }
                    _ => {}
                }
                if s.new() == TcpState::Established && s.old() == TcpState::SynRecv {
                    c.role = Role::Server;
                }
            }
            Some(Body::Accept(_)) => {
                c.accept_ns = Some(ev.ts_ns);
                c.role = Role::Server;
                c.pid = ev.pid;
                c.comm = ev.comm.to_string();
            }
            Some(Body::Retransmit(_)) => c.retransmits.push(ev.ts_ns),
            Some(Body::Io(_)) => c.io(ev),
            Some(Body::Cuda(_) | Body::Nvml(_) | Body::Gpu(_) | Body::Ring(_)) | None => {} // no socket: never reaches here
        }
    }

    /// Forgets a connection (an incremental stitch released it): later I/O on its
    /// socket starts a new one.
    pub fn release(&mut self, id: usize) -> Option<Connection> {
        let c = self.conns.remove(&id)?;
        if self.open.get(&c.skaddr) == Some(&id) {
            self.open.remove(&c.skaddr);
        }
        Some(c)
    }
}

impl Connection {
    fn new(id: usize, ev: &Event, sock: &crate::ingest::model::Sock) -> Connection {
        Connection {
            id,
            skaddr: sock.skaddr,
            local: sock.src(),
            remote: sock.dst(),
            pid: ev.pid,
            comm: if ev.pid != 0 {
                ev.comm.to_string()
            } else {
                String::new()
            },
            role: Role::Unknown,
            connect_ns: None,
            established_ns: None,
            accept_ns: None,
            close_ns: None,
            first_ns: ev.ts_ns,
            last_ns: ev.ts_ns,
            bytes_sent: 0,
            bytes_recv: 0,
            tls: None,
            retransmits: Vec::new(),
            exchanges: Vec::new(),
            exchange_base: 0,
            responding_from: 0,
            unparsed_ios: 0,
            limits: [0; Limit::ALL.len()],
            plaintext: false,
            h2: false,
            h2_control_frames: 0,
            h2_errors: 0,
            h2_unknown_headers: 0,
            h2_attached_mid: 0,
            wire: Default::default(),
            sse_room: 0,
        }
    }

    /// Exchange `i` (numbered from the connection's first; see `exchange_base`).
    pub fn exchange(&self, i: usize) -> &Exchange {
        &self.exchanges[i - self.exchange_base]
    }

    pub fn exchange_mut(&mut self, i: usize) -> &mut Exchange {
        &mut self.exchanges[i - self.exchange_base]
    }

    /// The numbers of the exchanges still held.
    pub fn exchange_ids(&self) -> std::ops::Range<usize> {
        self.exchange_base..self.exchange_base + self.exchanges.len()
    }

    /// The numbers of the exchanges held and not yet finalised.
    pub fn live_exchange_ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.exchange_ids().filter(|&i| !self.exchange(i).retired)
    }

    /// Exchanges this connection has carried so far, released ones included.
    pub fn exchange_count(&self) -> usize {
        self.exchange_base + self.exchanges.len()
    }

    /// Releases retired exchanges from the front (later ones keep their numbers);
    /// returns them.
    pub fn release_retired(&mut self) -> Vec<Exchange> {
        let n = self.exchanges.iter().take_while(|x| x.retired).count();
        if let Some(last) = n.checked_sub(1).map(|i| &self.exchanges[i]) {
            self.sse_room = last.sse.len();
        }
        self.exchange_base += n;
        self.exchanges.drain(..n).collect()
    }

    /// The direction requests travel at this end.
    pub fn request_dir(&self) -> Direction {
        if self.role == Role::Server {
            Direction::Recv
        } else {
            Direction::Send
        }
    }

    /// When the TCP handshake started and ended, from this end.
    pub fn handshake(&self) -> Option<(u64, u64)> {
        Some((self.connect_ns?, self.established_ns?))
    }

    fn io(&mut self, ev: &Event) {
        let io = ev.io().expect("caller checked");
        let plaintext = io.syscall().is_tls_plaintext();
        match (io.dir(), plaintext) {
            (Direction::Unknown, _) => return,
            (_, true) => {
                if !self.plaintext {
                    // Exchanges cut from records before the first plaintext are replaced by it.
                    self.exchanges.retain(|x| !x.encrypted || x.retired);
                    self.responding_from = self.exchange_base;
                    self.plaintext = true;
                }
            }
            (Direction::Send, false) => self.bytes_sent += io.bytes,
            (Direction::Recv, false) => self.bytes_recv += io.bytes,
        }
        let Some(sn) = io.sniff.as_ref() else { return };
        if !plaintext && (self.tls.is_some() || matches!(sn.kind, Some(sniff::Kind::Tls(_)))) {
            let end = match io.dir() {
                Direction::Send => self.bytes_sent,
                _ => self.bytes_recv,
            };
            self.wire.push(ev.ts_ns, io.dir(), end);
        }
        if sn.unparsed {
            self.unparsed_ios += 1;
        }
        // (Nearly every I/O reached none: not walked then.)
        if sn.limits != 0 || !sn.h2_streams.is_empty() {
            let streams = sn.h2_streams.iter().filter_map(|s| s.sniff.as_ref());
            for limit in std::iter::once(sn).chain(streams).flat_map(Sniff::hits) {
                self.limits[limit as usize] += 1;
            }
        }
        if let Some(sniff::Kind::Tls(t)) = &sn.kind {
            self.tls_records(ev.ts_ns, io.dir(), t);
            return;
        }
        if sn.h2_preface
            || !sn.h2_streams.is_empty()
            || sn.h2_control_frames > 0
            || sn.h2_errors > 0
        {
            self.h2 = true;
            self.h2_control_frames += u64::from(sn.h2_control_frames);
            self.h2_errors += u64::from(sn.h2_errors);
            for s in &sn.h2_streams {
                self.h2_stream(ev.ts_ns, io.dir(), s);
            }
            return;
        }
        if sn.message_start && self.role == Role::Unknown {
            // The first request decides which end this is.
            if matches!(sn.kind, Some(sniff::Kind::HttpRequest(_)))
                || !matches!(sn.kind, Some(sniff::Kind::HttpResponse(_)))
            {
                self.set_role_by_request(io.dir());
            }
        }
        if io.dir() == self.request_dir() {
            if sn.message_start {
                // Room for as many SSE events as the exchange before held: answers on
                // one connection look alike, and growing by doubling cost ~700
                // instructions a step (2% of a replay).
                let room = self.exchanges.last().map_or(self.sse_room, |x| x.sse.len());
                self.sse_room = room;
                self.exchanges.push(Exchange {
                    request_start_ns: ev.ts_ns,
                    // (A long answer before does not make every later one hold its room.)
                    sse: Vec::with_capacity(room.min(SSE_ROOM_MAX)),
                    ..Default::default()
                });
            }
            // Bytes before the first request head seen (or unparsable ones) belong to no exchange.
            if let Some(x) = self
                .exchanges
                .last_mut()
                .filter(|x| !x.encrypted && !x.retired)
            {
                x.request_io(ev.ts_ns, io.bytes, sn);
            }
        } else {
            // Responses answer requests in order: the oldest exchange still waiting.
            let from = self.responding_from.saturating_sub(self.exchange_base);
            let waiting = self.exchanges[from.min(self.exchanges.len())..]
                .iter()
                .position(|x| x.response_end_ns.is_none() && !x.retired)
                .map(|k| from + k);
            self.responding_from = self.exchange_base + waiting.unwrap_or(self.exchanges.len());
            if let Some(k) = waiting {
                self.exchanges[k].response_io(ev.ts_ns, sn);
            }
        }
    }

    fn set_role_by_request(&mut self, request_dir: Direction) {
        self.role = if request_dir == Direction::Send {
            Role::Client
        } else {
            Role::Server
        };
    }

    /// One HTTP/2 stream's frames in one I/O: its exchange is found by stream id.
    fn h2_stream(&mut self, ts: u64, dir: Direction, s: &crate::ingest::model::H2StreamSniff) {
        self.h2_unknown_headers += u64::from(s.unknown_headers);
        let Some(sn) = s.sniff.as_ref() else { return };
        if self.role == Role::Unknown {
            let reversed = match dir {
                Direction::Send => Direction::Recv,
                _ => Direction::Send,
            };
            match sn.kind {
                Some(sniff::Kind::HttpRequest(_)) => self.set_role_by_request(dir),
                Some(sniff::Kind::HttpResponse(_)) => self.set_role_by_request(reversed),
                _ => {}
            }
        }
        let found = self
            .exchanges
            .iter()
            .rposition(|x| x.stream_id == Some(s.stream_id));
        let idx = match found {
            // Finalised already (it went idle): late frames change nothing.
            Some(i) if self.exchanges[i].retired => return,
            Some(i) => i,
            None => {
                // A stream first seen in the response direction opened before the
                // recording: timed from here, its request unknown.
                let attached_mid = s.attached_mid || dir != self.request_dir();
                self.h2_attached_mid += usize::from(attached_mid);
                self.exchanges.push(Exchange {
                    request_start_ns: ts,
                    stream_id: Some(s.stream_id),
                    attached_mid,
                    ..Default::default()
                });
                self.exchanges.len() - 1
            }
        };
        let request_dir = self.request_dir();
        let x = &mut self.exchanges[idx];
        if dir == request_dir {
            x.request_io(ts, sn.body_bytes, sn);
        } else {
            x.response_io(ts, sn);
        }
        if s.reset {
            x.reset = true;
            x.request_end_ns.get_or_insert(ts);
            x.response_end_ns.get_or_insert(ts);
        }
    }

    fn tls_records(&mut self, ts: u64, dir: Direction, t: &crate::ingest::model::TlsRecords) {
        if self.role == Role::Unknown
            && t.records
                .first()
                .is_some_and(|r| r.handshake_type == Some(1))
        {
            self.role = if dir == Direction::Send {
                Role::Client
            } else {
                Role::Server
            };
        }
        let sent_by_client = (dir == Direction::Send) == (self.role != Role::Server);
        let times = self.tls.get_or_insert_with(TlsTimes::default);
        for r in &t.records {
            if r.handshake_type == Some(1) && sent_by_client {
                times.client_hello_ns.get_or_insert(ts);
            }
            if r.content_type == tls::APPLICATION_DATA {
                if sent_by_client {
                    times.client_first_app_ns.get_or_insert(ts);
                }
                times.app_records.push((ts, dir));
            }
        }
        let app = t
            .records
            .iter()
            .filter(|r| r.content_type == tls::APPLICATION_DATA)
            .count();
        if app > 0 && !self.plaintext {
            self.encrypted_exchange(ts, sent_by_client, app);
        }
    }

    /// Without plaintext, a client's records after the server answered start a new
    /// exchange; the server's records are that exchange's response chunks.
    fn encrypted_exchange(&mut self, ts: u64, sent_by_client: bool, records: usize) {
        if sent_by_client {
            let answered = self
                .exchanges
                .last()
                .is_none_or(|x| x.response_first_ns.is_some());
            if answered {
                self.exchanges.push(Exchange {
                    request_start_ns: ts,
                    encrypted: true,
                    ..Default::default()
                });
            }
            let x = self.exchanges.last_mut().expect("pushed above");
            x.request_end_ns = Some(ts);
        } else if let Some(x) = self
            .exchanges
            .last_mut()
            .filter(|x| x.encrypted && !x.retired)
        {
            x.response_first_ns.get_or_insert(ts);
            x.response_ios += 1;
            x.records_ns.extend(std::iter::repeat_n(ts, records));
            x.response_end_ns = None;
            // Its response is open again: the search starts no later than it.
            let last = self.exchange_base + self.exchanges.len() - 1;
            self.responding_from = self.responding_from.min(last);
        }
    }
}
