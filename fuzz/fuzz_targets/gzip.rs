//! gzip-encoded event streams (`protocol::content`): the body of a
//! `Content-Encoding: gzip` SSE or NDJSON response is inflated, at most
//! `MAX_INFLATED_BYTES` of it, to read its events. The input is the compressed
//! body, cut into I/Os (`tokenscope_fuzz::ios`), after a fixed response head.
#![no_main]

use collector::protocol::stream::StreamParser;
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::ios;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let content_type = if mode & 1 == 1 {
        "application/x-ndjson"
    } else {
        "text/event-stream"
    };
    let encoding = if mode & 2 == 2 { "x-gzip" } else { "gzip" };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Encoding: {encoding}\r\n\r\n"
    );
    let mut parser = StreamParser::default();
    let first = parser.feed(head.as_bytes(), head.len() as u64);
    assert!(first.compressed, "the head says gzip");
    for io in ios(rest) {
        let sniff = parser.feed(io.captured, io.total());
        assert!(
            sniff.body_bytes <= io.total(),
            "{} body bytes in an I/O of {}",
            sniff.body_bytes,
            io.total()
        );
    }
});
