//! One direction of one socket, read as a byte stream across its I/Os: HTTP/1.x
//! messages (heads, bodies, SSE events), HTTP/2 frames (see `h2`) or TLS records. Each I/O yields a
//! [`Sniff`]; the parser keeps only framing state, never content, beyond the
//! current event.

use std::io::Write;

use flate2::write::GzDecoder;

use super::body::{BodyReader, Chunk};
use super::h2::{self, H2Conn};
use super::sse::SseSplitter;
use super::{fingerprint, fnv_extend, http, tls, FNV_OFFSET};
use crate::ingest::model::{sniff, BodyPrint, Header, Sniff, TlsRecord, TlsRecords};

/// Longest HTTP head accepted before the stream is declared unparsable.
const MAX_HEAD: usize = 64 << 10;
/// Request bodies are identified by a hash of this many first bytes plus their length.
pub const BODY_PRINT_BYTES: usize = 1024;
/// Request bodies also carry the hash of every whole `PREFIX_STEP` of their first
/// `PREFIX_BYTES`: two prompts that share a prefix (a system prompt) share those.
pub const PREFIX_STEP: usize = 1024;
pub const PREFIX_BYTES: usize = 64 << 10;

#[derive(Debug, Default)]
pub struct StreamParser {
    phase: Phase,
    /// The current I/O's bytes go on past what was captured.
    cut: bool,
}

#[derive(Debug, Default)]
enum Phase {
    /// Between messages: the next bytes should start an HTTP head or a TLS record.
    #[default]
    Idle,
    Head(Vec<u8>),
    Body(Box<BodyState>),
    /// Inside a TLS stream: bytes left of the current record, and a partial header.
    Tls {
        skip: u64,
        partial: Vec<u8>,
    },
    /// Unparsable or lost track; retried at the start of the next I/O.
    Lost,
    /// The I/O held only the first bytes of an HTTP/2 preface ("P", "PR" or "PRI"
    /// of the client's, part of a server's SETTINGS header): too few to tell.
    Pending(Vec<u8>),
    /// An HTTP/2 connection: from here on every byte is a frame.
    H2(Box<H2Conn>),
    /// Lost track inside an event stream's body (bytes went uncaptured). Writers put
    /// each event (or chunk) at the start of a write, so the next I/O that starts
    /// like one resumes the body.
    LostSse {
        chunked: bool,
    },
}

#[derive(Debug)]
struct BodyState {
    reader: BodyReader,
    content: BodyContent,
}

/// What a message body's content feeds, whatever framed it (HTTP/1.x framing or
/// HTTP/2 DATA frames): byte counts, the request print and prefix prints, and
/// the SSE events of an event stream.
#[derive(Debug, Default)]
pub(super) struct BodyContent {
    sse: Option<SseSplitter>,
    /// A gzip-encoded event stream, inflated to read its events (gateways compress
    /// SSE; the timing of what they let through is the point).
    inflate: Option<Box<GzDecoder<Vec<u8>>>>,
    /// For request bodies: running hash of the first bytes, the declared length, bytes hashed.
    print: Option<(u64, Option<u64>, usize)>,
    /// For request bodies: running hash over every byte so far, and the hash at
    /// each whole step; None once bytes went uncaptured.
    prefix: Option<(u64, usize, Vec<u64>)>,
    seen: u64,
    /// Bytes went missing inside an event: its tail is dropped up to the next
    /// blank line (line-start and after-CR state), so no event is made of it.
    gap: Option<(bool, bool)>,
    /// A body read from part-way through (no head seen): bytes are counted until
    /// a segment (an HTTP/2 DATA frame) starts like an event stream.
    probe: Option<Probe>,
}

#[derive(Debug, Default)]
struct Probe {
    /// The current segment's first bytes, while too few to tell.
    held: Vec<u8>,
    undecided: bool,
}

