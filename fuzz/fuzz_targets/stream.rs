//! One direction of one socket read across its I/Os (`protocol::stream`): the whole
//! per-direction decoder, which finds HTTP/1 heads and bodies (chunked, gzip, SSE),
//! TLS records or HTTP/2 frames in arbitrary bytes cut into I/Os anywhere, with
//! bytes gone uncaptured between them. What the probes deliver, this reads.
#![no_main]

use collector::protocol::stream::StreamParser;
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::{assert_sniff_redacted, ios};

fuzz_target!(|data: &[u8]| {
    let mut parser = StreamParser::default();
    for io in ios(data) {
        let sniff = parser.feed(io.captured, io.total());
        assert_sniff_redacted(&sniff);
        assert!(
            sniff.body_bytes <= io.total(),
            "{} body bytes in an I/O of {}",
            sniff.body_bytes,
            io.total()
        );
    }
});
