//! The parsers' and the stitcher's bounds, in one table. Every parser holds a bounded
//! amount of state per stream, so that bytes a stranger sends can cost neither a crash
//! nor unbounded memory. Hitting a bound marks the I/O's sniff (`Sniff::limits`, one
//! bit per limit), the stitcher counts the marks per connection, and the report names
//! them ("gzip streams cut at the 8 MiB inflate limit: 1"). What the recorder itself
//! bounds is counted where it happens: the ring buffer's `dropped` in the recording,
//! the CUPTI socket's `HookStats`, the reorder window's `late_events`.

use crate::ingest::model::Sniff;

/// Most bytes one gzip-encoded stream is inflated to (a gzip bomb is read this far,
/// then no further: its events past it unseen).
pub const MAX_INFLATED_BYTES: u64 = 8 << 20;
/// Longest HTTP/1.x head held before its blank line; past it the direction is unparsable.
pub const MAX_HTTP_HEAD: usize = 64 << 10;
/// Longest SSE event (or NDJSON line) kept whole for fingerprinting; a longer one is
/// fingerprinted on this prefix.
pub const MAX_SSE_EVENT: usize = 64 << 10;
/// Largest HTTP/2 header block reassembled; a larger one is dropped (and the HPACK
/// table with it).
pub const MAX_H2_BLOCK: usize = 64 << 10;
/// Open HTTP/2 streams tracked per connection direction; past it the oldest (lowest
/// id) is dropped.
pub const MAX_H2_STREAMS: usize = 4096;
/// Socket directions parsed at once; past it the least recently used half is forgotten.
pub const MAX_TRACKED_STREAMS: usize = 1 << 16;
/// Connections the stitcher holds at once by default (`stitch::Settle::max_connections`).
pub const MAX_CONNECTIONS: usize = 1 << 16;

/// A parser bound that input reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Limit {
    /// Bytes inflated from one gzip-encoded event stream (`MAX_INFLATED_BYTES`).
    Inflate,
    /// Bytes of an HTTP/1.x head held before its blank line (`MAX_HTTP_HEAD`).
    HttpHead,
    /// Bytes of one SSE event or NDJSON line (`MAX_SSE_EVENT`).
    SseEvent,
    /// Bytes of one HTTP/2 header block (`MAX_H2_BLOCK`).
    H2HeaderBlock,
    /// Open streams of one HTTP/2 connection (`MAX_H2_STREAMS`).
    H2Streams,
    /// Socket directions parsed at once (`MAX_TRACKED_STREAMS`).
    TrackedStreams,
    /// Connections the stitcher holds at once (`MAX_CONNECTIONS`): counted by
    /// the stitcher on the connection it let go, not on an I/O.
    Connections,
}

impl Limit {
    pub const ALL: [Limit; 7] = [
        Limit::Inflate,
        Limit::HttpHead,
        Limit::SseEvent,
        Limit::H2HeaderBlock,
        Limit::H2Streams,
        Limit::TrackedStreams,
        Limit::Connections,
    ];

    fn bit(self) -> u32 {
        1 << self as u32
    }

    /// Its key in the report's `protocols.limits`.
    pub fn key(self) -> &'static str {
        match self {
            Limit::Inflate => "inflate",
            Limit::HttpHead => "http_head",
            Limit::SseEvent => "sse_event",
            Limit::H2HeaderBlock => "h2_header_block",
            Limit::H2Streams => "h2_streams",
            Limit::TrackedStreams => "tracked_streams",
            Limit::Connections => "connections",
        }
    }

    /// The bound, as the report prints it.
    pub fn bound(self) -> String {
        let mib = |b: u64| format!("{} MiB", b >> 20);
        let kib = |b: usize| format!("{} KiB", b >> 10);
        match self {
            Limit::Inflate => mib(MAX_INFLATED_BYTES),
            Limit::HttpHead => kib(MAX_HTTP_HEAD),
            Limit::SseEvent => kib(MAX_SSE_EVENT),
            Limit::H2HeaderBlock => kib(MAX_H2_BLOCK),
            Limit::H2Streams => format!("{MAX_H2_STREAMS} streams"),
            Limit::TrackedStreams => format!("{MAX_TRACKED_STREAMS} socket directions"),
            Limit::Connections => format!("{MAX_CONNECTIONS} connections"),
        }
    }

    /// What `n` hits cost, as one line of the report.
    pub fn describe(self, n: u64) -> String {
        let bound = self.bound();
        let (what, cost) = match self {
            Limit::Inflate => (
                format!("gzip streams cut at the {bound} inflate limit"),
                "their events past it are not read".to_string(),
            ),
            Limit::HttpHead => (
                format!("HTTP heads longer than {bound}"),
                "the rest of their connection's direction is not parsed".to_string(),
            ),
            Limit::SseEvent => (
                format!("I/Os that ended an event longer than {bound}"),
                format!("such events are told apart by their first {bound}"),
            ),
            Limit::H2HeaderBlock => (
                format!("HTTP/2 header blocks longer than {bound}"),
                "skipped; later fields on their connection are unknown".to_string(),
            ),
            Limit::H2Streams => (
                format!("HTTP/2 connections past {bound} open at once"),
                "the oldest stream was let go each time".to_string(),
            ),
            Limit::TrackedStreams => (
                format!("times past {bound} parsed at once"),
                "the least recently used half was let go; their next I/Os start afresh".to_string(),
            ),
            Limit::Connections => (
                format!("connections let go early, past {bound} held at once"),
                "the quietest went as if idle; a request still open on one ends truncated"
                    .to_string(),
            ),
        };
        format!("{what}: {n} ({cost})")
    }
}

impl Sniff {
    /// Marks that this I/O reached `limit`.
    pub fn hit(&mut self, limit: Limit) {
        self.limits |= limit.bit();
    }

    /// The limits this I/O reached.
    pub fn hits(&self) -> impl Iterator<Item = Limit> + '_ {
        Limit::ALL
            .into_iter()
            .filter(|l| self.limits & l.bit() != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_has_its_own_bit_and_key() {
        let mut sniff = Sniff::default();
        for l in Limit::ALL {
            sniff.hit(l);
        }
        assert_eq!(sniff.hits().collect::<Vec<_>>(), Limit::ALL);
        let keys: std::collections::BTreeSet<_> = Limit::ALL.iter().map(|l| l.key()).collect();
        assert_eq!(keys.len(), Limit::ALL.len(), "keys are distinct");
        let mut one = Sniff::default();
        one.hit(Limit::SseEvent);
        assert_eq!(one.hits().collect::<Vec<_>>(), [Limit::SseEvent]);
    }

    #[test]
    fn bounds_are_the_parsers_constants() {
        assert_eq!(Limit::Inflate.bound(), "8 MiB");
        assert_eq!(Limit::HttpHead.bound(), "64 KiB");
        assert_eq!(
            Limit::Inflate.describe(2),
            "gzip streams cut at the 8 MiB inflate limit: 2 (their events past it are not read)"
        );
    }
}
