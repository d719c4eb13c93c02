//! A frame's batch from its protobuf bytes. The two kinds that are nearly every event
//! (socket I/O and libcuda calls) are read field by field here, and of an I/O's sniff
//! its flags, counts, HTTP heads and SSE events (its prints and HTTP/2 streams go to
//! prost field by field); everything else, and any event this reading does not take as
//! it is (a field of an unexpected wire type, a comm that is not UTF-8, a field it does not
//! know), goes to prost's own decoding of that event, so the result and every error
//! are prost's. About half of a replay was prost walking these events through its
//! generic merge loop. Format 4's socket references are ordinary `Sock` messages here
//! (`frame` resolves them after), so this reading is the same for every format.

use std::ops::Range;

use prost::encoding::{DecodeContext, WireType, MAX_TAG, MIN_TAG};
use prost::{DecodeError, Message};

use super::EventBatch;
use crate::ingest::model::event::Body;
use crate::ingest::model::{
    sniff, Addr, CompactString, CudaCall, Event, Header, HttpRequestHead, HttpResponseHead, Sniff,
    Sock, SockIo, SseEvent,
};

/// The batch in `plain`.
pub(super) fn decode(plain: &[u8]) -> Result<EventBatch, DecodeError> {
    let (mut batch, spans) = decode_in_place(plain)?;
    batch.shapes = plain[spans.shapes].to_vec();
    batch.columns = plain[spans.columns].to_vec();
    Ok(batch)
}

/// Where a format 5 batch's shapes and columns lie in its bytes (empty ranges: none).
#[derive(Clone, Debug, Default)]
pub(super) struct Spans {
    pub(super) shapes: Range<usize>,
    pub(super) columns: Range<usize>,
}

/// `decode`, its shapes and columns left where they lie in `plain` (read from there:
/// copying them out, ~7 MB on issue 17's bench recording, was ~0.7% of a replay's
/// instructions).
pub(super) fn decode_in_place(plain: &[u8]) -> Result<(EventBatch, Spans), DecodeError> {
    let mut spans = Spans::default();
    let mut batch = EventBatch {
        events: Vec::with_capacity(count_events(plain)),
        ..EventBatch::default()
    };
    let mut buf = plain;
    while !buf.is_empty() {
        let (tag, wire_type) = prost::encoding::decode_key(&mut buf)?;
        if tag == 1 && wire_type == WireType::LengthDelimited {
            // Read in place: an event is a few hundred bytes, not moved twice more.
            let mut field = buf;
            batch.events.push(Event::default());
            let e = batch.events.last_mut().expect("pushed");
            if take_message(&mut field).is_some_and(|b| event(e, b).is_some()) {
                buf = field;
                continue;
            }
            batch.events.pop();
        }
        // Format 5's shapes and columns: where they lie (prost's merge of a `bytes`
        // field went byte by byte: a fifth of the reading thread's instructions). As
        // prost, the last of a field's occurrences is its value.
        if wire_type == WireType::LengthDelimited && (tag == 4 || tag == 5) {
            let mut field = buf;
            if let Some(bytes) = take_message(&mut field) {
                let at = bytes.as_ptr() as usize - plain.as_ptr() as usize;
                let span = at..at + bytes.len();
                if tag == 4 {
                    spans.shapes = span;
                } else {
                    spans.columns = span;
                }
                buf = field;
                continue;
            }
        }
        // The two columns, packed (as every writer writes them): read here too.
        if wire_type == WireType::LengthDelimited && (tag == 2 || tag == 3) {
            let mut field = buf;
            let column = take_message(&mut field);
            let (deltas, prints) = (batch.ts_deltas.len(), batch.prints.len());
            let read = match (tag, column) {
                (2, Some(b)) => packed_varints(b, &mut batch.ts_deltas),
                (_, Some(b)) => packed_fixed64(b, &mut batch.prints),
                (_, None) => None,
            };
            if read.is_some() {
                buf = field;
                continue;
            }
            batch.ts_deltas.truncate(deltas);
            batch.prints.truncate(prints);
        }
        batch.merge_field(tag, wire_type, &mut buf, DecodeContext::default())?;
    }
    Ok((batch, spans))
}

