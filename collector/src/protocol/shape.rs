//! Which streaming API an event belongs to, and whether it is a token, read from the
//! event's own shape (never from a path or a port): OpenAI Chat Completions and
//! Completions (`choices`, one token stream per choice index), OpenAI Responses
//! (`response.*.delta`), Anthropic Messages (`content_block_delta`), Gemini
//! (`candidates[].content.parts[].text`), Hugging Face TGI (`token`, `special`) and
//! Ollama (`done`, `response` / `message.content`). The text is read here and dropped:
//! only the verdict leaves.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::ingest::model::{Api, SseKind, TokenKind};

/// One event's verdict: what it is, whose, and for a token its choice and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub kind: SseKind,
    pub api: Api,
    pub choice: u32,
    pub token: TokenKind,
}

impl Verdict {
    fn new(kind: SseKind, api: Api) -> Verdict {
        Verdict {
            kind,
            api,
            choice: 0,
            token: TokenKind::Text,
        }
    }

    fn token(api: Api, token: TokenKind) -> Verdict {
        Verdict {
            token,
            ..Verdict::new(SseKind::Choice, api)
        }
    }
}

/// The fields any of the shapes is told by; everything else is skipped unread. Fields
/// whose type differs between APIs (`delta`: a string in Responses, an object in
/// Anthropic; `response`, `message`: Ollama's text, others' objects) are read loosely.
#[derive(Deserialize)]
struct Shape<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    object: Option<Cow<'a, str>>,
    choices: Option<Vec<Choice>>,
    delta: Option<serde_json::Value>,
    #[serde(borrow)]
    candidates: Option<Vec<Candidate<'a>>>,
    token: Option<TgiToken>,
    #[serde(default, deserialize_with = "present")]
    generated_text: Option<bool>,
    done: Option<bool>,
    response: Option<serde_json::Value>,
    message: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    index: Option<u32>,
    delta: Option<IgnoredAny>,
    text: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Candidate<'a> {
    #[serde(borrow)]
    content: Option<Content<'a>>,
    #[serde(rename = "finishReason")]
    finish_reason: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Content<'a> {
    #[serde(borrow)]
    parts: Option<Vec<Part<'a>>>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct TgiToken {
    special: Option<bool>,
}

/// A field that is there and not null.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let v: Option<IgnoredAny> = Option::deserialize(d)?;
    Ok(Some(v.is_some()))
}

/// The verdicts of one event's data (a JSON object per event; an event can be a token
/// and the end at once, and an OpenAI chunk with several choices is a token of each).
pub fn classify(data: &[u8]) -> Vec<Verdict> {
    if data.trim_ascii() == b"[DONE]" {
        return vec![Verdict::new(SseKind::Done, Api::Unspecified)];
    }
    let Ok(shape) = serde_json::from_slice::<Shape>(data) else {
        return vec![Verdict::new(SseKind::Data, Api::Unknown)];
    };
    if let Some(choices) = &shape.choices {
        return openai(&shape, choices);
    }
    if let Some(kind) = shape.kind.as_deref() {
        if let Some(v) = responses(kind).or_else(|| anthropic(kind, &shape)) {
            return vec![v];
        }
    }
    if let Some(candidates) = &shape.candidates {
        return gemini(candidates);
    }
    if let Some(token) = &shape.token {
        return tgi(token, shape.generated_text == Some(true));
    }
    if let Some(done) = shape.done {
        return vec![ollama(done, &shape)];
    }
    vec![Verdict::new(SseKind::Data, Api::Unknown)]
}

fn openai(shape: &Shape, choices: &[Choice]) -> Vec<Verdict> {
    let api = match shape.object.as_deref() {
        Some("chat.completion.chunk") => Api::OpenaiChat,
        Some("text_completion") => Api::OpenaiCompletions,
        _ if choices.iter().any(|c| c.delta.is_some()) => Api::OpenaiChat,
        _ if choices.iter().any(|c| c.text.is_some()) => Api::OpenaiCompletions,
        _ => Api::Openai,
    };
    if choices.is_empty() {
        // The usage chunk.
        return vec![Verdict::new(SseKind::Data, api)];
    }
    choices
        .iter()
        .map(|c| Verdict {
            choice: c.index.unwrap_or(0),
            ..Verdict::token(api, TokenKind::Text)
        })
        .collect()
}

