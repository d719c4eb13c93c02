//! A message body's content, whatever framed it (HTTP/1.x framing in `stream`,
//! HTTP/2 DATA frames in `h2`): byte counts, request and prefix prints, SSE events.
//! Its own file so that both framers use it and neither imports the other.

use std::io::Write;

use flate2::write::GzDecoder;

use super::limits::{Limit, MAX_INFLATED_BYTES};
use super::sse::SseSplitter;
use super::{fnv_extend, http, FNV_OFFSET};
use crate::ingest::model::{BodyPrint, Header, Sniff};

/// Request bodies are identified by a hash of this many first bytes plus their length.
const BODY_PRINT_BYTES: usize = 1024;
/// Request bodies also carry the hash of every whole `PREFIX_STEP` of their first
/// `PREFIX_BYTES`: two prompts that share a prefix (a system prompt) share those.
const PREFIX_STEP: usize = 1024;
const PREFIX_BYTES: usize = 64 << 10;
/// Compressed bytes inflated at a time: deflate expands at most ~1032x, so one step
/// makes at most ~264 KiB, and the limit is checked between steps.
const INFLATE_STEP: usize = 256;

/// What a message body's content feeds, whatever framed it (HTTP/1.x framing or
/// HTTP/2 DATA frames): byte counts, the request print and prefix prints, and
/// the SSE events of an event stream.
#[derive(Debug, Default)]
pub(super) struct BodyContent {
    sse: Option<SseSplitter>,
    /// A gzip-encoded event stream, inflated to read its events (gateways compress
    /// SSE; the timing of what they let through is the point).
    inflate: Option<Box<GzDecoder<Vec<u8>>>>,
    /// Bytes inflated so far (see `MAX_INFLATED_BYTES`).
    inflated: u64,
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
        let content_type = http::header(headers, "content-type").unwrap_or_default();
        let ndjson = content_type.starts_with("application/x-ndjson");
        let event_stream = ndjson || content_type.starts_with("text/event-stream");
        let splitter = if ndjson {
            SseSplitter::ndjson
        } else {
            SseSplitter::new
        };
        let content = BodyContent {
            sse: (event_stream && (gzip || !compressed)).then(splitter),
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

    /// Whether its SSE events are being read.
    pub(super) fn is_event_stream(&self) -> bool {
        self.sse.is_some()
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
            count(&mut self.seen, out, p.held.len() as u64);
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
                count(&mut self.seen, out, held.len() as u64);
            }
            count(&mut self.seen, out, content.len() as u64);
            return;
        }
        count(&mut self.seen, out, content.len() as u64);
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
                let mut stop = false;
                for piece in content.chunks(INFLATE_STEP) {
                    if gz.write_all(piece).and_then(|()| gz.flush()).is_err() {
                        // Not gzip after all, or corrupt: its events stay unseen.
                        stop = true;
                        break;
                    }
                    self.inflated += gz.get_ref().len() as u64;
                    if self.inflated > MAX_INFLATED_BYTES {
                        out.hit(Limit::Inflate);
                        stop = true;
                        break;
                    }
                    let events = past_gap(&mut self.gap, gz.get_ref());
                    splitter.feed_into(events, &mut out.sse);
                    gz.get_mut().clear();
                }
                if splitter.take_cut() {
                    out.hit(Limit::SseEvent);
                }
                if stop {
                    self.sse = None;
                    self.inflate = None;
                }
            }
            (Some(splitter), None) => {
                splitter.feed_into(past_gap(&mut self.gap, content), &mut out.sse);
                if splitter.take_cut() {
                    out.hit(Limit::SseEvent);
                }
            }
            (None, _) => {}
        }
    }

    /// `n` content bytes went uncaptured (their place is known).
    pub(super) fn skipped(&mut self, n: u64, out: &mut Sniff) {
        self.segment_end(out); // a segment start still held is undecidable now
        count(&mut self.seen, out, n);
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

/// Counts `n` content bytes in the body's total and this I/O's sniff. Saturating:
/// uncaptured counts are what I/O events claim, and they add up over a whole body.
fn count(seen: &mut u64, out: &mut Sniff, n: u64) {
    *seen = seen.saturating_add(n);
    out.body_bytes = out.body_bytes.saturating_add(n);
}

/// Whether body bytes start like an SSE field; `None` while too short to tell.
pub(super) fn sse_start(b: &[u8]) -> Option<bool> {
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