/// How many events a batch's bytes hold (tag 1 fields), a capacity hint only: it stops
/// at the first thing it cannot read (decoding then says what), and never says more
/// than one event per two bytes.
fn count_events(mut buf: &[u8]) -> usize {
    let cap = buf.len() / 2;
    let mut n = 0;
    while let Some(key) = varint(&mut buf) {
        let skip = match key & 7 {
            0 => varint(&mut buf).map(|_| 0),
            1 => Some(8),
            2 => varint(&mut buf),
            5 => Some(4),
            _ => break,
        };
        match skip {
            Some(len) if len <= buf.len() as u64 => buf = &buf[len as usize..],
            _ => break,
        }
        if key >> 3 == 1 {
            n += 1;
        }
    }
    n.min(cap)
}

fn packed_varints(mut buf: &[u8], out: &mut Vec<u64>) -> Option<()> {
    out.reserve(buf.len() / 2);
    while !buf.is_empty() {
        out.push(varint(&mut buf)?);
    }
    Some(())
}

fn packed_fixed64(buf: &[u8], out: &mut Vec<u64>) -> Option<()> {
    if !buf.len().is_multiple_of(8) {
        return None;
    }
    let words = buf.chunks_exact(8);
    out.extend(words.map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))));
    Some(())
}

/// A length-delimited field's bytes (the length varint read from `buf`, the bytes taken).
fn take_message<'a>(buf: &mut &'a [u8]) -> Option<&'a [u8]> {
    let len = usize::try_from(varint(buf)?).ok()?;
    if len > buf.len() {
        return None;
    }
    let (field, rest) = buf.split_at(len);
    *buf = rest;
    Some(field)
}

/// A varint as prost reads one (at most 10 bytes, the 10th at most 1), None where
/// prost errs. Inlined: it is most of the bytes of an event, and prost's own reading
/// (through its `Buf` trait) was an eighth of a replay.
/// Two bytes are read inline too: every sniff field's key (tags 16 and up) is two bytes;
/// and three: pids and tids past 16383 (each I/O has both; 22 M fewer instructions a
/// bench replay than through `longer_varint`).
#[inline(always)]
pub(super) fn varint(buf: &mut &[u8]) -> Option<u64> {
    match **buf {
        [low, ..] if low < 0x80 => {
            *buf = &buf[1..];
            Some(u64::from(low))
        }
        [low, high, ..] if high < 0x80 && high != 0 => {
            *buf = &buf[2..];
            Some(u64::from(low & 0x7f) | u64::from(high) << 7)
        }
        [low, mid, high, ..] if mid >= 0x80 && high < 0x80 && high != 0 => {
            *buf = &buf[3..];
            Some(u64::from(low & 0x7f) | u64::from(mid & 0x7f) << 7 | u64::from(high) << 14)
        }
        _ => longer_varint(buf),
    }
}

/// A varint of two bytes or more: up to 8, from one 8-byte load (its last byte is the
/// first without the continuation bit; the 7-bit groups are then packed together in
/// three steps), else byte by byte.
#[inline(never)]
fn longer_varint(buf: &mut &[u8]) -> Option<u64> {
    if let Some(word) = buf.first_chunk::<8>() {
        let word = u64::from_le_bytes(*word);
        let ends = !word & 0x8080_8080_8080_8080;
        if ends != 0 {
            let len = ends.trailing_zeros() as usize / 8 + 1;
            let mut x = (word & (u64::MAX >> (64 - 8 * len))) & 0x7f7f_7f7f_7f7f_7f7f;
            x = ((x & 0x7f00_7f00_7f00_7f00) >> 1) | (x & 0x007f_007f_007f_007f);
            x = ((x & 0x3fff_0000_3fff_0000) >> 2) | (x & 0x0000_3fff_0000_3fff);
            x = ((x & 0x0fff_ffff_0000_0000) >> 4) | (x & 0x0000_0000_0fff_ffff);
            *buf = &buf[len..];
            return Some(x);
        }
    }
    let bytes = *buf;
    let n = bytes.len().min(10);
    let mut value = 0u64;
    let mut i = 0;
    while i < n {
        let byte = bytes[i];
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            if i == 9 && byte > 1 {
                return None;
            }
            *buf = &bytes[i + 1..];
            return Some(value);
        }
        i += 1;
    }
    None
}

/// A signed value as an unsigned varint's (small magnitudes, small varints): the
/// timestamps' deltas and format 5's signed columns.
pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Undoes `zigzag`.
pub(super) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// A field's key: (tag, wire type as its 3 bits).
fn key(buf: &mut &[u8]) -> Option<(u64, u64)> {
    let key = varint(buf)?;
    Some((key >> 3, key & 7))
}

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;