/// OpenAI Responses: `response.*` event types.
fn responses(kind: &str) -> Option<Verdict> {
    let api = Api::OpenaiResponses;
    let token = match kind.strip_prefix("response.")? {
        "output_text.delta" | "refusal.delta" => TokenKind::Text,
        "reasoning_text.delta" | "reasoning_summary_text.delta" => TokenKind::Reasoning,
        "function_call_arguments.delta" | "custom_tool_call_input.delta" => TokenKind::Tool,
        "completed" | "failed" | "incomplete" => return Some(Verdict::new(SseKind::Done, api)),
        _ => return Some(Verdict::new(SseKind::Data, api)),
    };
    Some(Verdict::token(api, token))
}

/// Anthropic Messages: `message_*`, `content_block_*`, `ping`, `error`.
fn anthropic(kind: &str, shape: &Shape) -> Option<Verdict> {
    let api = Api::Anthropic;
    match kind {
        "content_block_delta" => {
            let delta = shape.delta.as_ref().and_then(|d| d.get("type")?.as_str());
            Some(match delta {
                Some("text_delta") => Verdict::token(api, TokenKind::Text),
                Some("thinking_delta") => Verdict::token(api, TokenKind::Reasoning),
                Some("input_json_delta") => Verdict::token(api, TokenKind::Tool),
                // signature_delta, citations_delta: no generated text.
                _ => Verdict::new(SseKind::Data, api),
            })
        }
        "message_stop" => Some(Verdict::new(SseKind::Done, api)),
        "message_start"
        | "message_delta"
        | "content_block_start"
        | "content_block_stop"
        | "ping"
        | "error" => Some(Verdict::new(SseKind::Data, api)),
        _ => None,
    }
}

/// Gemini: a token when a part has text; the end when a candidate has a finish reason.
fn gemini(candidates: &[Candidate]) -> Vec<Verdict> {
    let api = Api::Gemini;
    let text = candidates.iter().any(|c| {
        c.content
            .as_ref()
            .and_then(|c| c.parts.as_ref())
            .is_some_and(|parts| {
                parts
                    .iter()
                    .any(|p| p.text.as_deref().is_some_and(|t| !t.is_empty()))
            })
    });
    let end = candidates.iter().any(|c| c.finish_reason.is_some());
    let mut v = Vec::with_capacity(2);
    if text {
        v.push(Verdict::token(api, TokenKind::Text));
    }
    if end {
        v.push(Verdict::new(SseKind::Done, api));
    }
    if v.is_empty() {
        v.push(Verdict::new(SseKind::Data, api));
    }
    v
}

/// TGI `/generate_stream`: special tokens (EOS) carry no text; `generated_text` ends.
fn tgi(token: &TgiToken, end: bool) -> Vec<Verdict> {
    let api = Api::Tgi;
    let mut v = Vec::with_capacity(2);
    v.push(if token.special == Some(true) {
        Verdict::new(SseKind::Data, api)
    } else {
        Verdict::token(api, TokenKind::Text)
    });
    if end {
        v.push(Verdict::new(SseKind::Done, api));
    }
    v
}

