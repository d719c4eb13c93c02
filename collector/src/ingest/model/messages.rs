//! `Event` and `Sock` as protobuf messages, written by hand: prost's derive keeps a
//! `string` in a `String` and `bytes` in a `Vec<u8>`, one heap allocation each per
//! decoded event (a comm and two socket addresses: most of a replay's allocations).
//! The bytes are those prost's derive wrote for the same fields (each field in tag
//! order, left out when it holds its default), so files are unchanged, and decoding
//! errors name the field as prost's do.

use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    bool, check_wire_type, decode_varint, encode_key, encode_varint, encoded_len_varint, fixed64,
    key_len, message, skip_field, uint32, uint64, DecodeContext, WireType,
};
use prost::{DecodeError, Message};

use super::{
    event, sniff, Addr, Comm, Event, Header, HttpRequestHead, HttpResponseHead, Sniff, Sock,
    SockIo, SseEvent,
};
use crate::ingest::record::EventBatch;

impl Event {
    /// The event as a batch's field 1.
    pub(crate) fn encode_in_batch(&self, out: &mut Vec<u8>) {
        put_nested(out, 1, |out| self.encode_vec(out));
    }

    /// The bytes `encode_raw` writes, into a vector: the I/O body's messages (the
    /// socket I/O, its socket and its sniff) are written before their lengths, which
    /// are filled in after, rather than computed ahead at every level they are nested
    /// in as prost's encoding does (a fifth of the recorder's instructions went to
    /// computing them).
    pub(crate) fn encode_vec(&self, out: &mut Vec<u8>) {
        self.encode_head(out);
        match &self.body {
            Some(event::Body::Io(io)) => put_nested(out, 11, |out| io.encode_vec(out)),
            Some(body) => body.encode(out),
            None => {}
        }
    }

    /// Fields 1 to 5: all but the body.
    fn encode_head(&self, buf: &mut impl BufMut) {
        if self.ts_ns != 0 {
            put_varint_field(buf, 1, self.ts_ns);
        }
        if self.pid != 0 {
            put_varint_field(buf, 2, u64::from(self.pid));
        }
        if self.tid != 0 {
            put_varint_field(buf, 3, u64::from(self.tid));
        }
        if self.cpu != 0 {
            put_varint_field(buf, 4, u64::from(self.cpu));
        }
        if !self.comm.is_empty() {
            encode_bytes(5, self.comm.as_bytes(), buf);
        }
    }
}

impl SockIo {
    /// The bytes prost's derive writes for it (fields in tag order, defaults left out),
    /// its socket and sniff written as `Event::encode_vec` writes nested messages.
    fn encode_vec(&self, out: &mut Vec<u8>) {
        // Every field named: one added to SockIo does not compile until written here.
        let SockIo {
            sock,
            dir,
            syscall,
            fd,
            bytes,
            captured,
            payload_fault,
            sniff,
        } = self;
        if let Some(sock) = sock {
            put_nested(out, 1, |out| sock.encode_raw(out));
        }
        if *dir != 0 {
            put_varint_field(out, 2, *dir as i64 as u64);
        }
        if *syscall != 0 {
            put_varint_field(out, 3, *syscall as i64 as u64);
        }
        if *fd != 0 {
            put_varint_field(out, 4, *fd as i64 as u64);
        }
        if *bytes != 0 {
            put_varint_field(out, 5, *bytes);
        }
        if *captured != 0 {
            put_varint_field(out, 6, u64::from(*captured));
        }
        if *payload_fault {
            put_varint_field(out, 7, 1);
        }
        if let Some(sniff) = sniff {
            put_nested(out, 8, |out| sniff.encode_raw(out));
        }
    }
}

impl EventBatch {
    /// What `encode` writes, into a vector, each event written by `Event::encode_vec`.
    pub(crate) fn encode_vec(&self, out: &mut Vec<u8>) {
        for event in &self.events {
            event.encode_in_batch(out);
        }
        EventBatch::encode_columns(&self.ts_deltas, &self.prints, out);
        for (tag, bytes) in [(4, &self.shapes), (5, &self.columns)] {
            if !bytes.is_empty() {
                prost::encoding::bytes::encode(tag, bytes, out);
            }
        }
    }

