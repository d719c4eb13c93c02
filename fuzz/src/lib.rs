//! What the fuzz targets share: how one fuzz input becomes a sequence of socket
//! I/Os, so that a target reaches the states only a stream cut at odd places (or
//! with bytes gone uncaptured) reaches.
//!
//! Layout of an input read by [`ios`]: `[n] [frac skip]*n stream...`. `n` is the
//! first byte mod 16, the number of cuts. Cut `i` ends an I/O `frac/256` of the way
//! through the stream bytes still left (a fraction, not an offset, so that a seed
//! stays meaningful when the stream is mutated), and `skip` says how many bytes the
//! socket moved past what was captured ([`uncaptured`]). What is left after the
//! last cut is one more I/O, wholly captured. A seed of one whole I/O is `[0] stream`.
//!
//! Run the targets with `cargo xtask fuzz`; this file's tests with
//! `cargo test --manifest-path fuzz/Cargo.toml --lib` (no instrumentation needed).

use collector::ingest::model::{sniff, Header, Sniff};

/// Cuts at most: more I/Os per input than this add little but time.
const MAX_CUTS: u8 = 16;

/// One socket I/O made from a fuzz input.
#[derive(Clone, Copy, Debug)]
pub struct Io<'a> {
    /// The payload prefix the probe copied.
    pub captured: &'a [u8],
    /// Bytes the socket moved beyond `captured`.
    pub uncaptured: u64,
}

impl Io<'_> {
    /// Bytes the socket moved in all (what an I/O event's `bytes` says).
    pub fn total(&self) -> u64 {
        self.captured.len() as u64 + self.uncaptured
    }
}

/// `data` as a sequence of I/Os (see the module's doc). Too short for its cuts, it
/// is one I/O of everything after the first byte.
pub fn ios(data: &[u8]) -> Vec<Io<'_>> {
    let Some((&first, rest)) = data.split_first() else {
        return Vec::new();
    };
    let cuts = usize::from(first % MAX_CUTS);
    if rest.len() < 2 * cuts {
        return vec![Io {
            captured: rest,
            uncaptured: 0,
        }];
    }
    let (control, mut stream) = rest.split_at(2 * cuts);
    let mut out = Vec::with_capacity(cuts + 1);
    for pair in control.chunks_exact(2) {
        let at = stream.len() * usize::from(pair[0]) / 256;
        let (captured, left) = stream.split_at(at);
        out.push(Io {
            captured,
            uncaptured: uncaptured(pair[1]),
        });
        stream = left;
    }
    out.push(Io {
        captured: stream,
        uncaptured: 0,
    });
    out
}

/// A `skip` byte as uncaptured bytes: 0 none, 1..=127 that many (inside a frame or
/// a chunk), 128..=191 steps of 256 bytes (past a capture cap), 192..=255 powers of
/// two up to 2^62 (bodies of any size, lengths that overflow when added carelessly).
pub fn uncaptured(skip: u8) -> u64 {
    match skip {
        0..=127 => u64::from(skip),
        128..=191 => u64::from(skip - 127) * 256,
        _ => 1u64 << (skip - 192).min(62),
    }
}

/// The inverse of [`ios`] for writing seeds: a control prefix that cuts `stream`
/// into pieces ending at `ends` (byte offsets, increasing), each followed by `skip`.
/// A cut lands exactly where asked while at most 256 bytes are left, else up to
/// 1/256 of what is left past it (the fractions are bytes).
pub fn cut_prefix(stream_len: usize, cuts: &[(usize, u8)]) -> Vec<u8> {
    assert!(cuts.len() < usize::from(MAX_CUTS), "at most 15 cuts");
    let mut out = vec![cuts.len() as u8];
    let mut at = 0;
    for &(end, skip) in cuts {
        let left = stream_len - at;
        let frac = if left == 0 {
            0
        } else {
            ((end - at) * 256).div_ceil(left).min(255)
        };
        out.push(frac as u8);
        out.push(skip);
        at += left * frac / 256;
    }
    out
}

/// Header names whose values are secrets: no parser may keep their values.
const SECRET_HEADERS: &[&str] = &["authorization", "cookie", "set-cookie", "x-api-key"];

/// Panics when a head kept the value of a secret header (the redaction contract).
pub fn assert_redacted(headers: &[Header]) {
    for h in headers {
        assert!(
            h.value.is_none() || !SECRET_HEADERS.contains(&h.name.as_str()),
            "the value of '{}' survived redaction",
            h.name
        );
    }
}

/// [`assert_redacted`] over every head a sniff carries, HTTP/2 streams included.
pub fn assert_sniff_redacted(sniff: &Sniff) {
    match &sniff.kind {
        Some(sniff::Kind::HttpRequest(h)) => assert_redacted(&h.headers),
        Some(sniff::Kind::HttpResponse(h)) => assert_redacted(&h.headers),
        _ => {}
    }
    for s in &sniff.h2_streams {
        if let Some(inner) = &s.sniff {
            assert_sniff_redacted(inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_split_the_stream_where_the_prefix_says() {
        let stream = b"HTTP/1.1 200 OK\r\n\r\ndata: x\n\n";
        let mut input = cut_prefix(stream.len(), &[(8, 0), (19, 5)]);
        input.extend_from_slice(stream);
        let got: Vec<(&[u8], u64)> = ios(&input)
            .iter()
            .map(|io| (io.captured, io.uncaptured))
            .collect();
        assert_eq!(
            got,
            vec![(&stream[..8], 0), (&stream[8..19], 5), (&stream[19..], 0)],
            "the pieces the prefix asked for"
        );
    }

    #[test]
    fn short_or_empty_inputs_are_one_io_or_none() {
        assert!(ios(b"").is_empty(), "no bytes, no I/O");
        let one = ios(b"\x05ab");
        assert_eq!(one.len(), 1, "too short for 5 cuts: one I/O");
        assert_eq!(one[0].captured, b"ab");
        assert_eq!(uncaptured(200), 256, "2^8");
        assert_eq!(uncaptured(255), 1 << 62, "capped at 2^62");
    }
}
