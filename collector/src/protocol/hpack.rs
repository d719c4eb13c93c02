//! HPACK header block decoding (RFC 7541) that tolerates joining a connection
//! part-way. The dynamic table holds only the entries inserted since the
//! decoder joined (or last lost track); an index past them is an unknown field,
//! counted and skipped, never guessed. Huffman codes and the static table come
//! from `loona-hpack`; the representation parser is ours because its decoder
//! fails a whole block on one unknown index.
//!
//! Decoded values stay in memory (later blocks reference them) and never reach
//! a `Sniff` from here: `http::h2_head` applies the value allow-list.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::OnceLock;

use loona_hpack::huffman::HuffmanDecoder;

/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 7540 section 6.5.2).
pub const DEFAULT_TABLE_SIZE: usize = 4096;
/// Largest dynamic table kept, whatever size updates ask for: bounds memory.
pub const MAX_TABLE_SIZE: usize = 64 << 10;
/// RFC 7541 section 4.1: an entry's size is name + value + 32.
const ENTRY_OVERHEAD: usize = 32;
/// Integers beyond this are malformed (no header block comes near it).
const MAX_INTEGER: u64 = 1 << 28;
/// Name and value bytes one block may yield. An indexed field copies a table entry,
/// so a block of one-byte references to a 64 KiB entry would yield 64 KiB per byte
/// (4 GiB for a 64 KiB block). Far above any real header list (servers refuse lists
/// past 8 to 64 KiB); fields past it are counted as unknown.
pub const MAX_DECODED: usize = 256 << 10;

/// What one header block said.
#[derive(Default, PartialEq)]
pub struct Block {
    /// Fields resolved, in order: raw name and value bytes.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// Fields that referenced table entries the decoder never saw.
    pub unknown: u32,
    /// Malformed representations (truncated integer or string, bad Huffman, bad index).
    pub errors: u32,
    /// Name and value bytes in `fields` (at most `MAX_DECODED`).
    decoded: usize,
}

impl Block {
    /// Keeps a field, or counts it unknown when it would take the block past `MAX_DECODED`.
    fn keep(&mut self, name: &[u8], value: &[u8]) {
        let size = name.len() + value.len();
        if self.decoded + size > MAX_DECODED {
            self.unknown += 1;
            return;
        }
        self.decoded += size;
        self.fields.push((name.to_vec(), value.to_vec()));
    }
}

/// Values are secrets (Authorization, Cookie): only names are printed.
impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self
            .fields
            .iter()
            .map(|(n, _)| String::from_utf8_lossy(n))
            .collect();
        f.debug_struct("Block")
            .field("names", &names)
            .field("unknown", &self.unknown)
            .field("errors", &self.errors)
            .finish()
    }
}

enum Entry {
    Known {
        name: Vec<u8>,
        value: Vec<u8>,
    },
    /// Inserted with a name we could not resolve: it holds its place so later
    /// indices stay aligned. `size` is a lower bound (the name's length is unknown).
    Unknown {
        size: usize,
    },
}

impl Entry {
    fn size(&self) -> usize {
        match self {
            Entry::Known { name, value } => name.len() + value.len() + ENTRY_OVERHEAD,
            Entry::Unknown { size } => *size,
        }
    }
}

/// One direction's HPACK decoding context.
pub struct Decoder {
    /// Newest first, as HPACK indexes them.
    entries: VecDeque<Entry>,
    /// Sum of entry sizes (lower bounds for unknown ones): evictions computed
    /// from it are a subset of the encoder's, so no live entry is dropped.
    size: usize,
    max_size: usize,
    /// `entries` is the whole table: seen from the connection's start, never lost.
    complete: bool,
}

/// Values are secrets: only the table's shape is printed.
impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("hpack::Decoder")
            .field("entries", &self.entries.len())
            .field("size", &self.size)
            .field("max_size", &self.max_size)
            .field("complete", &self.complete)
            .finish()
    }
}

#[derive(Debug, PartialEq)]
enum Malformed {
    /// The block ends inside a representation: the rest of the block is unreadable.
    Truncated,
    /// A string whose Huffman code is invalid; its length is known, so the
    /// block stays readable after it.
    Huffman,
}

