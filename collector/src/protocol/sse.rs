//! Server-sent events (and newline-delimited JSON, Ollama's stream) over a byte
//! stream that arrives in arbitrary pieces. Only what identifies an event leaves
//! here: a fingerprint of its data and its verdict by `shape` (a token, of which API,
//! choice and kind; the end; anything else).

use super::limits::MAX_SSE_EVENT as MAX_EVENT;
use super::print;
use super::shape::{self, Verdict};
use crate::ingest::model::{SseEvent, SseEvents, SseKind};

#[derive(Debug, Default)]
pub struct SseSplitter {
    /// Each line is an event (`application/x-ndjson`) rather than each blank-line-ended
    /// block of `data:` lines.
    ndjson: bool,
    /// The current event's bytes so far (bounded by MAX_EVENT).
    event: Vec<u8>,
    /// Bytes of the current event beyond MAX_EVENT (not kept).
    overflow: usize,
    /// An event longer than MAX_EVENT ended since `take_cut` last asked.
    cut: bool,
    /// Scratch for an event's data when it spans several `data:` lines.
    data: Vec<u8>,
    /// The previous byte was a line feed (a second one ends the event).
    at_line_start: bool,
    /// A carriage return was the last byte; a following LF belongs to it.
    after_cr: bool,
}

impl SseSplitter {
    /// Feeds body bytes; returns the events that ended inside them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut done = SseEvents::new();
        self.feed_into(bytes, &mut done);
        done.into_vec()
    }

    /// [`SseSplitter::feed`] appending to `done`, whose room the caller keeps.
    pub fn feed_into(&mut self, bytes: &[u8], done: &mut SseEvents) {
        let mut rest = bytes;
        while let Some((&b, after)) = rest.split_first() {
            // An event that begins and ends inside these bytes (nearly all do) is read
            // where it lies.
            if self.at_line_start && self.event.is_empty() && self.overflow == 0 {
                if let Some((event, used)) = whole_event(rest, self.ndjson) {
                    if self.ndjson {
                        verdicts(event, done);
                    } else {
                        finish(event, &mut self.data, done);
                    }
                    rest = &rest[used..];
                    continue;
                }
            }
            // A run of bytes inside a line is kept as it is (most of a body is).
            let run = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
            if run > 0 {
                let keep = run.min(MAX_EVENT.saturating_sub(self.event.len()));
                self.event.extend_from_slice(&rest[..keep]);
                self.overflow += run - keep;
                self.after_cr = false;
                self.at_line_start = false;
                rest = &rest[run..];
                continue;
            }
            rest = after;
            if b == b'\n' && self.after_cr {
                self.after_cr = false;
                continue; // CRLF counts as one line end
            }
            self.after_cr = b == b'\r';
            if self.at_line_start || self.ndjson {
                self.cut |= self.overflow > 0;
                if !self.event.is_empty() || self.overflow > 0 {
                    if self.ndjson {
                        verdicts(&self.event, done);
                    } else {
                        finish(&self.event, &mut self.data, done);
                    }
                }
                self.event.clear();
                self.overflow = 0;
                self.at_line_start = true;
                continue;
            }
            if self.event.len() < MAX_EVENT {
                self.event.push(b'\n');
            } else {
                self.overflow += 1;
            }
            self.at_line_start = true;
        }
    }

    /// Whether an event longer than MAX_EVENT ended since the last call
    /// (`Limit::SseEvent`).
    pub fn take_cut(&mut self) -> bool {
        std::mem::take(&mut self.cut)
    }

    /// Drops a partial event (the stream lost bytes).
    pub fn reset(&mut self) {
        *self = SseSplitter {
            at_line_start: true,
            ndjson: self.ndjson,
            ..Default::default()
        };
    }
}

impl SseSplitter {
    pub fn new() -> Self {
        SseSplitter {
            at_line_start: true,
            ..Default::default()
        }
    }

    /// Newline-delimited JSON: one event per line.
    pub fn ndjson() -> Self {
        SseSplitter {
            ndjson: true,
            ..SseSplitter::new()
        }
    }
}

/// The event at the start of `bytes` when all of it is there, with the bytes it takes
/// (its blank line, or its line end for NDJSON): not empty, no longer than MAX_EVENT,
/// LF line ends only (anything else is left to the byte-wise path).
fn whole_event(bytes: &[u8], ndjson: bool) -> Option<(&[u8], usize)> {
    let (len, used) = if ndjson {
        let end = memchr::memchr(b'\n', bytes)?;
        (end, end + 1)
    } else {
        let end = memchr::memmem::find(bytes, b"\n\n")?;
        (end, end + 2)
    };
    let event = &bytes[..len];
    (len > 0 && len <= MAX_EVENT && memchr::memchr(b'\r', event).is_none()).then_some((event, used))
}

