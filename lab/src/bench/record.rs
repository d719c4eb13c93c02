//! What the bench keeps per request: timestamps only (never prompt or completion text),
//! plus the OpenAI SSE parser the scenarios' plain client uses.
use std::collections::BTreeMap;

use serde::Serialize;

use super::rules::TokenKind;
use super::wire::SseSplitter;

/// One token event as it reached the client (only token events are kept: each API's
/// rule in `rules` says which events are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EventArrival {
    /// CLOCK_MONOTONIC ns of the socket read that delivered the event.
    pub t_ns: u64,
    /// Index of that read on the connection; events sharing it arrived coalesced.
    pub read: u64,
    /// A token event by its API's rule (always true for a kept event; the name is vllm
    /// bench serve's: for OpenAI, the event's JSON carries a choice).
    pub choice: bool,
    /// It carries non-empty text (a generated token, not the chat role chunk).
    pub content: bool,
    /// The choice it belongs to (OpenAI `n`); 0 for single-choice streams.
    pub choice_index: u32,
    /// Text, reasoning or a tool call's arguments. Left out of the JSON when text (the
    /// JSON lines never hold the word "text", so a leak of completion text stands out).
    #[serde(skip_serializing_if = "TokenKind::is_text")]
    pub kind: TokenKind,
}

/// Everything measured about one request, in CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    pub index: u64,
    pub worker: u32,
    pub ok: bool,
    /// Why it failed, in words from the client side (never request or response content).
    pub error: Option<String>,
    pub status: u16,
    /// "1.1" or "2".
    pub http_version: &'static str,
    /// The connection was opened for this request (not reused).
    pub new_connection: bool,
    pub connect_start_ns: Option<u64>,
    pub connect_done_ns: Option<u64>,
    pub tls_done_ns: Option<u64>,
    /// When the request was handed to the connection (first request byte).
    pub request_start_ns: u64,
    /// When the write that carried the first request byte returned: the byte left the
    /// client between `request_start_ns` and this.
    pub request_sent_ns: Option<u64>,
    pub first_byte_ns: Option<u64>,
    pub end_ns: u64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// completion_tokens from the usage chunk, when the server sent one.
    pub usage_completion_tokens: Option<u32>,
    /// The API's end event arrived (`[DONE]`, `response.completed`, `message_stop`, a
    /// `finishReason`, TGI's `generated_text`, Ollama's `"done": true`; a complete JSON
    /// body when not streamed).
    pub done_seen: bool,
    /// The response's id (e.g. `chatcmpl-lab-7`; the `x-request-id` header where the body
    /// carries none), to match the server's own records.
    pub response_id: Option<String>,
    /// The local port of the connection that carried it (0 when it never connected).
    pub local_port: u16,
    pub events: Vec<EventArrival>,
    /// The API it spoke (`bench --api` names: `openai-chat`, `anthropic`, ...).
    pub api: &'static str,
    /// It asked for a stream (else one JSON body: no token events, TTFT is its first byte).
    pub stream: bool,
    /// Choices it asked for (OpenAI `n`).
    pub choices: u32,
    /// When the first body byte arrived (the read that carried it).
    pub first_body_ns: Option<u64>,
    /// Events of the stream that are not tokens by the API's rule (role-less
    /// bookkeeping: usage, pings, item and block starts and stops, end markers).
    pub non_token_events: u32,
}

impl RequestRecord {
    /// Request start by DESIGN.md section 2: connect() when the connection was opened for
    /// this request, else the first request byte.
    pub fn start_ns(&self) -> u64 {
        match (self.new_connection, self.connect_start_ns) {
            (true, Some(c)) => c,
            _ => self.request_start_ns,
        }
    }

    /// Token times per choice, choices in order of their first token.
    fn choice_series(&self) -> Vec<Vec<&EventArrival>> {
        let mut order: BTreeMap<u32, usize> = BTreeMap::new();
        let mut series: Vec<Vec<&EventArrival>> = Vec::new();
        for e in self.events.iter().filter(|e| e.choice) {
            let slot = *order.entry(e.choice_index).or_insert_with(|| {
                series.push(Vec::new());
                series.len() - 1
            });
            series[slot].push(e);
        }
        series
    }