/// An event read by hand into `e` (a default one), None where prost must read it (see
/// the module's note).
fn event(e: &mut Event, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, VARINT) => e.ts_ns = varint(&mut buf)?,
            (2, VARINT) => e.pid = varint(&mut buf)? as u32,
            (3, VARINT) => e.tid = varint(&mut buf)? as u32,
            (4, VARINT) => e.cpu = varint(&mut buf)? as u32,
            (5, LEN) => {
                let comm = std::str::from_utf8(take_message(&mut buf)?).ok()?;
                e.comm.clear();
                e.comm.push_str(comm);
            }
            (11, LEN) => {
                let field = take_message(&mut buf)?;
                if !matches!(e.body, Some(Body::Io(_))) {
                    e.body = Some(Body::Io(SockIo::default()));
                }
                let Some(Body::Io(io)) = &mut e.body else {
                    unreachable!("set above")
                };
                sock_io(io, field)?;
            }
            (14, LEN) => {
                let field = take_message(&mut buf)?;
                if !matches!(e.body, Some(Body::Cuda(_))) {
                    e.body = Some(Body::Cuda(CudaCall::default()));
                }
                let Some(Body::Cuda(call)) = &mut e.body else {
                    unreachable!("set above")
                };
                cuda_call(call, field)?;
            }
            // The rarer kinds: prost's reading, into this event.
            (tag @ (10 | 12 | 13 | 15 | 16 | 17), LEN) => {
                let ctx = DecodeContext::default();
                e.merge_field(tag as u32, WireType::LengthDelimited, &mut buf, ctx)
                    .ok()?
            }
            _ => return None,
        }
    }
    Some(())
}

fn sock_io(io: &mut SockIo, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, LEN) => sock(
                io.sock.get_or_insert_with(Sock::default),
                take_message(&mut buf)?,
            )?,
            (2, VARINT) => io.dir = varint(&mut buf)? as i32,
            (3, VARINT) => io.syscall = varint(&mut buf)? as i32,
            (4, VARINT) => io.fd = varint(&mut buf)? as i32,
            (5, VARINT) => io.bytes = varint(&mut buf)?,
            (6, VARINT) => io.captured = varint(&mut buf)? as u32,
            (7, VARINT) => io.payload_fault = varint(&mut buf)? != 0,
            (8, LEN) => sniff(
                io.sniff.get_or_insert_with(Default::default),
                take_message(&mut buf)?,
            )?,
            _ => return None,
        }
    }
    Some(())
}

/// A sniff's flags, counts and SSE events read here; its heads, prints and HTTP/2
/// streams (nested, rarer) field by field by prost.
fn sniff(s: &mut Sniff, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            // An HTTP head (a few I/Os of each exchange, but prost's generic reading of
            // its headers was 4% of a replay): read here when it is the sniff's first.
            (10, LEN) if s.kind.is_none() => {
                let mut head = Box::<HttpRequestHead>::default();
                request_head(&mut head, take_message(&mut buf)?)?;
                s.kind = Some(sniff::Kind::HttpRequest(head));
            }
            (11, LEN) if s.kind.is_none() => {
                let mut head = Box::<HttpResponseHead>::default();
                response_head(&mut head, take_message(&mut buf)?)?;
                s.kind = Some(sniff::Kind::HttpResponse(head));
            }
            (20, VARINT) => s.message_start = varint(&mut buf)? != 0,
            (21, VARINT) => s.message_end = varint(&mut buf)? != 0,
            (22, VARINT) => s.body_bytes = varint(&mut buf)?,
            (24, LEN) => {
                s.sse.push(SseEvent::default());
                sse(s.sse.last_mut().expect("pushed"), take_message(&mut buf)?)?;
            }
            (25, VARINT) => s.unparsed = varint(&mut buf)? != 0,
            (26, VARINT) => s.compressed = varint(&mut buf)? != 0,
            (29, VARINT) => s.h2_control_frames = varint(&mut buf)? as u32,
            (30, VARINT) => s.h2_errors = varint(&mut buf)? as u32,
            (31, VARINT) => s.h2_preface = varint(&mut buf)? != 0,
            (33, VARINT) => s.limits = varint(&mut buf)? as u32,
            (tag, wire_type) => {
                // As prost's key reading: tag 0 and keys past 32 bits are errors.
                let tag = u32::try_from(tag)
                    .ok()
                    .filter(|t| (MIN_TAG..=MAX_TAG).contains(t))?;
                let wire_type = WireType::try_from(wire_type).ok()?;
                s.merge_field(tag, wire_type, &mut buf, DecodeContext::default())
                    .ok()?
            }
        }
    }
    Some(())
}

