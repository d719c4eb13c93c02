//! Ring-buffer records -> [`Event`]s with their payloads sniffed: ingest decodes
//! each record, and each I/O's payload prefix is read as part of its socket's
//! stream (one [`StreamParser`] per socket and direction), reduced to a
//! [`crate::ingest::model::Sniff`] here and dropped: nothing after this point
//! can leak it.

use super::limits::{Limit, MAX_TRACKED_STREAMS as MAX_STREAMS};
use super::stream::StreamParser;
use crate::ingest::decode::{decode_record_onto, DecodeError};
use crate::ingest::fast_hash::FastMap;
use crate::ingest::model::{event::Body, Direction, Event, Sniff, TcpState};

type StreamKey = (u64, i32, bool);

/// Decodes ring-buffer records, keeping the stream parsers their payloads need.
#[derive(Default)]
pub struct Decoder {
    /// By socket, direction, and whether the bytes are TLS plaintext (the
    /// application's view of a TLS connection is a stream of its own). Every I/O
    /// looks its stream up: the parsers are boxed so that a probe of the table reads
    /// small slots, not parsers.
    streams: FastMap<StreamKey, (Box<StreamParser>, u64)>,
    tick: u64,
}

impl Decoder {
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Decodes one ring-buffer record.
    pub fn decode(&mut self, raw: &[u8]) -> Result<Event, DecodeError> {
        let mut event = Event::default();
        self.decode_onto(raw, &mut event)?;
        Ok(event)
    }

    /// Decodes one ring-buffer record onto the end of `out` (nothing added on an
    /// error): built where it stays, not copied out of each call as `decode`'s result
    /// is (copies of the 360-byte event were a sixth of a live recorder's time).
    pub fn decode_into(&mut self, raw: &[u8], out: &mut Vec<Event>) -> Result<(), DecodeError> {
        out.push(Event::default());
        let event = out.last_mut().expect("pushed");
        let decoded = self.decode_onto(raw, event);
        if decoded.is_err() {
            out.pop();
        }
        decoded
    }

    fn decode_onto(&mut self, raw: &[u8], event: &mut Event) -> Result<(), DecodeError> {
        let payload = decode_record_onto(raw, event)?;
        match event.body.as_mut() {
            Some(Body::State(change))
                if matches!(change.new(), TcpState::Close | TcpState::SynSent) =>
            {
                // The address may be reused by another connection.
                self.forget(change.sock.as_ref().map_or(0, |s| s.skaddr));
            }
            Some(Body::Io(io)) => {
                let skaddr = io.sock.as_ref().map_or(0, |s| s.skaddr);
                let key = (skaddr, io.dir, io.syscall().is_tls_plaintext());
                let (parser, evicted) = self.stream(key);
                let total = io.bytes;
                let sniff = io.sniff.insert(Sniff::default());
                parser.feed_into(payload, total, sniff);
                if evicted {
                    sniff.hit(Limit::TrackedStreams);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `key`'s parser, and whether others were let go to make room for it.
    fn stream(&mut self, key: StreamKey) -> (&mut StreamParser, bool) {
        self.tick += 1;
        let full = self.streams.len() >= MAX_STREAMS && !self.streams.contains_key(&key);
        if full {
            let horizon = self.tick.saturating_sub(MAX_STREAMS as u64 / 2);
            self.streams.retain(|_, (_, used)| *used >= horizon);
        }
        let entry = self.streams.entry(key).or_default();
        entry.1 = self.tick;
        (&mut entry.0, full)
    }

    fn forget(&mut self, skaddr: u64) {
        for dir in [Direction::Send, Direction::Recv] {
            for plaintext in [false, true] {
                self.streams.remove(&(skaddr, dir as i32, plaintext));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::decode::test_records::{io_record, io_record_on, io_record_whole};
    use crate::ingest::model::{sniff, Syscall};
    use crate::protocol::limits::Limit;

    #[test]
    fn io_event_sniffs_and_drops_payload() {
        let payload = b"GET /health HTTP/1.1\r\nAuthorization: Bearer hunter2\r\n\r\n";
        let ev = Decoder::new()
            .decode(&io_record(payload))
            .expect("valid io event");
        let io = ev.io().expect("io body");
        assert_eq!(
            (io.bytes, io.captured, io.syscall()),
            (1000, payload.len() as u32, Syscall::Sendto)
        );
        let Some(sniff::Kind::HttpRequest(h)) = io.sniff.as_ref().and_then(|s| s.kind.clone())
        else {
            panic!("expected an HTTP request head")
        };
        assert_eq!(h.path, "/health");
        assert!(
            !format!("{ev:?}").contains("hunter2"),
            "the Authorization value must not survive decoding"
        );
    }

    #[test]
    fn past_the_tracked_streams_the_oldest_half_goes_and_the_limit_is_named() {
        let mut d = Decoder::new();
        let hits = |d: &mut Decoder, skaddr: u64| -> Vec<Limit> {
            let ev = d
                .decode(&io_record_on(skaddr, b"x"))
                .expect("valid io event");
            ev.io()
                .and_then(|io| io.sniff.as_ref())
                .expect("sniff")
                .hits()
                .collect()
        };
        for skaddr in 1..=MAX_STREAMS as u64 {
            assert!(hits(&mut d, skaddr).is_empty(), "socket {skaddr} fits");
        }
        // An I/O on a socket already tracked makes no room.
        assert!(hits(&mut d, 1).is_empty());
        assert_eq!(
            hits(&mut d, MAX_STREAMS as u64 + 1),
            [Limit::TrackedStreams]
        );
        assert!(
            d.streams.len() <= MAX_STREAMS / 2 + 2,
            "{} kept",
            d.streams.len()
        );
    }

    #[test]
    fn decoding_into_a_batch_gives_what_decoding_returns_and_nothing_on_an_error() {
        // One socket's stream across records (the parser's state carries over), a
        // record too short to be one between them.
        let records = [
            io_record_whole(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"),
            vec![1, 2, 3],
            io_record_whole(b"2c\r\ndata: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n\r\n"),
            io_record_whole(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"),
        ];
        let (mut returning, mut into) = (Decoder::new(), Decoder::new());
        let mut batch = Vec::new();
        for raw in &records {
            let before = batch.len();
            match returning.decode(raw) {
                Ok(ev) => {
                    into.decode_into(raw, &mut batch)
                        .expect("decodes as decode does");
                    assert_eq!(batch.last(), Some(&ev), "the same event");
                }
                Err(e) => {
                    assert_eq!(into.decode_into(raw, &mut batch), Err(e), "the same error");
                    assert_eq!(batch.len(), before, "nothing added on an error");
                }
            }
        }
        assert_eq!(batch.len(), 3);
        let sse = |ev: &Event| {
            ev.io()
                .and_then(|io| io.sniff.as_ref())
                .map(|s| s.sse.len())
        };
        assert_eq!(
            sse(&batch[1]),
            Some(1),
            "the token read as the stream's body"
        );
    }
}