    /// The first token event of any choice; for a non-streamed answer, its first byte.
    pub fn first_token_ns(&self) -> Option<u64> {
        match self.events.iter().find(|e| e.choice) {
            Some(e) => Some(e.t_ns),
            None if !self.stream => self.first_body_ns,
            None => None,
        }
    }

    /// Time to first token as the user feels it (handshakes included).
    pub fn ttft_ns(&self) -> Option<u64> {
        self.first_token_ns()
            .map(|t| t.saturating_sub(self.start_ns()))
    }

    /// TTFT as the client's clock bounds it: from the first token back to the end of the
    /// write that carried the first request byte, and back to its start (one value when
    /// the request opened its connection: connect() starts it).
    pub fn ttft_range(&self) -> Option<(u64, u64)> {
        let first = self.first_token_ns()?;
        let longest = first.saturating_sub(self.start_ns());
        let shortest = match (
            self.new_connection && self.connect_start_ns.is_some(),
            self.request_sent_ns,
        ) {
            (false, Some(sent)) => first.saturating_sub(sent),
            _ => longest,
        };
        Some((shortest, longest))
    }

    /// Time to first token from the first request byte.
    pub fn ttft_server_ns(&self) -> Option<u64> {
        self.first_token_ns()
            .map(|t| t.saturating_sub(self.request_start_ns))
    }

    /// Gaps between consecutive token events of the same choice (never across choices),
    /// choice after choice; same-read events give 0.
    pub fn itl_ns(&self) -> Vec<u64> {
        self.choice_series()
            .iter()
            .flat_map(|s| {
                s.windows(2)
                    .map(|w| w[1].t_ns.saturating_sub(w[0].t_ns))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// (last event - first event) / (events - 1), pooled over choices.
    pub fn tpot_ns(&self) -> Option<u64> {
        let (span, gaps) = self.choice_series().iter().filter(|s| s.len() >= 2).fold(
            (0u64, 0u64),
            |(span, gaps), s| {
                let first = s[0].t_ns;
                let last = s[s.len() - 1].t_ns;
                (span + last.saturating_sub(first), gaps + s.len() as u64 - 1)
            },
        );
        (gaps > 0).then(|| span / gaps)
    }

    pub fn e2e_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns())
    }

    /// Token events that arrived in the same read as the token event of their choice
    /// before them.
    pub fn coalesced_tokens(&self) -> usize {
        self.choice_series()
            .iter()
            .map(|s| {
                let reads: Vec<u64> = s.iter().filter(|e| e.content).map(|e| e.read).collect();
                reads.windows(2).filter(|w| w[0] == w[1]).count()
            })
            .sum()
    }

    /// Token events with text; for a non-streamed answer (no events), the server's count.
    pub fn output_tokens(&self) -> usize {
        match self.stream {
            true => self.events.iter().filter(|e| e.content).count(),
            false => self.usage_completion_tokens.unwrap_or(0) as usize,
        }
    }
}

/// What one SSE event said, as far as timing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    Data {
        choice: bool,
        content: bool,
        completion_tokens: Option<u32>,
        id: Option<String>,
    },
    Done,
    /// A `data:` payload that is not JSON (kept as a count, never as text).
    Malformed,
}

/// OpenAI's SSE events across any read boundary, judged as vllm bench serve does.
#[derive(Debug, Default)]
pub struct SseParser {
    sse: SseSplitter,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        self.sse
            .push(bytes)
            .iter()
            .map(|block| classify(&block.data))
            .collect()
    }
}