fn request_head(h: &mut HttpRequestHead, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, LEN) => h.method = text(&mut buf)?,
            (2, LEN) => h.path = text(&mut buf)?,
            (3, VARINT) => h.has_query = varint(&mut buf)? != 0,
            (4, LEN) => h.version = text(&mut buf)?,
            (5, LEN) => push_header(&mut h.headers, take_message(&mut buf)?)?,
            (6, VARINT) => h.complete = varint(&mut buf)? != 0,
            _ => return None,
        }
    }
    Some(())
}

fn response_head(h: &mut HttpResponseHead, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, LEN) => h.version = text(&mut buf)?,
            (2, VARINT) => h.status = varint(&mut buf)? as u32,
            (3, LEN) => push_header(&mut h.headers, take_message(&mut buf)?)?,
            (4, VARINT) => h.complete = varint(&mut buf)? != 0,
            _ => return None,
        }
    }
    Some(())
}

/// A head's next header; room for eight at its first (a vector's first room is four, and
/// a response head's fifth header then moved them all: a realloc per head).
fn push_header(headers: &mut Vec<Header>, buf: &[u8]) -> Option<()> {
    if headers.capacity() == 0 {
        headers.reserve_exact(8);
    }
    headers.push(header(buf)?);
    Some(())
}

fn header(mut buf: &[u8]) -> Option<Header> {
    let mut h = Header::default();
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, LEN) => h.name = header_text(&mut buf)?,
            (2, LEN) => h.value = Some(header_text(&mut buf)?),
            _ => return None,
        }
    }
    Some(h)
}

/// A string field as a `String` (an allocation of its length) or, for a header's name or
/// value, a `CompactString` (inline up to 24 bytes); None where it is not UTF-8 (prost
/// then reads the event and says so).
fn text<T: for<'a> From<&'a str>>(buf: &mut &[u8]) -> Option<T> {
    Some(T::from(std::str::from_utf8(take_message(buf)?).ok()?))
}

/// A header's name or value: `text`, or one that most clients and servers write, as its
/// static text (no UTF-8 check, no copy: a head's names and values were 2% of a
/// replay's instructions, 92,160 of them on issue 17's bench recording).
fn header_text(buf: &mut &[u8]) -> Option<CompactString> {
    let bytes = take_message(buf)?;
    let common = match bytes {
        b"host" => "host",
        b"content-type" => "content-type",
        b"content-length" => "content-length",
        b"transfer-encoding" => "transfer-encoding",
        b"connection" => "connection",
        b"accept" => "accept",
        b"accept-encoding" => "accept-encoding",
        b"user-agent" => "user-agent",
        b"authorization" => "authorization",
        b"date" => "date",
        b"server" => "server",
        b"cache-control" => "cache-control",
        b"x-request-id" => "x-request-id",
        b"x-accel-buffering" => "x-accel-buffering",
        b"content-encoding" => "content-encoding",
        b"vary" => "vary",
        b"chunked" => "chunked",
        b"keep-alive" => "keep-alive",
        b"close" => "close",
        b"no-cache" => "no-cache",
        b"application/json" => "application/json",
        b"text/event-stream" => "text/event-stream",
        b"text/event-stream; charset=utf-8" => "text/event-stream; charset=utf-8",
        _ => return Some(CompactString::from(std::str::from_utf8(bytes).ok()?)),
    };
    Some(CompactString::const_new(common))
}

fn sse(e: &mut SseEvent, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, FIXED64) => e.fingerprint = fixed64(&mut buf)?,
            (2, VARINT) => e.kind = varint(&mut buf)? as i32,
            (3, VARINT) => e.api = varint(&mut buf)? as i32,
            (4, VARINT) => e.choice = varint(&mut buf)? as u32,
            (5, VARINT) => e.token = varint(&mut buf)? as i32,
            (6, FIXED64) => e.text_print = fixed64(&mut buf)?,
            _ => return None,
        }
    }
    Some(())
}

fn fixed64(buf: &mut &[u8]) -> Option<u64> {
    let (bytes, rest) = buf.split_first_chunk::<8>()?;
    *buf = rest;
    Some(u64::from_le_bytes(*bytes))
}

fn sock(s: &mut Sock, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, VARINT) => s.skaddr = varint(&mut buf)?,
            (2, LEN) => s.saddr = Addr::from_slice(take_message(&mut buf)?),
            (3, VARINT) => s.sport = varint(&mut buf)? as u32,
            (4, LEN) => s.daddr = Addr::from_slice(take_message(&mut buf)?),
            (5, VARINT) => s.dport = varint(&mut buf)? as u32,
            _ => return None,
        }
    }
    Some(())
}