/// Ollama `/api/generate` and `/api/chat` lines.
fn ollama(done: bool, shape: &Shape) -> Verdict {
    let api = Api::Ollama;
    if done {
        return Verdict::new(SseKind::Done, api);
    }
    let text = shape
        .response
        .as_ref()
        .and_then(|r| r.as_str())
        .or_else(|| shape.message.as_ref()?.get("content")?.as_str());
    if text.is_some_and(|t| !t.is_empty()) {
        Verdict::token(api, TokenKind::Text)
    } else {
        Verdict::new(SseKind::Data, api)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(data: &str) -> (SseKind, Api, u32, TokenKind) {
        let v = classify(data.as_bytes());
        assert_eq!(v.len(), 1, "{data}: {v:?}");
        (v[0].kind, v[0].api, v[0].choice, v[0].token)
    }

    use SseKind::{Choice as Tok, Data, Done};

    #[test]
    fn openai_choices_are_tokens_per_index_and_usage_is_not() {
        assert_eq!(
            one(
                r#"{"object":"chat.completion.chunk","choices":[{"index":1,"delta":{"content":"x"}}]}"#
            ),
            (Tok, Api::OpenaiChat, 1, TokenKind::Text)
        );
        assert_eq!(
            one(r#"{"object":"text_completion","choices":[{"index":0,"text":"x"}]}"#).1,
            Api::OpenaiCompletions
        );
        assert_eq!(
            one(r#"{"choices":[{"text":"x"}]}"#).1,
            Api::OpenaiCompletions
        );
        assert_eq!(
            one(
                r#"{"object":"chat.completion.chunk","choices":[],"usage":{"completion_tokens":3}}"#
            )
            .0,
            Data
        );
        assert_eq!(one("[DONE]").0, Done);
        let two = classify(br#"{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}"#);
        assert_eq!(two.iter().map(|v| v.choice).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn responses_deltas_by_kind_and_completed_ends() {
        let r = Api::OpenaiResponses;
        for (t, kind) in [
            ("response.output_text.delta", Tok),
            ("response.created", Data),
            ("response.in_progress", Data),
            ("response.output_text.done", Data),
            ("response.completed", Done),
        ] {
            assert_eq!(
                one(&format!(r#"{{"type":"{t}","sequence_number":3}}"#)).0,
                kind,
                "{t}"
            );
        }
        assert_eq!(
            one(r#"{"type":"response.created","response":{"id":"r","output":[]},"sequence_number":0}"#).0,
            Data,
            "a response object where Ollama has its text"
        );
        assert_eq!(
            one(r#"{"type":"response.reasoning_text.delta","delta":"hm"}"#),
            (Tok, r, 0, TokenKind::Reasoning)
        );
        assert_eq!(
            one(r#"{"type":"response.function_call_arguments.delta","delta":"{\""}"#).3,
            TokenKind::Tool
        );
    }

    #[test]
    fn anthropic_deltas_are_tokens_and_ping_and_stop_are_not() {
        let a = Api::Anthropic;
        assert_eq!(
            one(
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#
            ),
            (Tok, a, 0, TokenKind::Text)
        );
        assert_eq!(
            one(r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"h"}}"#).3,
            TokenKind::Reasoning
        );
        assert_eq!(
            one(r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{"}}"#).3,
            TokenKind::Tool
        );
        assert_eq!(one(r#"{"type":"ping"}"#), (Data, a, 0, TokenKind::Text));
        assert_eq!(
            one(r#"{"type":"message_start","message":{"id":"m","content":[],"usage":{}}}"#),
            (Data, a, 0, TokenKind::Text),
            "a message object where Ollama has its text"
        );
        assert_eq!(one(r#"{"type":"message_stop"}"#).0, Done);
        assert_eq!(
            one(r#"{"type":"content_block_delta","delta":{"type":"signature_delta","signature":"x"}}"#).0,
            Data
        );
    }

    #[test]
    fn gemini_tgi_and_ollama() {
        assert_eq!(
            one(
                r#"{"candidates":[{"content":{"parts":[{"text":"x"}],"role":"model"},"index":0}]}"#
            ),
            (Tok, Api::Gemini, 0, TokenKind::Text)
        );
        let last = classify(
            br#"{"candidates":[{"content":{"parts":[{"text":"."}]},"finishReason":"STOP"}],"usageMetadata":{}}"#,
        );
        assert_eq!(last.iter().map(|v| v.kind).collect::<Vec<_>>(), [Tok, Done]);
        assert_eq!(one(r#"{"candidates":[{"finishReason":"STOP"}]}"#).0, Done);
        assert_eq!(
            one(
                r#"{"index":3,"token":{"id":5,"text":" a","logprob":-0.1,"special":false},"generated_text":null,"details":null}"#
            ),
            (Tok, Api::Tgi, 0, TokenKind::Text)
        );
        let eos = classify(
            br#"{"index":9,"token":{"id":2,"text":"</s>","special":true},"generated_text":"a b","details":{}}"#,
        );
        assert_eq!(eos.iter().map(|v| v.kind).collect::<Vec<_>>(), [Data, Done]);
        assert_eq!(
            one(r#"{"model":"m","created_at":"t","response":"x","done":false}"#),
            (Tok, Api::Ollama, 0, TokenKind::Text)
        );
        assert_eq!(
            one(r#"{"model":"m","message":{"role":"assistant","content":"x"},"done":false}"#).0,
            Tok
        );
        assert_eq!(
            one(r#"{"model":"m","response":"","done":true,"eval_count":4}"#).0,
            Done
        );
    }

    #[test]
    fn anything_else_is_data_of_no_known_shape() {
        for data in [
            "",
            "{",
            "not json",
            r#"{"hello":1}"#,
            "[1,2]",
            r#"{"type":"custom"}"#,
            "\u{0}\u{ff}",
        ] {
            assert_eq!(
                one(data),
                (Data, Api::Unknown, 0, TokenKind::Text),
                "{data:?}"
            );
        }
    }
}
