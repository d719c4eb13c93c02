//! HTTP/2 framing and header blocks (`protocol::h2`, HPACK through it): one
//! direction of a connection, opened by the client preface, by a server's first
//! SETTINGS, or joined part-way, read across I/Os cut anywhere with bytes gone
//! uncaptured between them.
#![no_main]

use std::collections::HashSet;

use collector::ingest::model::Sniff;
use collector::protocol::h2::H2Conn;
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::{assert_sniff_redacted, ios};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut conn = match mode % 3 {
        0 => H2Conn::client(),
        1 => H2Conn::server(),
        _ => H2Conn::joined_mid(),
    };
    for io in ios(rest) {
        let mut sniff = Sniff::default();
        conn.feed(io.captured, io.uncaptured > 0, &mut sniff);
        conn.skip(io.uncaptured, &mut sniff);
        assert_sniff_redacted(&sniff);
        // Each stream entry needs a byte of this I/O, or the skip, to exist.
        assert!(
            sniff.h2_streams.len() <= io.captured.len() + 1,
            "{} stream entries from {} bytes",
            sniff.h2_streams.len(),
            io.captured.len()
        );
        let ids: HashSet<u32> = sniff.h2_streams.iter().map(|s| s.stream_id).collect();
        assert_eq!(ids.len(), sniff.h2_streams.len(), "one entry per stream");
    }
});