/// An event's lines -> its data (the `data:` lines joined by LF) -> what it is, onto
/// `done`. One `data:` line (what every streaming API sends) is read in place; several
/// are joined in `joined`.
fn finish(event: &[u8], joined: &mut Vec<u8>, done: &mut SseEvents) {
    if memchr::memchr(b'\n', event).is_none() {
        if let Some(data) = event.strip_prefix(b"data:") {
            return verdicts(data.strip_prefix(b" ").unwrap_or(data), done);
        }
    }
    let mut lines = event
        .split(|b| *b == b'\n')
        .filter_map(|line| line.strip_prefix(b"data:"))
        .map(|rest| rest.strip_prefix(b" ").unwrap_or(rest));
    let Some(first) = lines.next() else {
        done.push(SseEvent {
            fingerprint: print(&[]),
            kind: SseKind::Other as i32,
            ..Default::default()
        });
        return;
    };
    let Some(second) = lines.next() else {
        return verdicts(first, done);
    };
    joined.clear();
    joined.extend_from_slice(first);
    for line in std::iter::once(second).chain(lines) {
        joined.push(b'\n');
        joined.extend_from_slice(line);
    }
    verdicts(joined, done)
}

/// One event's data -> its verdicts onto `done`, each carrying the data's print.
fn verdicts(data: &[u8], done: &mut SseEvents) {
    let print = print(data);
    let event = |v: Verdict| SseEvent {
        fingerprint: print,
        kind: v.kind as i32,
        api: v.api as i32,
        choice: v.choice,
        token: v.token as i32,
        text_print: v.text,
    };
    if let Some(v) = memo::get(print, data.len()) {
        return done.push(event(v));
    }
    let found = shape::classify(data);
    if let [v] = found.as_slice() {
        memo::put(print, data.len(), *v);
    }
    done.extend(found.into_iter().map(event));
}

/// Recent single verdicts by their event's fingerprint and length. An event crosses
/// every observation point with the same data (the engine's write, the proxy's read,
/// its write, TLS plaintext), so its JSON is read once, not once per hop. The verdict
/// is a function of the data alone; a slot is overwritten by the next event that
/// hashes to it.
mod memo {
    use std::cell::RefCell;

    use super::shape::Verdict;

    const SLOTS: usize = 4096;

    type Slot = Option<(u64, usize, Verdict)>;

    thread_local! {
        static SEEN: RefCell<Vec<Slot>> = RefCell::new(vec![None; SLOTS]);
    }

    pub(super) fn get(print: u64, len: usize) -> Option<Verdict> {
        SEEN.with_borrow(|seen| match seen[print as usize % SLOTS] {
            Some((p, l, v)) if p == print && l == len => Some(v),
            _ => None,
        })
    }

    pub(super) fn put(print: u64, len: usize, verdict: Verdict) {
        SEEN.with_borrow_mut(|seen| seen[print as usize % SLOTS] = Some((print, len, verdict)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &[u8] =
        b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"text\":\"Hello\"}]}\n\n\
data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"text\":\" world\"}]}\r\n\r\n\
: keep-alive comment\n\n\
data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n\
data: [DONE]\n\n";

    fn kinds(events: &[SseEvent]) -> Vec<SseKind> {
        events.iter().map(|e| e.kind()).collect()
    }

    #[test]
    fn whole_stream() {
        let ev = SseSplitter::new().feed(STREAM);
        assert_eq!(
            kinds(&ev),
            vec![
                SseKind::Choice,
                SseKind::Choice,
                SseKind::Other,
                SseKind::Data,
                SseKind::Done
            ]
        );
        assert_ne!(
            ev[0].fingerprint, ev[1].fingerprint,
            "different tokens, different fingerprints"
        );
    }

    #[test]
    fn data_lines_join_with_a_line_feed_and_long_events_are_cut() {
        let ev = SseSplitter::new().feed(b"event: x\r\ndata: a\r\ndata:b\r\n\r\n");
        assert_eq!(ev.len(), 1, "one event");
        assert_eq!(ev[0].fingerprint, print(b"a\nb"), "data lines joined");
        let ev = SseSplitter::new().feed(b"id: 1\n\n");
        assert_eq!(
            (kinds(&ev), ev[0].fingerprint),
            (vec![SseKind::Other], print(b"")),
            "an event without data"
        );
        let mut long = b"data: ".to_vec();
        long.resize(MAX_EVENT + 100, b'x');
        long.extend_from_slice(b"\n\ndata: [DONE]\n\n");
        let mut s = SseSplitter::new();
        let ev = s.feed(&long);
        assert_eq!(kinds(&ev), vec![SseKind::Data, SseKind::Done]);
        assert!(s.take_cut(), "the long event is named as cut");
        assert!(!s.take_cut(), "once");
    }

    #[test]
    fn every_split_point_gives_the_same_events() {
        let whole = SseSplitter::new().feed(STREAM);
        for cut in 0..=STREAM.len() {
            let mut s = SseSplitter::new();
            let mut ev = s.feed(&STREAM[..cut]);
            ev.extend(s.feed(&STREAM[cut..]));
            assert_eq!(ev, whole, "split at byte {cut}");
        }
        // And one byte at a time.
        let mut s = SseSplitter::new();
        let ev: Vec<SseEvent> = STREAM
            .iter()
            .flat_map(|b| s.feed(std::slice::from_ref(b)))
            .collect();
        assert_eq!(ev, whole, "byte-by-byte");
    }
}
