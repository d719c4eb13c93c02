//! HPACK header block decoding (`protocol::hpack`): a sequence of blocks through one
//! decoder that saw the connection from its start or joined it part-way. An I/O
//! cut with bytes uncaptured stands for a block that went unread.
#![no_main]

use collector::protocol::hpack::{self, Decoder};
use libfuzzer_sys::fuzz_target;
use tokenscope_fuzz::ios;

/// RFC 7541 section 4.1: every entry costs 32 bytes beyond its name and value.
const MAX_ENTRIES: usize = hpack::MAX_TABLE_SIZE / 32;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut decoder = if mode & 1 == 0 {
        Decoder::new()
    } else {
        Decoder::joined_mid()
    };
    for io in ios(rest) {
        let block = decoder.decode(io.captured);
        // Every field representation takes at least a byte.
        assert!(
            block.fields.len() + block.unknown as usize <= io.captured.len(),
            "{} fields and {} unknown from {} bytes",
            block.fields.len(),
            block.unknown,
            io.captured.len()
        );
        let decoded: usize = block.fields.iter().map(|(n, v)| n.len() + v.len()).sum();
        assert!(
            decoded <= hpack::MAX_DECODED,
            "{decoded} bytes from a block of {}",
            io.captured.len()
        );
        assert!(
            decoder.known_entries() <= MAX_ENTRIES,
            "{} entries in the table",
            decoder.known_entries()
        );
        if io.uncaptured > 0 {
            decoder.lose();
        }
    }
});