impl StreamParser {
    /// Reads one I/O: `captured` is the payload prefix, `total` the bytes the socket moved.
    pub fn feed(&mut self, captured: &[u8], total: u64) -> Sniff {
        let mut out = Sniff {
            fingerprint: fingerprint(captured),
            ..Default::default()
        };
        self.cut = total > captured.len() as u64;
        match std::mem::take(&mut self.phase) {
            Phase::Lost => {} // resynchronise on a message or record boundary
            Phase::Pending(buf) => self.pending(buf, captured, &mut out),
            Phase::LostSse { chunked } => match resume_sse(captured, chunked) {
                Some(state) => self.phase = Phase::Body(Box::new(state)),
                None if http::starts_like_head(captured)
                    || tls::parse_records(captured).is_some() => {}
                None => {
                    out.unparsed = true;
                    self.phase = Phase::LostSse { chunked };
                    return out;
                }
            },
            other => self.phase = other,
        }
        let mut rest = captured;
        while !rest.is_empty() {
            rest = match std::mem::take(&mut self.phase) {
                Phase::Idle => self.start(rest, &mut out),
                Phase::Head(buf) => self.head(buf, rest, &mut out),
                Phase::Body(state) => self.body(state, rest, &mut out),
                Phase::Tls { skip, partial } => self.tls(skip, partial, rest, &mut out),
                Phase::H2(mut conn) => {
                    conn.feed(rest, self.cut, &mut out);
                    self.phase = Phase::H2(conn);
                    &[]
                }
                Phase::Pending(buf) => {
                    self.phase = Phase::Pending(buf); // only at an I/O start, handled above
                    &[]
                }
                lost @ (Phase::Lost | Phase::LostSse { .. }) => {
                    self.phase = lost;
                    &[]
                }
            };
        }
        let uncaptured = total.saturating_sub(captured.len() as u64);
        if uncaptured > 0 {
            self.skip(uncaptured, &mut out);
        }
        out
    }

