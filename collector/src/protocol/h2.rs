//! HTTP/2 framing (RFC 9113) for one direction of one connection, read across
//! its I/Os: frames split anywhere, header blocks reassembled and HPACK-decoded,
//! DATA streamed to each stream's body handling as it arrives. Each stream an
//! I/O touches gets an [`H2StreamSniff`]; frames of no request are counted.

use std::collections::{BTreeMap, HashMap};

use super::content::BodyContent;
use super::hpack;
use super::http;
use super::limits::Limit;
pub use super::limits::{MAX_H2_BLOCK as MAX_BLOCK, MAX_H2_STREAMS as MAX_STREAMS};
use crate::ingest::model::{sniff, H2StreamSniff, Sniff};

/// The client connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
mod detect;
pub use detect::{
    looks_like_frames, starts_client_preface, starts_server_preface, too_short_for_client_preface,
    too_short_for_server_preface,
};

const FRAME_HEADER: usize = 9;
/// A header-carrying frame's payload beyond its fragment: pad length and padding,
/// priority fields, promised stream id.
const BLOCK_FRAME_EXTRA: usize = 1 + 255 + 5 + 4;
/// SETTINGS_MAX_FRAME_SIZE's initial value: what nearly every peer keeps.
const DEFAULT_MAX_FRAME: u32 = 16 << 10;

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PRIORITY: u8 = 2;
const RST_STREAM: u8 = 3;
const SETTINGS: u8 = 4;
const PUSH_PROMISE: u8 = 5;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const WINDOW_UPDATE: u8 = 8;
const CONTINUATION: u8 = 9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY_FLAG: u8 = 0x20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameHead {
    len: u32,
    kind: u8,
    flags: u8,
    stream: u32,
    /// The reserved bit of the stream id: ignored on receipt, but never set by real peers.
    reserved: bool,
}

impl FrameHead {
    fn read(b: &[u8]) -> Option<FrameHead> {
        let b: &[u8; FRAME_HEADER] = b.get(..FRAME_HEADER)?.try_into().ok()?;
        let id = u32::from_be_bytes([b[5], b[6], b[7], b[8]]);
        Some(FrameHead {
            len: u32::from_be_bytes([0, b[0], b[1], b[2]]),
            kind: b[3],
            flags: b[4],
            stream: id & 0x7fff_ffff,
            reserved: id & 0x8000_0000 != 0,
        })
    }

    fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Length and stream rules of a known frame type (RFC 9113 section 6).
    fn valid(&self) -> bool {
        let len = self.len;
        let on_zero = self.stream == 0;
        match self.kind {
            DATA | HEADERS | CONTINUATION | PUSH_PROMISE => !on_zero,
            PRIORITY => !on_zero && len == 5,
            RST_STREAM => !on_zero && len == 4,
            SETTINGS => on_zero && len.is_multiple_of(6) && (!self.has(ACK) || len == 0),
            PING => on_zero && len == 8,
            GOAWAY => on_zero && len >= 8,
            WINDOW_UPDATE => len == 4,
            _ => false,
        }
    }

    /// Whether a real peer would send it: valid, no reserved bit, only defined
    /// flags. Stricter than decoding needs; used to find frames in unknown bytes.
    fn plausible(&self) -> bool {
        let defined = match self.kind {
            DATA => END_STREAM | PADDED,
            HEADERS => END_STREAM | END_HEADERS | PADDED | PRIORITY_FLAG,
            SETTINGS | PING => ACK,
            PUSH_PROMISE => END_HEADERS | PADDED,
            CONTINUATION => END_HEADERS,
            _ => 0,
        };
        self.valid() && !self.reserved && self.flags & !defined == 0
    }
}

/// One direction of an HTTP/2 connection.
pub struct H2Conn {
    hpack: hpack::Decoder,
    /// Bytes of the client preface matched so far (all of it when none is expected).
    preface_at: usize,
    frame: Frame,
    /// A header block waiting for its CONTINUATION frames.
    block: Option<PendingBlock>,
    streams: BTreeMap<u32, H2Stream>,
    /// False once uncaptured bytes cut a frame header or a header block: the next
    /// I/O that starts with frames resynchronises.
    synced: bool,
}

