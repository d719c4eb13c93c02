//! One direction of one socket, read as a byte stream across its I/Os: HTTP/1.x
//! messages (heads, bodies, SSE events), HTTP/2 frames (see `h2`) or TLS records. Each I/O yields a
//! [`Sniff`]; the parser keeps only framing state, never content, beyond the
//! current event.

use super::body::{BodyReader, Chunk};
use super::content::{sse_start, BodyContent};
use super::h2::{self, H2Conn};
use super::limits::{Limit, MAX_HTTP_HEAD as MAX_HEAD};
use super::{http, tls};
use crate::ingest::model::{sniff, Header, Sniff, TlsRecord, TlsRecords};

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

impl StreamParser {
    /// Reads one I/O: `captured` is the payload prefix, `total` the bytes the socket moved.
    pub fn feed(&mut self, captured: &[u8], total: u64) -> Sniff {
        let mut out = Sniff::default();
        self.feed_into(captured, total, &mut out);
        out
    }

    /// `feed` into `out`, a default `Sniff` where its event holds it (the recorder
    /// copied each 184-byte sniff returned into its event).
    pub fn feed_into(&mut self, captured: &[u8], total: u64, out: &mut Sniff) {
        // No hash of the whole prefix (`Sniff::fingerprint` stays 0): nothing joins by
        // it (events and bodies carry their own prints), and hashing every captured byte
        // took 8% of a live recorder's CPU and eight incompressible bytes per I/O.
        self.cut = total > captured.len() as u64;
        match std::mem::take(&mut self.phase) {
            Phase::Lost => {} // resynchronise on a message or record boundary
            Phase::Pending(buf) => self.pending(buf, captured, out),
            Phase::LostSse { chunked } => match resume_sse(captured, chunked) {
                Some(state) => self.phase = Phase::Body(Box::new(state)),
                None if http::starts_like_head(captured)
                    || tls::parse_records(captured).is_some() => {}
                None => {
                    out.unparsed = true;
                    self.phase = Phase::LostSse { chunked };
                    return;
                }
            },
            other => self.phase = other,
        }
        let mut rest = captured;
        while !rest.is_empty() {
            rest = match std::mem::take(&mut self.phase) {
                Phase::Idle => self.start(rest, out),
                Phase::Head(buf) => self.head(buf, rest, out),
                Phase::Body(state) => self.body(state, rest, out),
                Phase::Tls { skip, partial } => self.tls(skip, partial, rest, out),
                Phase::H2(mut conn) => {
                    conn.feed(rest, self.cut, out);
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
            self.skip(uncaptured, out);
        }
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
                out.hit(Limit::HttpHead);
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
            out.kind = Some(sniff::Kind::HttpRequest(Box::new(req)));
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
            out.kind = Some(sniff::Kind::HttpResponse(Box::new(resp)));
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
                    self.phase = match (state.content.is_event_stream(), &state.reader) {
                        (true, BodyReader::Chunked(_)) => Phase::LostSse { chunked: true },
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