    fn start<'a>(&mut self, rest: &'a [u8], out: &mut Sniff) -> &'a [u8] {
        // Before HTTP/1: "PRI " would read as a method.
        if h2::too_short_for_client_preface(rest) && !self.cut {
            self.phase = Phase::Pending(rest.to_vec());
            return &[];
        }
        if h2::starts_client_preface(rest) {
            out.h2_preface = true;
            self.phase = Phase::H2(Box::new(H2Conn::client()));
        } else if tls::parse_records(rest).is_some() || tls::could_start_record(rest) {
            self.phase = Phase::Tls {
                skip: 0,
                partial: Vec::new(),
            };
        } else if http::starts_like_head(rest) {
            out.message_start = true;
            self.phase = Phase::Head(Vec::new());
        } else if h2::starts_server_preface(rest) {
            out.h2_preface = true;
            self.phase = Phase::H2(Box::new(H2Conn::server()));
        } else if h2::too_short_for_server_preface(rest) && !self.cut {
            self.phase = Phase::Pending(rest.to_vec());
            return &[];
        } else if h2::looks_like_frames(rest, self.cut) {
            // Joined mid-connection, or lost and found again: no preface, the HPACK table unknown.
            self.phase = Phase::H2(Box::new(H2Conn::joined_mid()));
        } else {
            out.unparsed = true;
            self.phase = Phase::Lost;
            return &[];
        }
        rest
    }

    /// The I/O after one that held only the first bytes of a preface: HTTP/2,
    /// or HTTP/1 after all, or neither.
    fn pending(&mut self, mut buf: Vec<u8>, captured: &[u8], out: &mut Sniff) {
        let held = buf.len();
        buf.extend_from_slice(&captured[..captured.len().min(h2::PREFACE.len())]);
        let short =
            h2::too_short_for_client_preface(&buf) || h2::too_short_for_server_preface(&buf);
        let conn = if short && !self.cut {
            self.phase = Phase::Pending(buf); // still too short to tell
            return;
        } else if h2::starts_client_preface(&buf) {
            H2Conn::client()
        } else if h2::starts_server_preface(&buf) {
            H2Conn::server()
        } else {
            buf.truncate(held);
            if http::starts_like_head(&buf) {
                out.message_start = true;
                self.phase = Phase::Head(buf);
            } // else the held bytes are dropped and this I/O starts afresh
            return;
        };
        out.h2_preface = true;
        let mut conn = Box::new(conn);
        // The held bytes are a preface's or a frame header's start: they yield nothing yet.
        conn.feed(&buf[..held], false, &mut Sniff::default());
        self.phase = Phase::H2(conn);
    }

    fn head<'a>(&mut self, mut buf: Vec<u8>, rest: &'a [u8], out: &mut Sniff) -> &'a [u8] {
        // The head ends at the first CRLFCRLF; look across the join with what came before.
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(rest);
        let Some(end) = buf[from..]
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map(|p| from + p + 4)
        else {
            if buf.len() > MAX_HEAD {
                out.unparsed = true;
                self.phase = Phase::Lost;
            } else {
                self.phase = Phase::Head(buf);
            }
            return &[];
        };
        let used = end - (buf.len() - rest.len());
        let head = &buf[..end];
        let body = if let Some(req) = http::parse_request_head(head) {
            let length =
                http::header(&req.headers, "content-length").and_then(|v| v.parse::<u64>().ok());
            let chunked = is_chunked(&req.headers);
            out.kind = Some(sniff::Kind::HttpRequest(req));
            let reader = match (chunked, length) {
                (true, _) => Some(BodyReader::Chunked(Chunk::Size(Vec::new()))),
                (false, Some(n)) if n > 0 => Some(BodyReader::Length(n)),
                _ => None,
            };
            reader.map(|reader| BodyState {
                reader,
                content: BodyContent::request(length),
            })
        } else if let Some(resp) = http::parse_response_head(head) {
            let length =
                http::header(&resp.headers, "content-length").and_then(|v| v.parse::<u64>().ok());
            let bodiless = resp.status < 200 || resp.status == 204 || resp.status == 304;
            let reader = match (bodiless, is_chunked(&resp.headers), length) {
                (true, _, _) | (false, false, Some(0)) => None,
                (false, true, _) => Some(BodyReader::Chunked(Chunk::Size(Vec::new()))),
                (false, false, Some(n)) => Some(BodyReader::Length(n)),
                (false, false, None) => Some(BodyReader::UntilClose),
            };
            let (content, compressed) = BodyContent::response(&resp.headers);
            out.compressed |= compressed && reader.is_some();
            out.kind = Some(sniff::Kind::HttpResponse(resp));
            reader.map(|reader| BodyState { reader, content })
        } else {
            out.unparsed = true;
            self.phase = Phase::Lost;
            return &[];
        };
        match body {
            Some(state) => self.phase = Phase::Body(Box::new(state)),
            None => out.message_end = true,
        }
        &rest[used..]
    }

    fn body<'a>(&mut self, mut state: Box<BodyState>, rest: &'a [u8], out: &mut Sniff) -> &'a [u8] {
        let BodyState { reader, content } = &mut *state;
        let progress = reader.feed(rest, &mut |bytes| content.feed(bytes, out));
        let Ok(progress) = progress else {
            out.unparsed = true;
            self.phase = Phase::Lost;
            return &[];
        };
        state.content.settle(progress.ended, out);
        if progress.ended {
            out.message_end = true;
            self.phase = Phase::Idle;
        } else {
            self.phase = Phase::Body(state);
        }
        &rest[progress.consumed..]
    }

    fn tls<'a>(
        &mut self,
        skip: u64,
        mut partial: Vec<u8>,
        rest: &'a [u8],
        out: &mut Sniff,
    ) -> &'a [u8] {
        if skip > 0 {
            let n = skip.min(rest.len() as u64);
            self.phase = Phase::Tls {
                skip: skip - n,
                partial,
            };
            return &rest[n as usize..];
        }
        let need = 5 - partial.len();
        let take = need.min(rest.len());
        partial.extend_from_slice(&rest[..take]);
        if partial.len() < 5 {
            self.phase = Phase::Tls { skip: 0, partial };
            return &[];
        }
        // The handshake type byte, when it is in this I/O, follows the header.
        let mut header = partial.clone();
        header.extend(rest.get(take).copied());
        let Some(TlsRecords { records }) = tls::parse_records(&header) else {
            out.unparsed = true;
            self.phase = Phase::Lost;
            return &[];
        };
        let record: TlsRecord = records[0].clone();
        let body = u64::from(record.length);
        match out
            .kind
            .get_or_insert_with(|| sniff::Kind::Tls(TlsRecords::default()))
        {
            sniff::Kind::Tls(t) => t.records.push(record),
            _ => out.unparsed = true, // TLS after an HTTP message in one I/O: not a real stream
        }
        self.phase = Phase::Tls {
            skip: body,
            partial: Vec::new(),
        };
        &rest[take..]
    }

    fn skip(&mut self, n: u64, out: &mut Sniff) {
        match std::mem::take(&mut self.phase) {
            Phase::Body(mut state) => match state.reader.skip(n) {
                Ok(ended) => {
                    state.content.skipped(n, out);
                    state.content.settle(ended, out);
                    if ended {
                        out.message_end = true;
                    } else {
                        self.phase = Phase::Body(state);
                    }
                }
                Err(_) => {
                    out.unparsed = true;
                    self.phase = match (&state.content.sse, &state.reader) {
                        (Some(_), BodyReader::Chunked(_)) => Phase::LostSse { chunked: true },
                        _ => Phase::Lost,
                    };
                }
            },
            Phase::H2(mut conn) => {
                conn.skip(n, out);
                self.phase = Phase::H2(conn);
            }
            Phase::Tls { skip, partial } if partial.is_empty() && skip >= n => {
                self.phase = Phase::Tls {
                    skip: skip - n,
                    partial,
                };
            }
            _ => {
                out.unparsed = true;
                self.phase = Phase::Lost;
            }
        }
    }
}

