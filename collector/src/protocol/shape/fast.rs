//! OpenAI chunks (`{"id":..,"object":"chat.completion.chunk",..,"choices":[..]}`, nearly
//! every event a serving host writes) read by a small scanner instead of serde: the
//! recorder classifies each token once (the other hops hit `sse`'s memo), and serde
//! took ~0.7 us of a ~2.4 us event budget for it. The scanner answers only for inputs
//! it reads completely, strictly and without escapes; for anything else (another API,
//! an escape, a field it does not know how to read, a duplicate, invalid JSON) it
//! returns None and the general reading decides. Where it answers, the verdicts are
//! the general reading's (built by the same `openai`; the `shape` fuzz target holds
//! the two to the same verdicts).

use std::borrow::Cow;

use super::{Choice, Loose, Shape, Verdict};

/// Nesting past this is left to the general reading (serde_json stops at 128).
const MAX_DEPTH: usize = 64;

/// The verdicts of an OpenAI chunk, or None when the general reading must decide.
pub(super) fn openai_chunk(data: &[u8]) -> Option<Vec<Verdict>> {
    // Escaped strings need unescaping before a print; keys are compared as written.
    if memchr::memchr(b'\\', data).is_some() {
        return None;
    }
    let text = std::str::from_utf8(data).ok()?;
    // Control bytes are whitespace outside strings and invalid inside them: strings are
    // checked for them only when the chunk has any (an SSE data line has none).
    let controls = data.iter().fold(false, |any, &b| any | (b < 0x20));
    let mut s = Scanner {
        data,
        text,
        controls,
        at: 0,
    };
    let mut object: Option<Option<&str>> = None;
    let mut choices: Option<Vec<Choice>> = None;
    s.object(|s, key| {
        match key {
            b"object" if object.is_none() => object = Some(s.string_or_null()?),
            b"choices" if choices.is_none() => choices = Some(s.choices()?),
            // A duplicate, or a field of another API's shape: the general reading.
            b"object" | b"choices" | b"type" | b"delta" | b"candidates" | b"token"
            | b"generated_text" | b"done" | b"response" | b"message" | b"thinking" => return None,
            _ => s.skip(0)?,
        }
        Some(())
    })?;
    s.ws();
    if s.at != data.len() {
        return None;
    }
    let choices = choices?;
    let shape = Shape {
        object: object.flatten().map(Cow::Borrowed),
        ..Shape::default()
    };
    Some(super::openai(&shape, &choices))
}

/// Where the first `"` in `data` is. A chunk's strings are short (keys, ids, a
/// token's text): eight bytes at a time in a word take fewer instructions than
/// memchr's setup or a loop over bytes.
fn quote_in(data: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    let mut words = data.chunks_exact(8);
    for (i, word) in words.by_ref().enumerate() {
        let x = u64::from_le_bytes(word.try_into().expect("8 bytes")) ^ QUOTES;
        // A byte of x is zero where a quote is; the lowest flagged byte is the first
        // zero (a borrow can flag bytes above it, never below).
        let zeros = x.wrapping_sub(ONES) & !x & HIGHS;
        if zeros != 0 {
            return Some(i * 8 + (zeros.trailing_zeros() / 8) as usize);
        }
    }
    let rest = words.remainder();
    let at = data.len() - rest.len();
    rest.iter().position(|&b| b == b'"').map(|p| at + p)
}

struct Scanner<'a> {
    data: &'a [u8],
    /// `data`, checked as UTF-8 once: strings are cut from it at ASCII quotes.
    text: &'a str,
    /// Whether `data` holds a byte below 0x20 anywhere.
    controls: bool,
    at: usize,
}

