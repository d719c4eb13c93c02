//! Splits a response body into its API's events, incrementally over any read boundary:
//! SSE events (blank-line separated, LF or CRLF), NDJSON lines (Ollama), or one whole
//! JSON body (`"stream": false`). Each event then meets its API's token rule.
use super::rules::{classify_event, classify_whole, WireEvent};
use crate::api::Api;

/// A non-streamed body larger than this is not an answer the bench reads.
const MAX_WHOLE_BODY: usize = 64 << 20;

/// One SSE event: its `event:` name, if any, and its `data:` lines joined by LF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseBlock {
    pub name: Option<String>,
    pub data: Vec<u8>,
}

/// Splits bytes into SSE events. Comment lines (`: keep-alive`) and events without data
/// yield nothing, as the SSE spec says.
#[derive(Debug, Default)]
pub struct SseSplitter {
    buf: Vec<u8>,
}

impl SseSplitter {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseBlock> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some((end, sep)) = find_event_end(&self.buf[start..]) {
            if let Some(block) = parse_block(&self.buf[start..start + end]) {
                out.push(block);
            }
            start += end + sep;
        }
        self.buf.drain(..start);
        out
    }
}

/// Where the first event ends: (its length, the separator's length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

fn parse_block(event: &[u8]) -> Option<SseBlock> {
    let mut name = None;
    let mut data: Option<Vec<u8>> = None;
    for line in event.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let (field, value) = match line.iter().position(|b| *b == b':') {
            Some(0) => continue, // a comment
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &b""[..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        match field {
            b"data" => {
                let d = data.get_or_insert_with(Vec::new);
                if !d.is_empty() {
                    d.push(b'\n');
                }
                d.extend_from_slice(value);
            }
            b"event" => name = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
    let data = data.filter(|d| !d.is_empty())?;
    Some(SseBlock { name, data })
}

/// How the body is framed.
#[derive(Debug)]
enum Framing {
    Sse(SseSplitter),
    Ndjson(Vec<u8>),
    Whole(Vec<u8>),
}

/// Reads one response of `api`: bytes in, events (with the API's verdict) out.
#[derive(Debug)]
pub struct WireParser {
    api: Api,
    framing: Framing,
}

impl WireParser {
    /// `stream`: the request asked for a stream (else the body is one JSON answer).
    pub fn new(api: Api, stream: bool) -> WireParser {
        let framing = match (stream, api.is_ndjson()) {
            (false, _) => Framing::Whole(Vec::new()),
            (true, true) => Framing::Ndjson(Vec::new()),
            (true, false) => Framing::Sse(SseSplitter::default()),
        };
        WireParser { api, framing }
    }

    /// The events completed by these bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<WireEvent> {
        match &mut self.framing {
            Framing::Sse(s) => s
                .push(bytes)
                .iter()
                .map(|b| classify_event(self.api, &b.data))
                .collect(),
            Framing::Ndjson(buf) => {
                buf.extend_from_slice(bytes);
                let mut out = Vec::new();
                let mut start = 0;
                while let Some(n) = buf[start..].iter().position(|b| *b == b'\n') {
                    let line = &buf[start..start + n];
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    if !line.iter().all(u8::is_ascii_whitespace) {
                        out.push(classify_event(self.api, line));
                    }
                    start += n + 1;
                }
                buf.drain(..start);
                out
            }
            Framing::Whole(buf) => {
                if buf.len() + bytes.len() <= MAX_WHOLE_BODY {
                    buf.extend_from_slice(bytes);
                }
                Vec::new()
            }
        }
    }

    /// The body ended: a whole body is judged now; a last NDJSON line without its
    /// newline still counts.
    pub fn finish(&mut self) -> Vec<WireEvent> {
        match &mut self.framing {
            Framing::Whole(buf) => vec![classify_whole(self.api, buf)],
            Framing::Ndjson(buf) if !buf.iter().all(u8::is_ascii_whitespace) => {
                let line = std::mem::take(buf);
                vec![classify_event(self.api, &line)]
            }
            Framing::Ndjson(_) | Framing::Sse(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks_keep_names_skip_comments_and_join_data_lines() {
        let mut s = SseSplitter::default();
        let out = s.push(b": keep-alive\n\nevent: ping\ndata: {\"type\":\"ping\"}\r\n\r\ndata:a\ndata: b\n\n:x\n");
        assert_eq!(
            out,
            vec![
                SseBlock {
                    name: Some("ping".into()),
                    data: b"{\"type\":\"ping\"}".to_vec()
                },
                SseBlock {
                    name: None,
                    data: b"a\nb".to_vec()
                },
            ],
            "the comment-only event yields nothing; CRLF and LF both end events"
        );
        assert!(
            s.push(b"\n").is_empty(),
            "a trailing comment block is no event"
        );
    }

    #[test]
    fn ndjson_lines_split_anywhere_and_the_last_line_needs_no_newline() {
        let mut p = WireParser::new(Api::OllamaGenerate, true);
        let a = p.push(b"{\"response\":\" a\",\"do");
        let b = p.push(b"ne\":false}\n\n{\"response\":\"\",\"done\":true}");
        assert!(a.is_empty());
        assert_eq!(b.len(), 1, "one complete line");
        let end = p.finish();
        assert!(
            end.len() == 1 && end[0].end,
            "the unterminated last line ends the stream"
        );
    }
}
