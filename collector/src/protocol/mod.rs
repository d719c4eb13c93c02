//! Parsers over captured payload prefixes. They see at most the probe's cap of
//! each socket I/O, so every parser copes with input cut anywhere.

pub mod http;
pub mod tls;

use crate::ingest::model::{sniff, Sniff};

/// 64-bit FNV-1a: cheap, stable across runs and builds (record files keep it).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Reduces a payload prefix to what may leave the process: a fingerprint plus,
/// when recognised, the HTTP head (redacted) or the TLS record headers.
pub fn sniff(payload: &[u8]) -> Sniff {
    let kind = if let Some(records) = tls::parse_records(payload) {
        Some(sniff::Kind::Tls(records))
    } else if let Some(req) = http::parse_request_head(payload) {
        Some(sniff::Kind::HttpRequest(req))
    } else {
        http::parse_response_head(payload).map(sniff::Kind::HttpResponse)
    };
    Sniff {
        fingerprint: fingerprint(payload),
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_fnv1a() {
        assert_eq!(
            fingerprint(b""),
            0xcbf2_9ce4_8422_2325,
            "FNV-1a offset basis for empty input"
        );
        assert_eq!(fingerprint(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a of 'a'");
    }

    #[test]
    fn sniff_recognises_each_kind() {
        assert!(matches!(
            sniff(b"GET / HTTP/1.1\r\n\r\n").kind,
            Some(sniff::Kind::HttpRequest(_))
        ));
        assert!(matches!(
            sniff(b"HTTP/1.1 200 OK\r\n\r\n").kind,
            Some(sniff::Kind::HttpResponse(_))
        ));
        assert!(matches!(
            sniff(&[22, 3, 1, 0, 4, 1, 0, 0, 0]).kind,
            Some(sniff::Kind::Tls(_))
        ));
        assert_eq!(
            sniff(b"data: {\"x\":1}\n\n").kind,
            None,
            "SSE bodies keep only their fingerprint"
        );
    }
}
