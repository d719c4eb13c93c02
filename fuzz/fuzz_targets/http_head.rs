//! HTTP/1.x request and response heads (`protocol::http`), and HTTP/2 header fields
//! read as a head. Heads are redacted as they are parsed: the values of secret
//! headers must never survive.
#![no_main]

use collector::ingest::model::sniff;
use collector::protocol::http;
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::assert_redacted;

fuzz_target!(|data: &[u8]| {
    let has_blank_line = data.windows(4).any(|w| w == b"\r\n\r\n");
    if let Some(req) = http::parse_request_head(data) {
        assert_redacted(&req.headers);
        assert!(
            !req.complete || has_blank_line,
            "complete without a blank line"
        );
        assert!(
            req.headers.len() <= 64,
            "{} headers kept",
            req.headers.len()
        );
    }
    if let Some(resp) = http::parse_response_head(data) {
        assert_redacted(&resp.headers);
        assert!(
            !resp.complete || has_blank_line,
            "complete without a blank line"
        );
        assert!(
            resp.status <= 999,
            "status {} from three digits",
            resp.status
        );
    }
    let _ = http::starts_like_head(data);
    // The same bytes as HTTP/2 fields: NUL-separated names and values.
    let mut parts = data.split(|b| *b == 0);
    let mut fields = Vec::new();
    while let (Some(name), Some(value)) = (parts.next(), parts.next()) {
        fields.push((name.to_vec(), value.to_vec()));
    }
    match http::h2_head(&fields, true) {
        Some(sniff::Kind::HttpRequest(h)) => assert_redacted(&h.headers),
        Some(sniff::Kind::HttpResponse(h)) => assert_redacted(&h.headers),
        _ => {}
    }
});