/// Header values and body bytes are secrets: only the shape is printed.
impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Conn")
            .field("hpack", &self.hpack)
            .field("streams", &self.streams.keys().collect::<Vec<_>>())
            .field("block_pending", &self.block.is_some())
            .field("synced", &self.synced)
            .finish()
    }
}

#[derive(Default)]
enum Frame {
    /// Reading a frame header: its bytes so far.
    #[default]
    Header,
    PartialHeader(Vec<u8>),
    Data(DataFrame),
    /// A header-carrying frame, gathered whole (it is bounded) and read at its end.
    Block(FrameHead, Vec<u8>),
    /// Payload bytes left of a frame that is counted or ignored.
    Skip(u32),
}

struct DataFrame {
    stream: u32,
    end_stream: bool,
    /// PADDED and its pad length not read yet: `content` still includes the padding.
    pad_len_pending: bool,
    content: u32,
    pad: u32,
}

struct PendingBlock {
    stream: u32,
    end_stream: bool,
    push: bool,
    fragments: Vec<u8>,
    /// Over the limit or unreadable: its CONTINUATIONs are skipped.
    dropped: bool,
}

/// What is known of one stream in this direction.
struct H2Stream {
    /// A head (any, 1xx included) was reported: message_start was given.
    head_seen: bool,
    /// The request or final response head was read: a later HEADERS is trailers.
    head_final: bool,
    /// Until a head says what the body is, it is read as one joined part-way.
    body: BodyContent,
}

impl Default for H2Stream {
    fn default() -> Self {
        H2Stream {
            head_seen: false,
            head_final: false,
            body: BodyContent::attached(),
        }
    }
}

/// This I/O's per-stream entries, found by stream id.
struct Io<'a> {
    out: &'a mut Sniff,
    index: HashMap<u32, usize>,
}

impl<'a> Io<'a> {
    fn new(out: &'a mut Sniff) -> Self {
        let index = out
            .h2_streams
            .iter()
            .enumerate()
            .map(|(i, s)| (s.stream_id, i))
            .collect();
        Io { out, index }
    }

    fn entry(&mut self, stream_id: u32) -> &mut H2StreamSniff {
        let streams = &mut self.out.h2_streams;
        let i = *self.index.entry(stream_id).or_insert_with(|| {
            streams.push(H2StreamSniff {
                stream_id,
                sniff: Some(Sniff::default()),
                ..Default::default()
            });
            streams.len() - 1
        });
        &mut streams[i]
    }

    fn sniff(&mut self, stream_id: u32) -> &mut Sniff {
        self.entry(stream_id)
            .sniff
            .get_or_insert_with(Sniff::default)
    }

    fn error(&mut self) {
        self.out.h2_errors += 1;
    }
}

impl H2Conn {
    /// A client stream that opened with the preface (its first bytes are checked).
    pub fn client() -> Self {
        H2Conn {
            preface_at: 0,
            ..H2Conn::server()
        }
    }

    /// A server stream seen from its first SETTINGS: the whole HPACK context is known.
    pub fn server() -> Self {
        H2Conn {
            hpack: hpack::Decoder::new(),
            preface_at: PREFACE.len(),
            frame: Frame::Header,
            block: None,
            streams: BTreeMap::new(),
            synced: true,
        }
    }

    /// A connection joined part-way (the recording began after it opened).
    pub fn joined_mid() -> Self {
        H2Conn {
            hpack: hpack::Decoder::joined_mid(),
            ..H2Conn::server()
        }
    }

    /// Reads captured bytes; `cut` says whether bytes of this I/O go uncaptured after them.
    pub fn feed(&mut self, mut bytes: &[u8], cut: bool, out: &mut Sniff) {
        if !self.synced {
            if !looks_like_frames(bytes, cut) {
                out.unparsed = true;
                return;
            }
            self.synced = true;
        }
        let mut io = Io::new(out);
        if self.preface_at < PREFACE.len() {
            let n = (PREFACE.len() - self.preface_at).min(bytes.len());
            if bytes[..n] != PREFACE[self.preface_at..self.preface_at + n] {
                io.error();
                self.lose_sync(&mut io);
                return;
            }
            self.preface_at += n;
            bytes = &bytes[n..];
        }
        while !bytes.is_empty() && self.synced {
            bytes = match std::mem::take(&mut self.frame) {
                Frame::Header => self.header(Vec::new(), bytes, &mut io),
                Frame::PartialHeader(partial) => self.header(partial, bytes, &mut io),
                Frame::Data(d) => self.data(d, bytes, &mut io),
                Frame::Block(head, buf) => self.gather(head, buf, bytes, &mut io),
                Frame::Skip(left) => {
                    let n = (left as usize).min(bytes.len());
                    self.frame = skip_left(left - n as u32);
                    &bytes[n..]
                }
            };
        }
    }

