//! Parsers over captured payload prefixes. They see at most the probe's cap of
//! each socket I/O, so every parser copes with input cut anywhere; `stream`
//! reads one socket direction across its I/Os.

pub mod body;
mod content;
pub use limits::MAX_INFLATED_BYTES;
pub mod decoder;
pub mod h2;
pub mod hpack;
pub mod http;
pub mod limits;
pub mod shape;
pub mod sse;
pub mod stream;
pub mod tls;

pub use decoder::Decoder;

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// An SSE event's data or a token's text hashed: XXH3-64 (seed 0), specified and
/// stable across runs and builds (record files keep it; older recorders wrote FNV-1a
/// here, see `ingest::record::PRINTS`). Every hop of an event is hashed, so it must be
/// cheap: XXH3 reads 8+ bytes a step where FNV-1a reads one.
pub fn print(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// 64-bit FNV-1a continued over more bytes (from FNV_OFFSET for a fresh hash): body
/// prints, which arrive in pieces; stable across runs and builds (record files keep it).
pub fn fnv_extend(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_extend_is_fnv1a() {
        assert_eq!(
            fnv_extend(FNV_OFFSET, b"a"),
            0xaf63_dc4c_8601_ec8c,
            "FNV-1a of 'a'"
        );
        assert_eq!(
            fnv_extend(fnv_extend(FNV_OFFSET, b"ab"), b"c"),
            fnv_extend(FNV_OFFSET, b"abc"),
            "extending = hashing the whole"
        );
    }

    #[test]
    fn print_is_xxh3_64() {
        // The specification's value for empty input: recordings compare prints made
        // by other builds (other hosts), so the function must not drift.
        assert_eq!(print(b""), 0x2d06_8005_38d3_94c2, "XXH3-64 of ''");
        assert_ne!(print(b"a"), print(b"b"));
    }
}
