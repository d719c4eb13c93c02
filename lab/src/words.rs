//! Deterministic pseudo-words: the engine's "generated text" and the bench's prompts.

const SYLLABLES: [&str; 32] = [
    "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "da", "zu", "fe", "gi", "ho", "ja", "ku",
    "le", "mo", "ni", "pa", "qu", "ro", "si", "tu", "va", "wo", "xe", "yi", "ze", "bo", "ce", "du",
];

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser: cheap, well spread, reproducible.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The `index`-th pseudo-word of the stream identified by `seed`: 1 to 3 syllables.
pub fn pseudo_word(seed: u64, index: u64) -> String {
    let h = mix(seed ^ mix(index));
    let n = 1 + (h % 3) as usize;
    (0..n)
        .map(|i| SYLLABLES[((h >> (8 + 5 * i)) & 31) as usize])
        .collect()
}

/// `count` pseudo-words separated by spaces.
pub fn pseudo_text(seed: u64, count: usize) -> String {
    let mut out = String::with_capacity(count * 5);
    for i in 0..count {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&pseudo_word(seed, i as u64));
    }
    out
}

/// A stable seed for a piece of text.
pub fn seed_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_deterministic_and_counted_by_whitespace() {
        assert_eq!(pseudo_word(7, 3), pseudo_word(7, 3), "same seed, same word");
        let t = pseudo_text(1, 50);
        assert_eq!(t.split_whitespace().count(), 50, "one word per count");
        assert_ne!(
            pseudo_text(1, 20),
            pseudo_text(2, 20),
            "seeds differ, text differs"
        );
    }
}
