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

/// 64-bit FNV-1a: cheap, stable across runs and builds (record files keep it).
pub fn fingerprint(bytes: &[u8]) -> u64 {
    fnv_extend(FNV_OFFSET, bytes)
}

/// Continues an FNV-1a hash over more bytes.
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
    fn fingerprint_is_fnv1a() {
        assert_eq!(
            fingerprint(b""),
            FNV_OFFSET,
            "FNV-1a offset basis for empty input"
        );
        assert_eq!(fingerprint(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a of 'a'");
        assert_eq!(
            fnv_extend(fingerprint(b"ab"), b"c"),
            fingerprint(b"abc"),
            "extending = hashing the whole"
        );
    }
}