impl<'a> Scanner<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.data.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.data.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        self.ws();
        let end = self.at + word.len();
        (self.data.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A string without escapes (the caller checked there are none), as written.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let len = quote_in(&self.data[self.at..])?;
        let (start, end) = (self.at, self.at + len);
        if self.controls && self.data[start..end].iter().any(|&b| b < 0x20) {
            return None; // a control character: invalid JSON
        }
        self.at = end + 1;
        // Valid UTF-8 as a whole and cut at ASCII quotes (char boundaries): no second
        // check, only the boundaries'.
        self.text.get(start..end)
    }

    /// `null` (None), or what `value` reads.
    fn null_or<T>(&mut self, value: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        value(self).map(Some)
    }

    fn string_or_null(&mut self) -> Option<Option<&'a str>> {
        self.null_or(Self::string)
    }

    /// `{ "key": value, ... }`, each value read by `member` (which must consume it).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Option<()>) -> Option<()> {
        self.list(b'{', b'}', |s| {
            let key = s.string()?;
            s.eat(b':')?;
            member(s, key.as_bytes())
        })
    }

    /// `[ item, ... ]`, each item read by `item`.
    fn array(&mut self, item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.list(b'[', b']', item)
    }

    /// `open item, ... close`: the shape of both objects and arrays.
    fn list(
        &mut self,
        open: u8,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        self.eat(open)?;
        if self.peek()? == close {
            self.at += 1;
            return Some(());
        }
        loop {
            item(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b if b == close => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Any JSON value, checked and passed over.
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => self.object(|s, _| s.skip(depth + 1)),
            b'[' => self.array(|s| s.skip(depth + 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }

    /// A JSON number (`-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`); Some(integer) when it
    /// is a plain non-negative integer that fits in u32, Some(None) for any other.
    fn number(&mut self) -> Option<Option<u32>> {
        self.ws();
        let negative = self.data.get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        let int = self.digits()?;
        if int.len() > 1 && int[0] == b'0' {
            return None;
        }
        let mut plain = !negative;
        if self.data.get(self.at) == Some(&b'.') {
            self.at += 1;
            self.digits()?;
            plain = false;
        }
        if let Some(b'e' | b'E') = self.data.get(self.at) {
            self.at += 1;
            if let Some(b'+' | b'-') = self.data.get(self.at) {
                self.at += 1;
            }
            self.digits()?;
            plain = false;
        }
        // `int` is ASCII digits without a leading zero: what `parse::<u32>` would read.
        let value = int.iter().try_fold(0u32, |v, &d| {
            v.checked_mul(10)?.checked_add(u32::from(d - b'0'))
        });
        Some(value.filter(|_| plain))
    }

    fn digits(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        while self.data.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        (self.at > start).then(|| &self.data[start..self.at])
    }

    fn choices(&mut self) -> Option<Vec<Choice>> {
        let mut choices = Vec::with_capacity(1);
        self.array(|s| {
            choices.push(s.choice()?);
            Some(())
        })?;
        Some(choices)
    }

    /// `{"index": n, "delta": {..}, "text": "..", ...}`; others skipped, as `Choice`'s
    /// derive does.
    fn choice(&mut self) -> Option<Choice> {
        let (mut index, mut delta, mut text) = (None, None, None);
        self.object(|s, key| {
            match key {
                b"index" if index.is_none() => index = Some(s.index()?),
                b"delta" if delta.is_none() => delta = Some(s.delta()?),
                b"text" if text.is_none() => text = Some(s.text()?),
                b"index" | b"delta" | b"text" => return None, // a duplicate: serde refuses
                _ => s.skip(0)?,
            }
            Some(())
        })?;
        Some(Choice {
            index: index.flatten(),
            delta: delta.flatten(),
            text: text.flatten(),
        })
    }

    fn index(&mut self) -> Option<Option<u32>> {
        // Negative, fractional or too large: serde refuses it as a u32.
        self.null_or(|s| s.number()?)
    }

    /// A choice's `text`: a string (or null), as `Loose` reads one.
    fn text(&mut self) -> Option<Option<Loose>> {
        Some(self.string_or_null()?.map(loose_str))
    }

    /// A choice's `delta` object (or null), as `LooseVisitor::visit_map` reads it, for
    /// the keys OpenAI-style engines write; `type`, `text`, `thinking`, `tool_calls`
    /// and the like go to the general reading.
    fn delta(&mut self) -> Option<Option<Loose>> {
        self.null_or(|s| {
            let mut out = Loose::default();
            s.object(|s, key| {
                let text =
                    |s: &mut Self| Some(s.string_or_null()?.map(loose_str).unwrap_or_default());
                match key {
                    b"content" => out.take_content(text(s)?),
                    b"reasoning_content" | b"reasoning" => out.take_reasoning(text(s)?),
                    b"type" | b"text" | b"partial_json" | b"thinking" | b"tool_calls" => {
                        return None
                    }
                    _ => s.skip(0)?,
                }
                Some(())
            })?;
            Some(out)
        })
    }
}

/// A string value as `LooseVisitor::visit_str` reads it.
fn loose_str(v: &str) -> Loose {
    Loose {
        text: !v.is_empty(),
        print: super::text_print(v),
        ..Loose::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify_general;
    use super::{openai_chunk, quote_in};

    #[test]
    fn the_first_quote_is_found_wherever_it_lies() {
        for len in 0..40 {
            for at in 0..len {
                let mut data: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                data[at] = b'"';
                // A byte that borrows in the word arithmetic, and a second quote after.
                if at + 1 < len {
                    data[at + 1] = 0x01;
                }
                if at + 3 < len {
                    data[at + 3] = b'"';
                }
                assert_eq!(quote_in(&data), Some(at), "{len} bytes, quote at {at}");
            }
            let none: Vec<u8> = (0..len).map(|i| [0x21, 0x23, 0xa2, 0x00][i % 4]).collect();
            assert_eq!(quote_in(&none), None, "{len} bytes without a quote");
        }
    }

    /// Chunks as engines and gateways write them (vLLM, SGLang, llama.cpp, OpenAI,
    /// a gateway's re-serialisation, DeepSeek-style reasoning, n=2, the usage chunk).
    const TAKEN: &[&str] = &[
        r#"{"id":"chatcmpl-3f2a","object":"chat.completion.chunk","created":1764792000,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}"#,
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
        r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hé 世界"}}],"created":1,"id":"x","model":"llama","system_fingerprint":"b1","object":"chat.completion.chunk","timings":{"prompt_n":3,"predicted_ms":1.5e1}}"#,
        r#" { "id" : "a" , "object" : "chat.completion.chunk" , "choices" : [ { "index" : 1 , "delta" : { "content" : "x" } } ] } "#,
        r#"{"id":"r","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning_content":"think","content":null}}]}"#,
        r#"{"id":"r","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning":"think"}}]}"#,
        r#"{"id":"c","object":"text_completion","created":2,"choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}]}"#,
        r#"{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}"#,
        r#"{"id":"u","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":64,"total_tokens":67,"details":[1,-2.5,true,false,null,{}]}}"#,
        r#"{"choices":[{"delta":{"content":"no object"},"index":null}]}"#,
        r#"{"choices":[{"text":"no object","index":0}],"object":null}"#,
        r#"{"choices":[{"delta":null,"text":null}]}"#,
    ];

    /// Left to the general reading: escapes, other APIs, tool calls, duplicates, and
    /// what is not valid JSON.
    const DEFERRED: &[&str] = &[
        r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a\"b"}}]}"#,
        r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#,
        r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}"#,
        r#"{"candidates":[{"content":{"parts":[{"text":"x"}]}}]}"#,
        r#"{"token":{"text":"x","special":false},"generated_text":null}"#,
        r#"{"model":"m","response":"x","done":false}"#,
        r#"{"choices":[],"choices":[]}"#,
        r#"{"choices":[{"index":0,"index":1}]}"#,
        r#"{"choices":[{"index":-1}]}"#,
        r#"{"choices":[{"index":1.0}]}"#,
        r#"{"choices":[{"index":01}]}"#,
        r#"{"choices":[{"index":4294967296}]}"#,
        r#"{"choices":[{"delta":"text"}]}"#,
        r#"{"choices":null}"#,
        r#"{"choices":[{"index":0},]}"#,
        r#"{"choices":[]} x"#,
        "{\"choices\":[{\"text\":\"a\tb\"}]}",
        r#"{"id":"no choices"}"#,
        "[DONE]",
        "",
    ];

    #[test]
    fn openai_chunks_are_read_without_serde_and_as_serde_reads_them() {
        for data in TAKEN {
            let fast = openai_chunk(data.as_bytes())
                .unwrap_or_else(|| panic!("the fast reading should take {data}"));
            assert_eq!(fast, classify_general(data.as_bytes()), "{data}");
        }
    }

    #[test]
    fn what_the_fast_reading_cannot_read_exactly_is_left_to_serde() {
        for data in DEFERRED {
            assert_eq!(openai_chunk(data.as_bytes()), None, "{data}");
        }
    }

    /// Every cut and many one-byte changes of the chunks above: wherever the fast
    /// reading answers, it answers as serde does (the fuzz target goes further).
    #[test]
    fn cut_or_changed_chunks_get_serdes_verdicts_or_none() {
        let mut taken = 0;
        for data in TAKEN.iter().chain(DEFERRED) {
            let data = data.as_bytes();
            let mut check = |bytes: &[u8]| {
                if let Some(fast) = openai_chunk(bytes) {
                    taken += 1;
                    assert_eq!(
                        fast,
                        classify_general(bytes),
                        "{}",
                        String::from_utf8_lossy(bytes)
                    );
                }
            };
            for end in 0..data.len() {
                check(&data[..end]);
                check(&data[end..]);
            }
            for at in 0..data.len() {
                for b in *b"\"{}[],:0-1.eE tnfu\\\x01\xff" {
                    let mut changed = data.to_vec();
                    changed[at] = b;
                    check(&changed);
                    changed.insert(at, b);
                    check(&changed);
                }
            }
        }
        assert!(
            taken > 1000,
            "the changes should often stay readable ({taken})"
        );
    }
}