    /// Fields 2 and 3, the timestamps and prints, as `encode_vec` writes them.
    pub(crate) fn encode_columns(ts_deltas: &[u64], prints: &[u64], out: &mut Vec<u8>) {
        uint64::encode_packed(2, ts_deltas, out);
        prost::encoding::fixed64::encode_packed(3, prints, out);
    }
}

/// Varint field `tag` (an int32, uint32, uint64, bool or enum: int32s sign-extended to
/// 64 bits), as prost writes it, with the one-byte case taken without its loop.
fn put_varint_field(buf: &mut impl BufMut, tag: u32, value: u64) {
    put_varint(buf, u64::from(tag << 3)); // wire type 0
    put_varint(buf, value);
}

fn put_varint(buf: &mut impl BufMut, value: u64) {
    if value < 0x80 {
        buf.put_u8(value as u8);
    } else {
        encode_varint(value, buf);
    }
}

/// Field `tag`, a message that `body` writes, its length (a varint before it) filled
/// in once written: one byte is kept for it and the message moved along when it is
/// 128 bytes or more (an I/O with an HTTP head or several SSE events).
fn put_nested(out: &mut Vec<u8>, tag: u32, body: impl FnOnce(&mut Vec<u8>)) {
    put_varint(out, u64::from(tag << 3 | WireType::LengthDelimited as u32));
    let at = out.len();
    out.push(0);
    body(out);
    let end = out.len();
    let len = end - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
        return;
    }
    let width = encoded_len_varint(len as u64);
    out.resize(end + width - 1, 0);
    out.copy_within(at + 1..end, at + width);
    encode_varint(len as u64, &mut &mut out[at..at + width]);
}