fn cuda_call(c: &mut CudaCall, mut buf: &[u8]) -> Option<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, VARINT) => c.api = varint(&mut buf)? as i32,
            (2, VARINT) => c.entry = varint(&mut buf)? != 0,
            (3, VARINT) => c.stream = varint(&mut buf)?,
            (4, VARINT) => c.bytes = varint(&mut buf)?,
            (5, VARINT) => c.result = varint(&mut buf)? as i64,
            (6, VARINT) => c.per_thread_stream = varint(&mut buf)? != 0,
            _ => return None,
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::varint;
    use crate::ingest::model::event::Body;
    use crate::ingest::model::{
        sniff, Event, Header, HttpRequestHead, HttpResponseHead, Sniff, SockIo,
    };
    use crate::ingest::record::EventBatch;
    use prost::Message;

    /// Heads read as prost reads them, with their common names and values (static
    /// texts), others, an empty value and none; one whose value is not UTF-8 is prost's
    /// error.
    #[test]
    fn heads_read_as_prost_reads_them() {
        let header = |name: &str, value: Option<&str>| Header {
            name: name.into(),
            value: value.map(Into::into),
        };
        let headers = vec![
            header("content-type", Some("text/event-stream; charset=utf-8")),
            header("transfer-encoding", Some("chunked")),
            header("x-request-id", None),
            header(
                "x-custom-header-longer-than-24",
                Some("a value longer than 24 bytes"),
            ),
            header("host", Some("")),
            header("chunked", Some("host")),
        ];
        let io = |kind| Event {
            pid: 7,
            body: Some(Body::Io(SockIo {
                sniff: Some(Sniff {
                    kind: Some(kind),
                    ..Sniff::default()
                }),
                ..SockIo::default()
            })),
            ..Event::default()
        };
        let batch = EventBatch {
            events: vec![
                io(sniff::Kind::HttpRequest(Box::new(HttpRequestHead {
                    method: "POST".into(),
                    headers: headers.clone(),
                    ..HttpRequestHead::default()
                }))),
                io(sniff::Kind::HttpResponse(Box::new(HttpResponseHead {
                    status: 200,
                    headers,
                    ..HttpResponseHead::default()
                }))),
            ],
            ..EventBatch::default()
        };
        let bytes = batch.encode_to_vec();
        let ours = super::decode(&bytes).expect("decodes");
        assert_eq!(ours, EventBatch::decode(&bytes[..]).expect("prost decodes"));
        assert_eq!(ours, batch, "the heads as written");
        // "chunked" (a common value) as a value not UTF-8: 0xff in its place.
        let at = bytes
            .windows(7)
            .position(|w| w == b"chunked")
            .expect("written");
        let mut bad = bytes.clone();
        bad[at] = 0xff;
        assert!(EventBatch::decode(&bad[..]).is_err(), "prost refuses it");
        assert!(super::decode(&bad).is_err(), "and so does this reading");
    }

    #[test]
    fn varints_read_as_prost_reads_them() {
        let mut values: Vec<u64> = (0..64).flat_map(|b| [1u64 << b, (1u64 << b) - 1]).collect();
        values.extend([u64::MAX, 0x0123_4567_89ab_cdef, 300, 16_384]);
        for v in values {
            let mut bytes = Vec::new();
            prost::encoding::encode_varint(v, &mut bytes);
            // Alone (shorter than a word), and followed by more bytes (a word's load).
            for tail in [&[][..], &[0xff; 9][..]] {
                let whole = [&bytes[..], tail].concat();
                let mut ours = &whole[..];
                assert_eq!(varint(&mut ours), Some(v), "{v:#x}");
                assert_eq!(ours, tail, "{v:#x}: the varint's bytes taken, no more");
            }
        }
        // Non-canonical (a zero continuation) and damaged: as prost.
        for bytes in [
            &[0x80, 0x00][..],
            &[0x80, 0x80, 0x00],
            &[0xff, 0x80, 0x00, 0x01],
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02],
            &[0xff; 11],
            &[0x80, 0x80],
        ] {
            let mut ours = bytes;
            let mut theirs = bytes;
            let want = prost::encoding::decode_varint(&mut theirs).ok();
            assert_eq!(varint(&mut ours), want, "{bytes:x?}");
        }
    }
}
