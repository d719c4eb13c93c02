//! What every API's server side shares: the framer that turns the engine's tokens into
//! that API's bytes, the facts it frames with, and the wire's event syntaxes.
use bytes::Bytes;
use serde::Serialize;

use crate::engine::TokenEvent;

/// What a framer knows of its request once the engine accepted it.
#[derive(Debug, Clone)]
pub(crate) struct StreamContext {
    /// The engine's request number (response ids are made from it).
    pub(crate) request_id: u64,
    pub(crate) model: String,
    /// Unix seconds when the request was accepted.
    pub(crate) created_unix: u64,
    /// Unix ns, for APIs that stamp lines with a wall-clock time (Ollama).
    pub(crate) created_unix_ns: u128,
    /// CLOCK_MONOTONIC ns when the request was accepted (durations Ollama reports).
    pub(crate) received_ns: u64,
    pub(crate) prompt_tokens: usize,
}

/// One API's framing of one response. The server calls `preamble` once when it answers,
/// `on_token` for each engine token (one per engine step), `keepalive` when the engine
/// config's ping interval passed, and `whole_body` instead for `"stream": false`.
pub(crate) trait Framer: Send {
    /// The response's id as the body carries it (and the `x-request-id` header).
    fn response_id(&self) -> &str;

    /// Content-Type of the stream.
    fn content_type(&self) -> &'static str {
        "text/event-stream; charset=utf-8"
    }

    /// Events sent as soon as the request is accepted, before any token.
    fn preamble(&mut self) -> Vec<u8> {
        Vec::new()
    }

    /// The bytes of one engine token, written in one piece (the last one carries the
    /// stream's closing events).
    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8>;

    /// Whether this API sends keep-alive events while it streams.
    fn sends_keepalives(&self) -> bool {
        false
    }

    /// A keep-alive event (Anthropic's ping).
    fn keepalive(&mut self) -> Vec<u8> {
        Vec::new()
    }

    /// The whole response for `"stream": false`; None where the route only streams.
    fn whole_body(&self, _tokens: &[TokenEvent]) -> Option<Bytes> {
        None
    }
}

/// `data: {json}\n\n`: OpenAI's and vLLM's event, without a name.
pub(crate) fn push_data(out: &mut Vec<u8>, json: &str) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// `event: NAME\ndata: {json}\n\n`: the named events of Anthropic and the Responses API.
pub(crate) fn push_named(out: &mut Vec<u8>, name: &str, json: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.push(b'\n');
    push_data(out, json);
}

/// JSON text of a serialisable event (field order as declared: the wire's order).
pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    // Serialising plain structs and JSON values cannot fail; an empty object keeps the
    // stream well-formed if it ever did.
    serde_json::to_string(value).unwrap_or_else(|_| "{}".to_string())
}

/// An event whose JSON starts with its `"type"` (Anthropic, the Responses API) and, in
/// the Responses API, ends with its `"sequence_number"`.
#[derive(Debug, Serialize)]
pub(crate) struct Typed<'a> {
    #[serde(rename = "type")]
    pub(crate) kind: &'a str,
    /// The event's other fields (an object).
    #[serde(flatten)]
    pub(crate) body: serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sequence_number: Option<u64>,
}

/// What a run of output tokens is, for APIs that split output into typed parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartKind {
    Reasoning,
    Text,
    ToolCall,
}

/// The output's parts in order (reasoning first, then text or a forced tool call) with
/// the number of engine tokens each takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutputPlan {
    parts: Vec<(PartKind, usize)>,
}

/// Where one token falls in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartPosition {
    pub(crate) part: usize,
    pub(crate) kind: PartKind,
    pub(crate) first: bool,
    pub(crate) last: bool,
}

impl OutputPlan {
    /// `reasoning` tokens of reasoning (at most all but one), then the rest as a tool
    /// call's arguments or as text.
    pub(crate) fn new(max_tokens: usize, reasoning: usize, tool_call: bool) -> OutputPlan {
        let max_tokens = max_tokens.max(1);
        let reasoning = reasoning.min(max_tokens - 1);
        let mut parts = Vec::new();
        if reasoning > 0 {
            parts.push((PartKind::Reasoning, reasoning));
        }
        let rest = if tool_call {
            PartKind::ToolCall
        } else {
            PartKind::Text
        };
        parts.push((rest, max_tokens - reasoning));
        OutputPlan { parts }
    }

    pub(crate) fn parts(&self) -> impl Iterator<Item = PartKind> + '_ {
        self.parts.iter().map(|p| p.0)
    }

    /// Tokens planned as reasoning.
    pub(crate) fn reasoning_tokens(&self) -> usize {
        self.parts
            .iter()
            .filter(|p| p.0 == PartKind::Reasoning)
            .map(|p| p.1)
            .sum()
    }

    /// The part of token `index`; tokens past the plan stay in its last part.
    pub(crate) fn position(&self, index: usize) -> PartPosition {
        let mut start = 0;
        for (i, &(kind, len)) in self.parts.iter().enumerate() {
            let is_last_part = i + 1 == self.parts.len();
            if index < start + len || is_last_part {
                return PartPosition {
                    part: i,
                    kind,
                    first: index == start,
                    last: index + 1 == start + len,
                };
            }
            start += len;
        }
        PartPosition {
            part: 0,
            kind: PartKind::Text,
            first: index == 0,
            last: false,
        }
    }
}

/// A token's text as a piece of a tool call's JSON arguments: the pieces of a call join
/// into `{"query":"<the tokens>"}`.
pub(crate) fn tool_arguments_piece(text: &str, first: bool, last: bool) -> String {
    let escaped = to_json(&text);
    let inner = &escaped[1..escaped.len() - 1];
    let mut out = String::with_capacity(inner.len() + 12);
    if first {
        out.push_str("{\"query\":\"");
    }
    out.push_str(inner);
    if last {
        out.push_str("\"}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_put_reasoning_first_and_keep_one_token_for_the_answer() {
        let p = OutputPlan::new(8, 3, false);
        assert_eq!(
            p.parts().collect::<Vec<_>>(),
            [PartKind::Reasoning, PartKind::Text]
        );
        assert_eq!(
            (p.position(2).last, p.position(3).first, p.position(3).part),
            (true, true, 1),
            "token 3 opens the text part"
        );
        assert_eq!(
            OutputPlan::new(1, 5, true).parts().collect::<Vec<_>>(),
            [PartKind::ToolCall]
        );
        assert_eq!(OutputPlan::new(4, 9, false).reasoning_tokens(), 3);
    }

    #[test]
    fn tool_pieces_join_into_json_arguments() {
        let words = [" ka", " lo", " mi"];
        let joined: String = words
            .iter()
            .enumerate()
            .map(|(i, w)| tool_arguments_piece(w, i == 0, i == 2))
            .collect();
        let v: serde_json::Value = serde_json::from_str(&joined).expect("arguments are JSON");
        assert_eq!(v["query"], " ka lo mi");
        assert_eq!(tool_arguments_piece(" x", true, true), "{\"query\":\" x\"}");
    }
}