impl Decoder {
    /// A decoder that sees the connection from its start: the table is empty.
    pub fn new() -> Self {
        Decoder {
            entries: VecDeque::new(),
            size: 0,
            max_size: DEFAULT_TABLE_SIZE,
            complete: true,
        }
    }

    /// A decoder joining a connection part-way: the table's older entries are
    /// unknown, and so is its size limit (the largest we keep is assumed, which
    /// only ever keeps entries longer than the encoder does).
    pub fn joined_mid() -> Self {
        Decoder {
            complete: false,
            max_size: MAX_TABLE_SIZE,
            ..Decoder::new()
        }
    }

    /// A header block went unread (uncaptured, oversized, malformed): it may
    /// have inserted entries, so every index is shifted by an unknown amount.
    pub fn lose(&mut self) {
        self.entries.clear();
        self.size = 0;
        self.complete = false;
    }

    /// Known entries (for tests and bounds).
    pub fn known_entries(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e, Entry::Known { .. }))
            .count()
    }

    /// Decodes one whole header block (HEADERS or PUSH_PROMISE plus its CONTINUATIONs).
    pub fn decode(&mut self, block: &[u8]) -> Block {
        let mut out = Block::default();
        let mut at = 0;
        while at < block.len() {
            match self.representation(block, &mut at, &mut out) {
                Ok(()) => {}
                Err(Malformed::Huffman) => out.errors += 1,
                Err(Malformed::Truncated) => {
                    // What the rest of the block inserted is unknown.
                    out.errors += 1;
                    self.lose();
                    break;
                }
            }
        }
        out
    }

    /// Reads one representation at `*at` (RFC 7541 section 6), advancing past it.
    fn representation(
        &mut self,
        block: &[u8],
        at: &mut usize,
        out: &mut Block,
    ) -> Result<(), Malformed> {
        let first = block[*at];
        if first & 0x80 != 0 {
            // Indexed header field.
            let index = integer(block, at, 7)?;
            match self.lookup(index, out) {
                Some((name, value)) => out.keep(name, value),
                None => out.unknown += 1,
            }
            return Ok(());
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            let size = integer(block, at, 5)?;
            self.resize(size);
            return Ok(());
        }
        // Literals: with incremental indexing (01), without (0000) or never indexed (0001).
        let indexing = first & 0xc0 == 0x40;
        let name_index = integer(block, at, if indexing { 6 } else { 4 })?;
        let name = if name_index == 0 {
            string(block, at).map(Some)
        } else {
            Ok(self.lookup(name_index, out).map(|(n, _)| n.to_vec()))
        };
        // Read the value even when the name failed: its length keeps the block in step.
        let value = string(block, at);
        if name == Err(Malformed::Truncated) || value == Err(Malformed::Truncated) {
            return Err(Malformed::Truncated);
        }
        let bad_huffman = name.is_err() || value.is_err();
        match (name.ok().flatten(), value.ok()) {
            (Some(name), Some(value)) => {
                if indexing {
                    self.insert(Entry::Known {
                        name: name.clone(),
                        value: value.clone(),
                    });
                }
                out.keep(&name, &value);
            }
            (_, value) => {
                // Unreadable or unknown: its table slot is kept so later indices stay aligned.
                if indexing {
                    let size = ENTRY_OVERHEAD + value.as_ref().map_or(0, Vec::len);
                    self.insert(Entry::Unknown { size });
                }
                out.unknown += 1;
            }
        }
        if bad_huffman {
            Err(Malformed::Huffman)
        } else {
            Ok(())
        }
    }

    /// Entry `index` (1-based, static then dynamic), or `None` when it is unknown.
    fn lookup(&self, index: u64, out: &mut Block) -> Option<(&[u8], &[u8])> {
        let table = static_table();
        let index = usize::try_from(index).ok()?;
        if index == 0 {
            out.errors += 1; // index 0 is never valid
            return None;
        }
        if let Some((name, value)) = table.get(index - 1) {
            return Some((name, value));
        }
        match self.entries.get(index - 1 - table.len()) {
            Some(Entry::Known { name, value }) => Some((name, value)),
            Some(Entry::Unknown { .. }) => None,
            None => {
                // Past a table we saw whole: the encoder referenced nothing.
                if self.complete {
                    out.errors += 1;
                }
                None
            }
        }
    }

    /// RFC 7541 section 4.4: evict the oldest until the new entry fits, then add it.
    fn insert(&mut self, entry: Entry) {
        let size = entry.size();
        if size > self.max_size {
            // An entry larger than the table empties it; a known table stays known.
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.entries.push_front(entry);
    }

    /// A dynamic table size update (section 6.3), capped to bound memory.
    fn resize(&mut self, size: u64) {
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if size == 0 {
            // A size of zero evicts everything, known or not: the table is known again.
            self.entries.clear();
            self.size = 0;
            self.complete = true;
        } else if size > MAX_TABLE_SIZE {
            // We keep less than the encoder: entries past ours become unknown.
            self.complete = false;
        }
        self.max_size = size.min(MAX_TABLE_SIZE);
        self.evict_to(self.max_size);
    }

    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            match self.entries.pop_back() {
                Some(e) => self.size -= e.size(),
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

/// RFC 7541 section 5.1: an integer with an N-bit prefix at `*at`.
fn integer(block: &[u8], at: &mut usize, prefix: u8) -> Result<u64, Malformed> {
    let mask = ((1u16 << prefix) - 1) as u8;
    let first = *block.get(*at).ok_or(Malformed::Truncated)?;
    *at += 1;
    let mut value = u64::from(first & mask);
    if value < u64::from(mask) {
        return Ok(value);
    }
    let mut shift = 0;
    loop {
        let b = *block.get(*at).ok_or(Malformed::Truncated)?;
        *at += 1;
        value += u64::from(b & 0x7f) << shift;
        // Zero continuation bytes add nothing, so the shift is bounded too.
        if value > MAX_INTEGER || shift > 28 {
            return Err(Malformed::Truncated); // nothing after it can be trusted
        }
        if b & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// RFC 7541 section 5.2: a string literal at `*at`, Huffman-decoded when its H bit is set.
fn string(block: &[u8], at: &mut usize) -> Result<Vec<u8>, Malformed> {
    let huffman = block.get(*at).ok_or(Malformed::Truncated)? & 0x80 != 0;
    let len = usize::try_from(integer(block, at, 7)?).map_err(|_| Malformed::Truncated)?;
    let end = at.checked_add(len).ok_or(Malformed::Truncated)?;
    let raw = block.get(*at..end).ok_or(Malformed::Truncated)?;
    *at = end;
    if !huffman {
        return Ok(raw.to_vec());
    }
    HUFFMAN.with(|h| h.borrow_mut().decode(raw).map_err(|_| Malformed::Huffman))
}

thread_local! {
    /// Building the decoder's tables costs more than a block: one per thread.
    static HUFFMAN: RefCell<HuffmanDecoder> = RefCell::new(HuffmanDecoder::new());
}

/// RFC 7541 Appendix A, read out of `loona-hpack` once rather than copied by hand.
fn static_table() -> &'static [(Vec<u8>, Vec<u8>)] {
    static TABLE: OnceLock<Vec<(Vec<u8>, Vec<u8>)>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut decoder = loona_hpack::Decoder::new();
        // Indexed fields 1..=61 never touch the dynamic table, so one decoder reads them all.
        (1..=61u8)
            .map(|i| {
                decoder
                    .decode(&[0x80 | i])
                    .ok()
                    .and_then(|mut fields| fields.pop())
                    .unwrap_or_default()
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn huffman(s: &[u8]) -> Vec<u8> {
        let mut coded = Vec::new();
        httlib_huffman::encode(s, &mut coded).expect("encodable");
        let mut out = loona_hpack::encoder::encode_integer(coded.len(), 7);
        out[0] |= 0x80;
        out.extend(coded);
        out
    }

    fn raw(s: &[u8]) -> Vec<u8> {
        let mut out = loona_hpack::encoder::encode_integer(s.len(), 7);
        out.extend_from_slice(s);
        out
    }

    fn pairs(b: &Block) -> Vec<(&str, &str)> {
        b.fields
            .iter()
            .map(|(n, v)| {
                (
                    std::str::from_utf8(n).unwrap(),
                    std::str::from_utf8(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn static_table_matches_rfc() {
        let t = static_table();
        assert_eq!(t.len(), 61);
        assert_eq!(t[0], (b":authority".to_vec(), Vec::new()));
        assert_eq!(t[1], (b":method".to_vec(), b"GET".to_vec()));
        assert_eq!(t[7], (b":status".to_vec(), b"200".to_vec()));
        assert_eq!(t[60], (b"www-authenticate".to_vec(), Vec::new()));
    }

    #[test]
    fn integers_with_prefixes() {
        // RFC 7541 C.1: 10 with a 5-bit prefix, 1337 with 5 bits, 42 with 8 bits.
        for (bytes, prefix, want) in [
            (vec![0x0a], 5, 10),
            (vec![0x1f, 0x9a, 0x0a], 5, 1337),
            (vec![0x2a], 8, 42),
        ] {
            let mut at = 0;
            assert_eq!(integer(&bytes, &mut at, prefix), Ok(want));
            assert_eq!(at, bytes.len());
        }
        let mut at = 0;
        assert_eq!(
            integer(&[0x1f, 0x9a], &mut at, 5),
            Err(Malformed::Truncated)
        );
        let mut at = 0;
        let huge = [0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(integer(&huge, &mut at, 5), Err(Malformed::Truncated));
        let mut at = 0;
        let zeros = [
            0x1f, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
        ];
        assert_eq!(integer(&zeros, &mut at, 5), Err(Malformed::Truncated));
    }

    #[test]
    fn rfc_request_examples_with_huffman() {
        // RFC 7541 C.4.1 and C.4.2: the second block reuses the first's dynamic entry.
        let mut d = Decoder::new();
        let first = [
            0x82, 0x86, 0x84, 0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab,
            0x90, 0xf4, 0xff,
        ];
        let b = d.decode(&first);
        assert_eq!(
            pairs(&b),
            vec![
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ]
        );
        let second = [
            0x82, 0x86, 0x84, 0xbe, 0x58, 0x86, 0xa8, 0xeb, 0x10, 0x64, 0x9c, 0xbf,
        ];
        let b = d.decode(&second);
        assert_eq!(b.unknown + b.errors, 0);
        assert_eq!(pairs(&b)[3], (":authority", "www.example.com"));
        assert_eq!(pairs(&b)[4], ("cache-control", "no-cache"));
        assert_eq!(d.known_entries(), 2);
    }

    #[test]
    fn literal_kinds_and_size_update() {
        let mut block = vec![0x40];
        block.extend(raw(b"x-a"));
        block.extend(huffman(b"one"));
        block.push(0x00); // without indexing, literal name
        block.extend(raw(b"x-b"));
        block.extend(raw(b"two"));
        block.push(0x1f); // never indexed, indexed name 15 + 16 = 31 (content-type)
        block.push(0x10);
        block.extend(huffman(b"text/plain"));
        block.push(0xbe); // dynamic 62: x-a: one
        let mut d = Decoder::new();
        let b = d.decode(&block);
        assert_eq!(
            pairs(&b),
            vec![
                ("x-a", "one"),
                ("x-b", "two"),
                ("content-type", "text/plain"),
                ("x-a", "one")
            ]
        );
        assert_eq!(
            d.known_entries(),
            1,
            "only the incremental literal is indexed"
        );
        // A size update to 0 empties the table; 62 is then past a known-empty table.
        let b = d.decode(&[0x20, 0xbe]);
        assert_eq!((b.unknown, b.errors), (1, 1));
    }

    #[test]
    fn eviction_by_rfc_sizes() {
        let mut d = Decoder::new();
        // Max 100: each entry is 1 + 40 + 32 = 73, so only the newest survives.
        let mut block = vec![0x3f, 0x45]; // size update 31 + 69 = 100
        for name in [b"a", b"b"] {
            block.push(0x40);
            block.extend(raw(name));
            block.extend(raw(&[b'v'; 40]));
        }
        let b = d.decode(&block);
        assert_eq!(b.errors, 0);
        assert_eq!(d.known_entries(), 1);
        let b = d.decode(&[0xbe, 0xbf]);
        assert_eq!(pairs(&b)[0].0, "b");
        assert_eq!((b.unknown, b.errors), (1, 1), "63 was evicted");
    }

    #[test]
    fn joined_mid_resolves_only_what_it_saw() {
        let mut d = Decoder::joined_mid();
        // 62 is an entry from before the join: unknown, not an error.
        let mut block = vec![0xbe, 0x40];
        block.extend(raw(b"x-new"));
        block.extend(raw(b"v"));
        // Literal with incremental indexing whose name is an unknown entry (index 70).
        block.extend([0x7f, 0x07]);
        block.extend(raw(b"w"));
        let b = d.decode(&block);
        assert_eq!((b.unknown, b.errors), (2, 0));
        assert_eq!(pairs(&b), vec![("x-new", "v")]);
        // Now 62 is the unknown-name entry, 63 is x-new, 64 is unknown again.
        let b = d.decode(&[0xbe, 0xbf, 0xc0]);
        assert_eq!(pairs(&b), vec![("x-new", "v")]);
        assert_eq!((b.unknown, b.errors), (2, 0));
        d.lose();
        let b = d.decode(&[0xbf]);
        assert_eq!(
            (b.unknown, b.fields.len()),
            (1, 0),
            "lost: nothing resolves"
        );
    }

    #[test]
    fn malformed_blocks_count_errors_and_lose_the_table() {
        let mut d = Decoder::new();
        let mut ok = vec![0x40];
        ok.extend(raw(b"k"));
        ok.extend(raw(b"v"));
        d.decode(&ok);
        // A string that runs past the block.
        let b = d.decode(&[0x82, 0x40, 0x05, b'a']);
        assert_eq!((b.fields.len(), b.errors), (1, 1));
        assert_eq!(d.known_entries(), 0, "a truncated block loses the table");
        // Huffman garbage (an EOS inside): counted, the block reads on.
        let mut bad = vec![0x40];
        bad.extend(raw(b"x-h"));
        bad.extend([0x84, 0xff, 0xff, 0xff, 0xff]);
        bad.push(0x82);
        let b = d.decode(&bad);
        assert_eq!((b.unknown, b.errors), (1, 1));
        assert_eq!(pairs(&b), vec![(":method", "GET")]);
        assert_eq!(d.decode(&[0x80]).errors, 1, "index 0");
    }

    #[test]
    fn references_to_a_large_entry_yield_at_most_max_decoded_bytes() {
        // A 60 KB entry (the table resized to its 64 KiB cap), then a block of one-byte
        // references to it: 60 KB copied per byte without the limit.
        let mut d = Decoder::joined_mid();
        let mut big = vec![0x3f, 0xe1, 0xff, 0x03]; // size update to 65536
        big.push(0x40);
        big.extend(raw(b"x"));
        big.extend(raw(&vec![b'a'; 60_000]));
        assert_eq!(d.decode(&big).errors, 0, "a valid block");
        let refs = d.decode(&[0xbe; 1000]);
        let bytes: usize = refs.fields.iter().map(|(n, v)| n.len() + v.len()).sum();
        assert!(bytes <= MAX_DECODED, "{bytes} bytes decoded");
        assert_eq!(refs.fields.len(), MAX_DECODED / 60_001, "as many as fit");
        assert_eq!(
            refs.fields.len() + refs.unknown as usize,
            1000,
            "the rest are counted unknown"
        );
    }

    #[test]
    fn debug_never_prints_values() {
        let mut d = Decoder::new();
        let mut block = vec![0x40];
        block.extend(raw(b"authorization"));
        block.extend(raw(b"Bearer sk-SECRET"));
        let b = d.decode(&block);
        let text = format!("{b:?} {d:?}");
        assert!(text.contains("authorization") && !text.contains("sk-SECRET"));
    }
}