/// Hashes `content` into the running prefix hash, noting the hash at each whole step.
fn extend_prefix(hash: &mut u64, hashed: &mut usize, steps: &mut Vec<u64>, mut content: &[u8]) {
    while !content.is_empty() && *hashed < PREFIX_BYTES {
        let to_step = PREFIX_STEP - *hashed % PREFIX_STEP;
        let take = to_step.min(content.len());
        *hash = fnv_extend(*hash, &content[..take]);
        *hashed += take;
        content = &content[take..];
        if (*hashed).is_multiple_of(PREFIX_STEP) {
            steps.push(*hash);
        }
    }
}

impl BodyContent {
    /// A request body: printed (first bytes and length) and prefix-printed.
    pub(super) fn request(declared: Option<u64>) -> Self {
        BodyContent {
            print: Some((FNV_OFFSET, declared, 0)),
            prefix: Some((FNV_OFFSET, 0, Vec::new())),
            ..Default::default()
        }
    }

    /// A response body: an event stream (inflated when gzip) is split into events.
    /// Also says whether the body is compressed.
    pub(super) fn response(headers: &[Header]) -> (Self, bool) {
        let encoding = http::header(headers, "content-encoding")
            .filter(|v| !v.eq_ignore_ascii_case("identity"));
        let compressed = encoding.is_some();
        let gzip = encoding
            .is_some_and(|v| v.eq_ignore_ascii_case("gzip") || v.eq_ignore_ascii_case("x-gzip"));
        let event_stream = http::header(headers, "content-type")
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let content = BodyContent {
            sse: (event_stream && (gzip || !compressed)).then(SseSplitter::new),
            inflate: (event_stream && gzip).then(|| Box::new(GzDecoder::new(Vec::new()))),
            ..Default::default()
        };
        (content, compressed)
    }

    /// A body known only to look like an event stream (read from part-way through).
    pub(super) fn event_stream() -> Self {
        BodyContent {
            sse: Some(SseSplitter::new()),
            ..Default::default()
        }
    }

    /// A body joined part-way (see `probe`).
    pub(super) fn attached() -> Self {
        BodyContent {
            probe: Some(Probe::default()),
            ..Default::default()
        }
    }

    /// A segment starts: an attached body may show an event stream at its start.
    pub(super) fn segment_start(&mut self) {
        if let Some(p) = self.probe.as_mut() {
            p.held.clear();
            p.undecided = true;
        }
    }

    /// The segment ended: bytes still held were not an event's start.
    pub(super) fn segment_end(&mut self, out: &mut Sniff) {
        if let Some(p) = self.probe.as_mut() {
            out.body_bytes += p.held.len() as u64;
            self.seen += p.held.len() as u64;
            p.held.clear();
            p.undecided = false;
        }
    }

    /// Content bytes, in order.
    pub(super) fn feed(&mut self, content: &[u8], out: &mut Sniff) {
        if let Some(p) = self.probe.as_mut() {
            if p.undecided {
                let had = p.held.len();
                let take = 6usize.saturating_sub(had).min(content.len());
                p.held.extend_from_slice(&content[..take]);
                let starts_event = sse_start(&p.held);
                if starts_event.is_none() {
                    return; // too few bytes to tell: all of them are held
                }
                p.held.truncate(had);
                let held = std::mem::take(&mut p.held);
                p.undecided = false;
                if starts_event == Some(true) {
                    self.probe = None;
                    self.sse = Some(SseSplitter::new());
                    self.feed(&held, out);
                    self.feed(content, out);
                    return;
                }
                out.body_bytes += held.len() as u64;
                self.seen += held.len() as u64;
            }
            out.body_bytes += content.len() as u64;
            self.seen += content.len() as u64;
            return;
        }
        out.body_bytes += content.len() as u64;
        self.seen += content.len() as u64;
        if let Some((hash, _, hashed)) = self.print.as_mut() {
            let take = (BODY_PRINT_BYTES - *hashed).min(content.len());
            *hash = fnv_extend(*hash, &content[..take]);
            *hashed += take;
        }
        if let Some((hash, hashed, steps)) = self.prefix.as_mut() {
            extend_prefix(hash, hashed, steps, content);
        }
        match (self.sse.as_mut(), self.inflate.as_mut()) {
            (Some(splitter), Some(gz)) => {
                let inflated = gz.write_all(content).and_then(|()| gz.flush());
                if inflated.is_ok() {
                    let events = past_gap(&mut self.gap, gz.get_ref());
                    out.sse.extend(splitter.feed(events));
                    gz.get_mut().clear();
                } else {
                    // Not gzip after all, or corrupt: its events stay unseen.
                    self.sse = None;
                    self.inflate = None;
                }
            }
            (Some(splitter), None) => {
                out.sse
                    .extend(splitter.feed(past_gap(&mut self.gap, content)));
            }
            (None, _) => {}
        }
    }