fn classify(data: &[u8]) -> SseEvent {
    if data == b"[DONE]" {
        return SseEvent::Done;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return SseEvent::Malformed;
    };
    let choice = v["choices"].as_array().is_some_and(|c| !c.is_empty());
    let first = &v["choices"][0];
    let text = first["text"]
        .as_str()
        .or_else(|| first["delta"]["content"].as_str())
        .unwrap_or("");
    SseEvent::Data {
        choice,
        content: !text.is_empty(),
        completion_tokens: v["usage"]["completion_tokens"].as_u64().map(|n| n as u32),
        // Ids are short server tokens; anything long is not an id we want to keep.
        id: v["id"]
            .as_str()
            .filter(|s| s.len() <= 128)
            .map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parser_handles_events_split_and_joined_across_reads() {
        let mut p = SseParser::default();
        let a = p.push(b"data: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: {\"choi");
        assert_eq!(a.len(), 1, "one complete event in the first read");
        let b = p.push(b"ces\":[{\"text\":\" b\"}]}\n\ndata: [DONE]\n\n");
        assert_eq!(b.len(), 2, "the split event and [DONE]");
        assert_eq!(b[1], SseEvent::Done);
        let c = p.push(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\r\n\r\n");
        assert_eq!(
            c,
            vec![SseEvent::Data {
                choice: false,
                content: false,
                completion_tokens: Some(2),
                id: None,
            }],
            "usage chunk has no choice"
        );
    }

    /// A request on a new connection; each test gives it its events.
    fn sample() -> RequestRecord {
        RequestRecord {
            index: 0,
            worker: 0,
            ok: true,
            error: None,
            status: 200,
            http_version: "1.1",
            new_connection: true,
            connect_start_ns: Some(100),
            connect_done_ns: Some(150),
            tls_done_ns: None,
            request_start_ns: 200,
            request_sent_ns: Some(260),
            first_byte_ns: Some(900),
            end_ns: 2000,
            prompt_tokens: 1,
            max_tokens: 3,
            usage_completion_tokens: None,
            done_seen: true,
            response_id: None,
            local_port: 0,
            events: Vec::new(),
            api: "openai-completions",
            stream: true,
            choices: 1,
            first_body_ns: Some(950),
            non_token_events: 1,
        }
    }

    #[test]
    fn metrics_follow_design_section_2() {
        let ev = |t, read| EventArrival {
            t_ns: t,
            read,
            choice: true,
            content: true,
            choice_index: 0,
            kind: TokenKind::Text,
        };
        let r = RequestRecord {
            events: vec![ev(1000, 1), ev(1000, 1), ev(1600, 2)],
            ..sample()
        };
        assert_eq!(
            r.ttft_ns(),
            Some(900),
            "TTFT from connect start on a new connection"
        );
        assert_eq!(
            r.ttft_server_ns(),
            Some(800),
            "server TTFT from the request byte"
        );
        assert_eq!(r.itl_ns(), vec![0, 600], "same-read events give a 0 gap");
        assert_eq!(r.tpot_ns(), Some(300));
        assert_eq!(r.coalesced_tokens(), 1);
        let reused = RequestRecord {
            new_connection: false,
            ..r.clone()
        };
        assert_eq!(
            reused.ttft_ns(),
            Some(800),
            "reused connection: from the request byte"
        );
        assert_eq!(
            (r.ttft_range(), reused.ttft_range()),
            (Some((900, 900)), Some((740, 800))),
            "the client's bounds: one value from connect(), the write's span otherwise"
        );
    }

    #[test]
    fn gaps_stay_within_each_choice_and_whole_answers_time_their_first_byte() {
        let ev = |t, read, choice_index| EventArrival {
            t_ns: t,
            read,
            choice: true,
            content: true,
            choice_index,
            kind: TokenKind::Text,
        };
        let r = RequestRecord {
            new_connection: false,
            connect_start_ns: None,
            connect_done_ns: None,
            request_start_ns: 100,
            request_sent_ns: Some(110),
            first_byte_ns: Some(500),
            end_ns: 3000,
            max_tokens: 2,
            usage_completion_tokens: Some(4),
            events: vec![
                ev(1000, 1, 0),
                ev(1000, 1, 1),
                ev(1500, 2, 0),
                ev(1700, 3, 1),
            ],
            api: "openai-chat",
            choices: 2,
            first_body_ns: Some(600),
            non_token_events: 0,
            ..sample()
        };
        assert_eq!(r.first_token_ns(), Some(1000), "first token of any choice");
        assert_eq!(
            r.itl_ns(),
            vec![500, 700],
            "one gap per choice, none across choices"
        );
        assert_eq!(r.tpot_ns(), Some(600));
        assert_eq!(
            r.coalesced_tokens(),
            0,
            "choices sharing a read are not coalescing"
        );
        let whole = RequestRecord {
            stream: false,
            events: Vec::new(),
            ..r
        };
        assert_eq!(
            whole.first_token_ns(),
            Some(600),
            "a whole answer: its first body byte"
        );
        assert!(
            whole.itl_ns().is_empty() && whole.tpot_ns().is_none(),
            "and no ITL"
        );
        assert_eq!(
            whole.output_tokens(),
            4,
            "its tokens are the server's count"
        );
    }
}
