//! TLS record headers (`protocol::tls`): the records that start inside a captured
//! prefix, and whether a prefix shorter than a header could start one.
#![no_main]

use collector::protocol::tls;
use libfuzzer_sys::fuzz_target;

/// RFC 8446 section 5.1's limit as the parser applies it (TLS 1.2's expansion).
const MAX_RECORD_LEN: u32 = (1 << 14) + 2048;

fuzz_target!(|data: &[u8]| {
    if let Some(found) = tls::parse_records(data) {
        assert!(!found.records.is_empty(), "Some means at least one record");
        // Every record but the last ends inside the prefix; each header is 5 bytes.
        assert!(
            found.records.len() <= data.len() / 5,
            "{} records in {} bytes",
            found.records.len(),
            data.len()
        );
        for r in &found.records {
            assert!(
                (1..=MAX_RECORD_LEN).contains(&r.length),
                "record length {} passed",
                r.length
            );
            let _ = tls::content_type_label(r.content_type);
            if let Some(t) = r.handshake_type {
                assert_eq!(r.content_type, tls::HANDSHAKE, "a type on a non-handshake");
                let _ = tls::handshake_label(t);
            }
        }
    }
    if tls::could_start_record(data) {
        assert!(data.len() < 5, "a whole header is parsed, not guessed at");
    }
});