    /// `n` content bytes went uncaptured (their place is known).
    pub(super) fn skipped(&mut self, n: u64, out: &mut Sniff) {
        self.segment_end(out); // a segment start still held is undecidable now
        self.seen += n;
        out.body_bytes += n;
        self.gap();
    }

    /// An unknown number of content bytes went missing: no print from here on
    /// would be true.
    pub(super) fn lost(&mut self) {
        self.print = None;
        if self.sse.is_some() || self.probe.is_some() {
            // Events resume only where a later segment starts like one.
            *self = BodyContent::attached();
        }
        self.gap();
    }

    /// Bytes went missing: the prefix ends (the steps already whole stay) and the
    /// event in progress is dropped.
    fn gap(&mut self) {
        if let Some((_, _, steps)) = self.prefix.take() {
            self.prefix = Some((0, PREFIX_BYTES, steps));
        }
        if let Some(sse) = self.sse.as_mut() {
            sse.reset();
            self.gap = Some((false, false));
        }
    }

    /// Emits the body print once its first bytes are hashed and its length is
    /// known, and the prefix prints when the body `ended`.
    pub(super) fn settle(&mut self, ended: bool, out: &mut Sniff) {
        if let Some((hash, declared, hashed)) = self.print {
            let length = if ended { Some(self.seen) } else { declared };
            if let Some(length) = length {
                if hashed >= BODY_PRINT_BYTES || ended || hashed as u64 >= length {
                    out.body_print = Some(BodyPrint { hash, length });
                    self.print = None;
                }
            }
        }
        if ended {
            out.prefix_prints = self.prefix.take().map(|p| p.2).unwrap_or_default();
        }
    }
}

/// Whether body bytes start like an SSE field; `None` while too short to tell.
fn sse_start(b: &[u8]) -> Option<bool> {
    const STARTS: [&[u8]; 3] = [b"data:", b"event:", b":"];
    if STARTS.iter().any(|s| b.starts_with(s)) {
        Some(true)
    } else if STARTS.iter().any(|s| s.starts_with(b)) {
        None
    } else {
        Some(false)
    }
}

/// After a gap, the bytes from just past the next blank line (the cut event's end);
/// none while it is still to come.
fn past_gap<'b>(gap: &mut Option<(bool, bool)>, bytes: &'b [u8]) -> &'b [u8] {
    let Some((at_line_start, after_cr)) = gap.as_mut() else {
        return bytes;
    };
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\n' && *after_cr {
            *after_cr = false;
            continue; // CRLF is one line end
        }
        *after_cr = b == b'\r';
        let newline = b == b'\n' || b == b'\r';
        if newline && *at_line_start {
            *gap = None;
            return &bytes[i + 1..];
        }
        *at_line_start = newline;
    }
    &[]
}

/// A body that resumes at this I/O: a chunk-size line then an SSE field, or (unchunked)
/// an SSE field at once.
fn resume_sse(captured: &[u8], chunked: bool) -> Option<BodyState> {
    let sse_start = |b: &[u8]| sse_start(b) == Some(true);
    let reader = if chunked {
        let line_end = captured.iter().take(18).position(|b| *b == b'\r')?;
        let hex = &captured[..line_end];
        let ok = !hex.is_empty()
            && hex.iter().all(u8::is_ascii_hexdigit)
            && captured.get(line_end + 1) == Some(&b'\n');
        (ok && sse_start(&captured[line_end + 2..]))
            .then(|| BodyReader::Chunked(Chunk::Size(Vec::new())))?
    } else {
        sse_start(captured).then_some(BodyReader::UntilClose)?
    };
    Some(BodyState {
        reader,
        content: BodyContent::event_stream(),
    })
}

fn is_chunked(headers: &[Header]) -> bool {
    http::header(headers, "transfer-encoding")
        .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