impl Message for Event {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.encode_head(buf);
        if let Some(body) = &self.body {
            body.encode(buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |field| named("Event", field);
        match tag {
            1 => uint64::merge(wire_type, &mut self.ts_ns, buf, ctx).map_err(named("ts_ns")),
            2 => uint32::merge(wire_type, &mut self.pid, buf, ctx).map_err(named("pid")),
            3 => uint32::merge(wire_type, &mut self.tid, buf, ctx).map_err(named("tid")),
            4 => uint32::merge(wire_type, &mut self.cpu, buf, ctx).map_err(named("cpu")),
            5 => merge_text(wire_type, &mut self.comm, buf).map_err(named("comm")),
            10..=17 => {
                event::Body::merge(&mut self.body, tag, wire_type, buf, ctx).map_err(named("body"))
            }
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut len = 0;
        if self.ts_ns != 0 {
            len += uint64::encoded_len(1, &self.ts_ns);
        }
        if self.pid != 0 {
            len += uint32::encoded_len(2, &self.pid);
        }
        if self.tid != 0 {
            len += uint32::encoded_len(3, &self.tid);
        }
        if self.cpu != 0 {
            len += uint32::encoded_len(4, &self.cpu);
        }
        if !self.comm.is_empty() {
            len += bytes_len(5, self.comm.len());
        }
        len + self.body.as_ref().map_or(0, event::Body::encoded_len)
    }

    fn clear(&mut self) {
        *self = Event::default();
    }
}

impl Message for Sock {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.skaddr != 0 {
            uint64::encode(1, &self.skaddr, buf);
        }
        if !self.saddr.is_empty() {
            encode_bytes(2, &self.saddr, buf);
        }
        if self.sport != 0 {
            uint32::encode(3, &self.sport, buf);
        }
        if !self.daddr.is_empty() {
            encode_bytes(4, &self.daddr, buf);
        }
        if self.dport != 0 {
            uint32::encode(5, &self.dport, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |field| named("Sock", field);
        match tag {
            1 => uint64::merge(wire_type, &mut self.skaddr, buf, ctx).map_err(named("skaddr")),
            2 => merge_addr(wire_type, &mut self.saddr, buf).map_err(named("saddr")),
            3 => uint32::merge(wire_type, &mut self.sport, buf, ctx).map_err(named("sport")),
            4 => merge_addr(wire_type, &mut self.daddr, buf).map_err(named("daddr")),
            5 => uint32::merge(wire_type, &mut self.dport, buf, ctx).map_err(named("dport")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut len = 0;
        if self.skaddr != 0 {
            len += uint64::encoded_len(1, &self.skaddr);
        }
        if !self.saddr.is_empty() {
            len += bytes_len(2, self.saddr.len());
        }
        if self.sport != 0 {
            len += uint32::encoded_len(3, &self.sport);
        }
        if !self.daddr.is_empty() {
            len += bytes_len(4, self.daddr.len());
        }
        if self.dport != 0 {
            len += uint32::encoded_len(5, &self.dport);
        }
        len
    }

    fn clear(&mut self) {
        *self = Sock::default();
    }
}

/// As prost's derive wrote it when `sse` was a `Vec` (fields in tag order, defaults left
/// out, `prefix_prints` packed); `sse` is a `SmallVec` now, which the derive cannot read
/// into.
impl Message for Sniff {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        // Every field named: one added to Sniff does not compile until written here.
        let Sniff {
            fingerprint,
            kind,
            message_start,
            message_end,
            body_bytes,
            body_print,
            sse,
            unparsed,
            compressed,
            prefix_prints,
            h2_streams,
            h2_control_frames,
            h2_errors,
            h2_preface,
            limits,
        } = self;
        if *fingerprint != 0 {
            fixed64::encode(1, fingerprint, buf);
        }
        if let Some(kind) = kind {
            kind.encode(buf);
        }
        if *message_start {
            bool::encode(20, message_start, buf);
        }
        if *message_end {
            bool::encode(21, message_end, buf);
        }
        if *body_bytes != 0 {
            uint64::encode(22, body_bytes, buf);
        }
        if let Some(p) = body_print {
            message::encode(23, p, buf);
        }
        message::encode_repeated(24, sse, buf);
        if *unparsed {
            bool::encode(25, unparsed, buf);
        }
        if *compressed {
            bool::encode(26, compressed, buf);
        }
        fixed64::encode_packed(27, prefix_prints, buf);
        message::encode_repeated(28, h2_streams, buf);
        if *h2_control_frames != 0 {
            uint32::encode(29, h2_control_frames, buf);
        }
        if *h2_errors != 0 {
            uint32::encode(30, h2_errors, buf);
        }
        if *h2_preface {
            bool::encode(31, h2_preface, buf);
        }
        if *limits != 0 {
            uint32::encode(33, limits, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |field| named("Sniff", field);
        match tag {
            1 => fixed64::merge(wire_type, &mut self.fingerprint, buf, ctx)
                .map_err(named("fingerprint")),
            10..=12 => {
                sniff::Kind::merge(&mut self.kind, tag, wire_type, buf, ctx).map_err(named("kind"))
            }
            20 => bool::merge(wire_type, &mut self.message_start, buf, ctx)
                .map_err(named("message_start")),
            21 => bool::merge(wire_type, &mut self.message_end, buf, ctx)
                .map_err(named("message_end")),
            22 => uint64::merge(wire_type, &mut self.body_bytes, buf, ctx)
                .map_err(named("body_bytes")),
            23 => message::merge(
                wire_type,
                self.body_print.get_or_insert_with(Default::default),
                buf,
                ctx,
            )
            .map_err(named("body_print")),
            24 => {
                // As prost's `message::merge_repeated`, into the inline vector.
                check_wire_type(WireType::LengthDelimited, wire_type).map_err(named("sse"))?;
                let mut e = SseEvent::default();
                message::merge(WireType::LengthDelimited, &mut e, buf, ctx)
                    .map_err(named("sse"))?;
                self.sse.push(e);
                Ok(())
            }
            25 => bool::merge(wire_type, &mut self.unparsed, buf, ctx).map_err(named("unparsed")),
            26 => {
                bool::merge(wire_type, &mut self.compressed, buf, ctx).map_err(named("compressed"))
            }
            27 => fixed64::merge_repeated(wire_type, &mut self.prefix_prints, buf, ctx)
                .map_err(named("prefix_prints")),
            28 => message::merge_repeated(wire_type, &mut self.h2_streams, buf, ctx)
                .map_err(named("h2_streams")),
            29 => uint32::merge(wire_type, &mut self.h2_control_frames, buf, ctx)
                .map_err(named("h2_control_frames")),
            30 => {
                uint32::merge(wire_type, &mut self.h2_errors, buf, ctx).map_err(named("h2_errors"))
            }
            31 => {
                bool::merge(wire_type, &mut self.h2_preface, buf, ctx).map_err(named("h2_preface"))
            }
            33 => uint32::merge(wire_type, &mut self.limits, buf, ctx).map_err(named("limits")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let s = self;
        let flag = |tag, on: bool| if on { key_len(tag) + 1 } else { 0 };
        let varint = |tag, v: u64| {
            if v != 0 {
                key_len(tag) + encoded_len_varint(v)
            } else {
                0
            }
        };
        (if s.fingerprint != 0 {
            key_len(1) + 8
        } else {
            0
        }) + s.kind.as_ref().map_or(0, sniff::Kind::encoded_len)
            + flag(20, s.message_start)
            + flag(21, s.message_end)
            + varint(22, s.body_bytes)
            + s.body_print
                .as_ref()
                .map_or(0, |p| message::encoded_len(23, p))
            + message::encoded_len_repeated(24, &s.sse)
            + flag(25, s.unparsed)
            + flag(26, s.compressed)
            + fixed64::encoded_len_packed(27, &s.prefix_prints)
            + message::encoded_len_repeated(28, &s.h2_streams)
            + varint(29, u64::from(s.h2_control_frames))
            + varint(30, u64::from(s.h2_errors))
            + flag(31, s.h2_preface)
            + varint(33, u64::from(s.limits))
    }

    /// As `Sniff::default()`, but that its vectors keep their room (as prost's derive
    /// clears repeated fields): a recycled event's sniff is cleared so, then filled.
    /// Field by field (a default written whole and the old one dropped cost twice the
    /// instructions); the tests' `full` sniff, every field set, checks that none is
    /// missed.
    fn clear(&mut self) {
        self.fingerprint = 0;
        self.kind = None;
        self.message_start = false;
        self.message_end = false;
        self.body_bytes = 0;
        self.body_print = None;
        self.sse.clear();
        self.unparsed = false;
        self.compressed = false;
        self.prefix_prints.clear();
        self.h2_streams.clear();
        self.h2_control_frames = 0;
        self.h2_errors = 0;
        self.h2_preface = false;
        self.limits = 0;
    }
}

/// As prost's derive wrote it when its fields were `String`s: the name unless empty,
/// the value whenever it is set (an optional field, even empty).
impl Message for Header {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.name.is_empty() {
            encode_bytes(1, self.name.as_bytes(), buf);
        }
        if let Some(value) = &self.value {
            encode_bytes(2, value.as_bytes(), buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |field| named("Header", field);
        match tag {
            1 => merge_text(wire_type, &mut self.name, buf).map_err(named("name")),
            2 => merge_text(
                wire_type,
                self.value.get_or_insert_with(Default::default),
                buf,
            )
            .map_err(named("value")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        (if self.name.is_empty() {
            0
        } else {
            bytes_len(1, self.name.len())
        }) + self.value.as_ref().map_or(0, |v| bytes_len(2, v.len()))
    }

    fn clear(&mut self) {
        *self = Header::default();
    }
}

/// A string field as prost's derive writes a `String`: left out when empty.
fn encode_text(tag: u32, text: &str, buf: &mut impl BufMut) {
    if !text.is_empty() {
        encode_bytes(tag, text.as_bytes(), buf);
    }
}

fn text_len(tag: u32, text: &str) -> usize {
    if text.is_empty() {
        0
    } else {
        bytes_len(tag, text.len())
    }
}

/// A bool field as prost's derive writes it: left out when false.
fn encode_flag(tag: u32, on: bool, buf: &mut impl BufMut) {
    if on {
        bool::encode(tag, &on, buf);
    }
}

fn flag_len(tag: u32, on: bool) -> usize {
    if on {
        key_len(tag) + 1
    } else {
        0
    }
}

/// As prost's derive wrote it when its texts were `String`s.
impl Message for HttpRequestHead {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_text(1, &self.method, buf);
        encode_text(2, &self.path, buf);
        encode_flag(3, self.has_query, buf);
        encode_text(4, &self.version, buf);
        message::encode_repeated(5, &self.headers, buf);
        encode_flag(6, self.complete, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |field| named("HttpRequestHead", field);
        match tag {
            1 => merge_text(wire_type, &mut self.method, buf).map_err(named("method")),
            2 => merge_text(wire_type, &mut self.path, buf).map_err(named("path")),
            3 => bool::merge(wire_type, &mut self.has_query, buf, ctx).map_err(named("has_query")),
            4 => merge_text(wire_type, &mut self.version, buf).map_err(named("version")),
            5 => message::merge_repeated(wire_type, &mut self.headers, buf, ctx)
                .map_err(named("headers")),
            6 => bool::merge(wire_type, &mut self.complete, buf, ctx).map_err(named("complete")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        text_len(1, &self.method)
            + text_len(2, &self.path)
            + flag_len(3, self.has_query)
            + text_len(4, &self.version)
            + message::encoded_len_repeated(5, &self.headers)
            + flag_len(6, self.complete)
    }

    fn clear(&mut self) {
        *self = HttpRequestHead::default();
    }
}

/// As prost's derive wrote it when its version was a `String`.
impl Message for HttpResponseHead {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_text(1, &self.version, buf);
        if self.status != 0 {
            uint32::encode(2, &self.status, buf);
        }
        message::encode_repeated(3, &self.headers, buf);
        encode_flag(4, self.complete, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let named = |field| named("HttpResponseHead", field);
        match tag {
            1 => merge_text(wire_type, &mut self.version, buf).map_err(named("version")),
            2 => uint32::merge(wire_type, &mut self.status, buf, ctx).map_err(named("status")),
            3 => message::merge_repeated(wire_type, &mut self.headers, buf, ctx)
                .map_err(named("headers")),
            4 => bool::merge(wire_type, &mut self.complete, buf, ctx).map_err(named("complete")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        text_len(1, &self.version)
            + (if self.status != 0 {
                uint32::encoded_len(2, &self.status)
            } else {
                0
            })
            + message::encoded_len_repeated(3, &self.headers)
            + flag_len(4, self.complete)
    }

    fn clear(&mut self) {
        *self = HttpResponseHead::default();
    }
}

/// An error with the field it was met in, as prost's derive says it.
fn named(message: &'static str, field: &'static str) -> impl FnOnce(DecodeError) -> DecodeError {
    move |mut e| {
        e.push(message, field);
        e
    }
}

fn encode_bytes(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

fn bytes_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A length-delimited field's length, checked against what `buf` holds.
fn field_len(wire_type: WireType, buf: &mut impl Buf) -> Result<usize, DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        return Err(DecodeError::new("buffer underflow"));
    }
    Ok(len as usize)
}

/// As prost's `bytes::merge`: the field's bytes replace the address.
fn merge_addr(wire_type: WireType, addr: &mut Addr, buf: &mut impl Buf) -> Result<(), DecodeError> {
    let len = field_len(wire_type, buf)?;
    *addr = Addr::zeroed(len);
    buf.copy_to_slice(addr);
    Ok(())
}

/// As prost's `string::merge` (a comm, a header's name or value): the field's text
/// replaces the string; bytes that are not UTF-8 leave it empty and are an error.
fn merge_text(wire_type: WireType, out: &mut Comm, buf: &mut impl Buf) -> Result<(), DecodeError> {
    out.clear();
    let len = field_len(wire_type, buf)?;
    let mut bytes = smallvec::SmallVec::<[u8; 32]>::from_elem(0, len);
    buf.copy_to_slice(&mut bytes);
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| DecodeError::new("invalid string value: data is not UTF-8 encoded"))?;
    out.push_str(text);
    Ok(())
}

#[cfg(test)]
mod tests;
