//! Server-sent events (and newline-delimited JSON, Ollama's stream) over a byte
//! stream that arrives in arbitrary pieces. Only what identifies an event leaves
//! here: a fingerprint of its data and its verdict by `shape` (a token, of which API,
//! choice and kind; the end; anything else).

use super::limits::MAX_SSE_EVENT as MAX_EVENT;
use super::{fingerprint, shape};
use crate::ingest::model::{SseEvent, SseKind};

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
    /// The previous byte was a line feed (a second one ends the event).
    at_line_start: bool,
    /// A carriage return was the last byte; a following LF belongs to it.
    after_cr: bool,
}

impl SseSplitter {
    /// Feeds body bytes; returns the events that ended inside them.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut done = Vec::new();
        for &b in bytes {
            if b == b'\n' && self.after_cr {
                self.after_cr = false;
                continue; // CRLF counts as one line end
            }
            self.after_cr = b == b'\r';
            let newline = b == b'\n' || b == b'\r';
            if newline && (self.at_line_start || self.ndjson) {
                self.cut |= self.overflow > 0;
                if !self.event.is_empty() || self.overflow > 0 {
                    if self.ndjson {
                        done.extend(verdicts(&self.event));
                    } else {
                        done.extend(finish(&self.event));
                    }
                }
                self.event.clear();
                self.overflow = 0;
                self.at_line_start = true;
                continue;
            }
            if self.event.len() < MAX_EVENT {
                self.event.push(if newline { b'\n' } else { b });
            } else {
                self.overflow += 1;
            }
            self.at_line_start = newline;
        }
        done
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

/// An event's lines -> its data (the `data:` lines joined by LF) -> what it is.
fn finish(event: &[u8]) -> Vec<SseEvent> {
    let mut data = Vec::new();
    let mut has_data = false;
    for line in event.split(|b| *b == b'\n') {
        if let Some(rest) = line.strip_prefix(b"data:") {
            if has_data {
                data.push(b'\n');
            }
            has_data = true;
            data.extend_from_slice(rest.strip_prefix(b" ").unwrap_or(rest));
        }
    }
    if !has_data {
        return vec![SseEvent {
            fingerprint: fingerprint(&data),
            kind: SseKind::Other as i32,
            ..Default::default()
        }];
    }
    verdicts(&data)
}

/// One event's data -> its verdicts, each carrying the data's fingerprint.
fn verdicts(data: &[u8]) -> Vec<SseEvent> {
    let print = fingerprint(data);
    shape::classify(data)
        .into_iter()
        .map(|v| SseEvent {
            fingerprint: print,
            kind: v.kind as i32,
            api: v.api as i32,
            choice: v.choice,
            token: v.token as i32,
            text_print: v.text,
        })
        .collect()
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
