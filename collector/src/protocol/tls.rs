//! TLS record headers (RFC 8446 section 5.1): type, legacy version, length.
//! Works on encrypted traffic from any TLS library: only the 5-byte headers
//! (and a handshake message's type byte) are read.

use crate::ingest::model::{TlsRecord, TlsRecords};

pub const CHANGE_CIPHER_SPEC: u32 = 20;
pub const ALERT: u32 = 21;
pub const HANDSHAKE: u32 = 22;
pub const APPLICATION_DATA: u32 = 23;
const HEARTBEAT: u32 = 24;
/// 2^14 plaintext + 256 expansion (TLS 1.3) or 2048 (TLS 1.2).
const MAX_RECORD_LEN: u32 = (1 << 14) + 2048;

/// The record headers that start inside `payload`, or `None` when it does not
/// start with a plausible TLS record header.
pub fn parse_records(payload: &[u8]) -> Option<TlsRecords> {
    let first = header_at(payload, 0)?;
    let mut at = 5 + first.length as usize;
    // After change_cipher_spec the peer's handshake messages are encrypted:
    // their first byte is ciphertext, not a message type.
    let mut encrypted = first.content_type == CHANGE_CIPHER_SPEC;
    let mut records = vec![first];
    while let Some(mut r) = header_at(payload, at) {
        at += 5 + r.length as usize;
        if encrypted {
            r.handshake_type = None;
        }
        encrypted |= r.content_type == CHANGE_CIPHER_SPEC;
        records.push(r);
    }
    Some(TlsRecords { records })
}

/// Whether `b`, shorter than a record header, could be the start of one.
pub fn could_start_record(b: &[u8]) -> bool {
    let ok = [
        |x: u8| (CHANGE_CIPHER_SPEC..=HEARTBEAT).contains(&u32::from(x)),
        |x: u8| x == 3,
        |x: u8| x <= 4,
    ];
    !b.is_empty() && b.len() < 5 && b.iter().zip(ok).all(|(x, f)| f(*x))
}

fn header_at(payload: &[u8], at: usize) -> Option<TlsRecord> {
    let h = payload.get(at..at + 5)?;
    let content_type = u32::from(h[0]);
    let version = u32::from(u16::from_be_bytes([h[1], h[2]]));
    let length = u32::from(u16::from_be_bytes([h[3], h[4]]));
    let plausible = (CHANGE_CIPHER_SPEC..=HEARTBEAT).contains(&content_type)
        && (0x0300..=0x0304).contains(&version)
        && length > 0
        && length <= MAX_RECORD_LEN;
    if !plausible {
        return None;
    }
    let handshake_type = (content_type == HANDSHAKE)
        .then(|| payload.get(at + 5).map(|b| u32::from(*b)))
        .flatten();
    #[cfg(feature = "fuzz-planted-bug")]
    planted::read_handshake_body(payload, at);
    Some(TlsRecord {
        content_type,
        version,
        length,
        handshake_type,
    })
}

/// The bug `cargo xtask fuzz --planted` must find: a handshake message sliced by
/// the 24-bit length it declares, with no check against what was captured.
#[cfg(feature = "fuzz-planted-bug")]
mod planted {
    pub(super) fn read_handshake_body(payload: &[u8], at: usize) {
        if payload.len() >= at + 9 && payload[at] == super::HANDSHAKE as u8 {
            let len = usize::from(payload[at + 6]) << 16
                | usize::from(payload[at + 7]) << 8
                | usize::from(payload[at + 8]);
            std::hint::black_box(&payload[at + 9..at + 9 + len]);
        }
    }
}

pub fn content_type_label(t: u32) -> &'static str {
    match t {
        CHANGE_CIPHER_SPEC => "change_cipher_spec",
        ALERT => "alert",
        HANDSHAKE => "handshake",
        APPLICATION_DATA => "application_data",
        HEARTBEAT => "heartbeat",
        _ => "unknown",
    }
}

pub fn handshake_label(t: u32) -> &'static str {
    match t {
        1 => "ClientHello",
        2 => "ServerHello",
        4 => "NewSessionTicket",
        8 => "EncryptedExtensions",
        11 => "Certificate",
        12 => "ServerKeyExchange",
        13 => "CertificateRequest",
        14 => "ServerHelloDone",
        15 => "CertificateVerify",
        16 => "ClientKeyExchange",
        20 => "Finished",
        _ => "handshake",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_several_records_and_stops_at_the_cut() {
        // ChangeCipherSpec (1 byte body) then application data of 40 bytes, cut after its header.
        let mut p = vec![20, 3, 3, 0, 1, 1];
        p.extend_from_slice(&[23, 3, 3, 0, 40, 0xaa]);
        let r = parse_records(&p).expect("starts with a record header");
        let types: Vec<u32> = r.records.iter().map(|r| r.content_type).collect();
        assert_eq!(
            types,
            vec![CHANGE_CIPHER_SPEC, APPLICATION_DATA],
            "both headers are inside the prefix"
        );
        assert_eq!(r.records[1].length, 40);
    }

    #[test]
    fn client_hello_type_is_read() {
        let p = [22, 3, 1, 0x02, 0x00, 1, 0, 1, 0xfc];
        let r = parse_records(&p).expect("handshake record");
        assert_eq!(
            r.records[0].handshake_type,
            Some(1),
            "ClientHello is handshake type 1"
        );
    }

    #[test]
    fn handshake_after_change_cipher_spec_is_not_typed() {
        let p = [20, 3, 3, 0, 1, 1, 22, 3, 3, 0, 2, 0x14, 0x99];
        let r = parse_records(&p).expect("records");
        assert_eq!(
            r.records[1].handshake_type, None,
            "an encrypted Finished has no readable type"
        );
    }

    #[test]
    fn rejects_non_tls_and_short_input() {
        assert_eq!(parse_records(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(parse_records(&[22, 3, 3]), None, "3 bytes are not a header");
        assert_eq!(
            parse_records(&[22, 3, 3, 0xff, 0xff]),
            None,
            "65535 is longer than any record"
        );
        assert_eq!(
            parse_records(&[22, 9, 9, 0, 5]),
            None,
            "version 0x0909 is not TLS"
        );
    }
}