    /// `n` bytes went uncaptured: kept in step when they fall inside a DATA payload
    /// or a skipped frame, else framing is lost until frames start an I/O again.
    pub fn skip(&mut self, n: u64, out: &mut Sniff) {
        if !self.synced || n == 0 {
            return;
        }
        let mut io = Io::new(out);
        if self.preface_at < PREFACE.len() {
            self.lose_sync(&mut io);
            return;
        }
        let rest = match std::mem::take(&mut self.frame) {
            Frame::Skip(left) => {
                let k = n.min(u64::from(left)) as u32;
                self.frame = skip_left(left - k);
                n - u64::from(k)
            }
            Frame::Data(mut d) if !d.pad_len_pending => {
                let k = n.min(u64::from(d.content)) as u32;
                if k > 0 {
                    self.content_skipped(d.stream, k, &mut io);
                }
                d.content -= k;
                let p = (n - u64::from(k)).min(u64::from(d.pad)) as u32;
                d.pad -= p;
                let rest = n - u64::from(k) - u64::from(p);
                self.data_progress(d, &mut io);
                rest
            }
            // A frame header, a pad length or a header block cut: the place is lost.
            _ => n,
        };
        if rest > 0 {
            self.lose_sync(&mut io);
        }
    }

    fn header<'b>(&mut self, mut partial: Vec<u8>, bytes: &'b [u8], io: &mut Io) -> &'b [u8] {
        let take = (FRAME_HEADER - partial.len()).min(bytes.len());
        partial.extend_from_slice(&bytes[..take]);
        match FrameHead::read(&partial) {
            Some(head) => self.begin(head, io),
            None => self.frame = Frame::PartialHeader(partial),
        }
        &bytes[take..]
    }

    /// A frame header was read: decide how its payload is read.
    fn begin(&mut self, head: FrameHead, io: &mut Io) {
        // A header block in progress admits only its own CONTINUATIONs (section 6.10).
        if let Some(block) = &self.block {
            if head.kind != CONTINUATION || head.stream != block.stream {
                io.error();
                self.drop_block();
            }
        }
        let valid = head.valid();
        self.frame = skip_left(head.len);
        match head.kind {
            _ if !valid => io.error(), // unknown type or bad length: skipped
            DATA => self.begin_data(head, io),
            HEADERS | PUSH_PROMISE => {
                if head.kind == PUSH_PROMISE {
                    io.out.h2_control_frames += 1;
                }
                if head.len as usize > MAX_BLOCK + BLOCK_FRAME_EXTRA {
                    self.oversized(head, io);
                } else {
                    self.gather_or_finish(head, Vec::new(), io);
                }
            }
            CONTINUATION => match &self.block {
                None => {
                    // Its HEADERS went unseen: what it inserts into the table is unknown.
                    io.error();
                    self.hpack.lose();
                }
                Some(b) if b.dropped => {
                    if head.has(END_HEADERS) {
                        self.block = None;
                    }
                }
                Some(b) if b.fragments.len() + head.len as usize > MAX_BLOCK => {
                    self.oversized(head, io)
                }
                Some(_) => self.gather_or_finish(head, Vec::new(), io),
            },
            RST_STREAM => {
                // Not an attachment: a peer resets streams it never sent on.
                io.entry(head.stream).reset = true;
                self.streams.remove(&head.stream);
            }
            _ => io.out.h2_control_frames += 1, // SETTINGS, PING, GOAWAY, WINDOW_UPDATE, PRIORITY
        }
    }

    fn begin_data(&mut self, head: FrameHead, io: &mut Io) {
        let padded = head.has(PADDED);
        if padded && head.len == 0 {
            io.error(); // no room for the pad length
            return;
        }
        let attached = self.stream(head.stream, io);
        if attached {
            io.entry(head.stream).attached_mid = true;
        }
        if let Some(st) = self.streams.get_mut(&head.stream) {
            st.body.segment_start(); // this frame's first bytes may show an event stream
        }
        let d = DataFrame {
            stream: head.stream,
            end_stream: head.has(END_STREAM),
            pad_len_pending: padded,
            content: head.len,
            pad: 0,
        };
        self.data_progress(d, io);
    }

    fn data<'b>(&mut self, mut d: DataFrame, mut bytes: &'b [u8], io: &mut Io) -> &'b [u8] {
        if d.pad_len_pending {
            let pad = u32::from(bytes[0]);
            bytes = &bytes[1..];
            d.content -= 1;
            d.pad_len_pending = false;
            if pad > d.content {
                io.error(); // padding longer than the payload: the frame is skipped
                self.frame = skip_left(d.content);
                return bytes;
            }
            d.content -= pad;
            d.pad = pad;
        }
        let n = (d.content as usize).min(bytes.len());
        if n > 0 {
            self.content(d.stream, &bytes[..n], io);
        }
        d.content -= n as u32;
        bytes = &bytes[n..];
        let p = if d.content == 0 {
            (d.pad as usize).min(bytes.len())
        } else {
            0
        };
        d.pad -= p as u32;
        self.data_progress(d, io);
        &bytes[p..]
    }

    /// Keeps reading the DATA frame, or ends it when nothing is left.
    fn data_progress(&mut self, d: DataFrame, io: &mut Io) {
        if d.pad_len_pending || d.content + d.pad > 0 {
            self.frame = Frame::Data(d);
            return;
        }
        self.frame = Frame::Header;
        if let Some(st) = self.streams.get_mut(&d.stream) {
            st.body.segment_end(io.sniff(d.stream));
        }
        if d.end_stream {
            self.end_stream(d.stream, io);
        }
    }

    /// DATA content bytes for `stream`.
    fn content(&mut self, stream: u32, bytes: &[u8], io: &mut Io) {
        let sniff = io.sniff(stream);
        match self.streams.get_mut(&stream) {
            Some(st) => st.body.feed(bytes, sniff),
            None => sniff.body_bytes += bytes.len() as u64, // dropped over the cap mid-frame
        }
    }

    /// `n` DATA content bytes of `stream` went uncaptured.
    fn content_skipped(&mut self, stream: u32, n: u32, io: &mut Io) {
        let sniff = io.sniff(stream);
        match self.streams.get_mut(&stream) {
            Some(st) => st.body.skipped(u64::from(n), sniff),
            None => sniff.body_bytes += u64::from(n),
        }
    }

    fn gather<'b>(
        &mut self,
        head: FrameHead,
        mut buf: Vec<u8>,
        bytes: &'b [u8],
        io: &mut Io,
    ) -> &'b [u8] {
        let n = (head.len as usize - buf.len()).min(bytes.len());
        buf.extend_from_slice(&bytes[..n]);
        self.gather_or_finish(head, buf, io);
        &bytes[n..]
    }

    fn gather_or_finish(&mut self, head: FrameHead, buf: Vec<u8>, io: &mut Io) {
        if buf.len() < head.len as usize {
            self.frame = Frame::Block(head, buf);
            return;
        }
        self.frame = Frame::Header;
        let fragment = match head.kind {
            CONTINUATION => Some(buf.as_slice()),
            _ => block_fragment(&head, &buf),
        };
        let Some(fragment) = fragment else {
            io.error(); // padding or priority fields longer than the frame
            self.drop_block();
            if !head.has(END_HEADERS) {
                self.block = Some(PendingBlock::dropped(head.stream));
            }
            return;
        };
        let block = match self.block.take() {
            Some(mut b) if head.kind == CONTINUATION => {
                b.fragments.extend_from_slice(fragment);
                b
            }
            _ => PendingBlock {
                stream: head.stream,
                end_stream: head.has(END_STREAM) && head.kind == HEADERS,
                push: head.kind == PUSH_PROMISE,
                fragments: fragment.to_vec(),
                dropped: false,
            },
        };
        if head.has(END_HEADERS) {
            self.header_block(block, io);
        } else {
            self.block = Some(block);
        }
    }

    /// A header block over the limit: dropped, with the table it may have changed.
    fn oversized(&mut self, head: FrameHead, io: &mut Io) {
        io.error();
        io.out.hit(Limit::H2HeaderBlock);
        self.drop_block();
        if !head.has(END_HEADERS) {
            self.block = Some(PendingBlock::dropped(head.stream));
        }
    }

    fn drop_block(&mut self) {
        self.block = None;
        self.hpack.lose();
    }

    /// A whole header block: the stream's head, trailers, or a promise.
    fn header_block(&mut self, block: PendingBlock, io: &mut Io) {
        let fields = self.hpack.decode(&block.fragments);
        io.out.h2_errors += fields.errors;
        if block.push {
            return; // decoded only to keep the table in step; a promise is not an exchange
        }
        let id = block.stream;
        let new = self.stream(id, io);
        let complete = fields.unknown == 0 && fields.errors == 0;
        let head = http::h2_head(&fields.fields, complete);
        let entry = io.entry(id);
        entry.unknown_headers += fields.unknown;
        let Some(st) = self.streams.get_mut(&id) else {
            return;
        };
        match head {
            Some(kind) if !st.head_final => {
                let sniff = entry.sniff.get_or_insert_with(Sniff::default);
                sniff.message_start |= !st.head_seen;
                st.head_seen = true;
                match &kind {
                    sniff::Kind::HttpRequest(req) => {
                        let length = http::header(&req.headers, "content-length")
                            .and_then(|v| v.parse::<u64>().ok());
                        st.head_final = true;
                        st.body = BodyContent::request(length);
                    }
                    sniff::Kind::HttpResponse(resp) if resp.status >= 200 => {
                        let (content, compressed) = BodyContent::response(&resp.headers);
                        st.head_final = true;
                        st.body = content;
                        sniff.compressed |= compressed && !block.end_stream;
                    }
                    _ => {} // 1xx: informational, the final head follows
                }
                sniff.kind = Some(kind);
            }
            Some(_) => io.error(), // a second head on one stream
            None if new => entry.attached_mid = true, // trailers, or a head we cannot read
            None => {}             // trailers
        }
        if block.end_stream {
            self.end_stream(id, io);
        }
    }

    /// Finds or creates `id`'s state; true when it is new (its start went unseen
    /// unless a head is read next). Over the cap, the oldest stream is dropped.
    fn stream(&mut self, id: u32, io: &mut Io) -> bool {
        if self.streams.contains_key(&id) {
            return false;
        }
        if self.streams.len() >= MAX_STREAMS {
            self.streams.pop_first();
            io.error();
            io.out.hit(Limit::H2Streams);
        }
        self.streams.insert(id, H2Stream::default());
        true
    }

    /// END_STREAM: the message ends; its state is released.
    fn end_stream(&mut self, id: u32, io: &mut Io) {
        let sniff = io.sniff(id);
        sniff.message_end = true;
        if let Some(mut st) = self.streams.remove(&id) {
            st.body.settle(true, sniff);
        }
    }

    /// Framing is lost: header blocks and the table with them, and the events in progress.
    fn lose_sync(&mut self, io: &mut Io) {
        io.out.unparsed = true;
        self.synced = false;
        self.frame = Frame::Header;
        self.preface_at = PREFACE.len();
        self.drop_block();
        for st in self.streams.values_mut() {
            st.body.lost();
        }
    }
}

impl PendingBlock {
    fn dropped(stream: u32) -> Self {
        PendingBlock {
            stream,
            end_stream: false,
            push: false,
            fragments: Vec::new(),
            dropped: true,
        }
    }
}

fn skip_left(left: u32) -> Frame {
    if left == 0 {
        Frame::Header
    } else {
        Frame::Skip(left)
    }
}

/// The header block fragment of a whole HEADERS or PUSH_PROMISE payload, or
/// `None` when its padding or fixed fields do not fit.
fn block_fragment<'b>(head: &FrameHead, payload: &'b [u8]) -> Option<&'b [u8]> {
    let mut p = payload;
    let mut pad = 0;
    if head.has(PADDED) {
        let (&n, rest) = p.split_first()?;
        pad = usize::from(n);
        p = rest;
    }
    if head.kind == HEADERS && head.has(PRIORITY_FLAG) {
        p = p.get(5..)?;
    }
    if head.kind == PUSH_PROMISE {
        p = p.get(4..)?; // the promised stream id
    }
    p.get(..p.len().checked_sub(pad)?)
}

#[cfg(test)]
#[path = "h2_tests.rs"]
mod tests;
