//! Which streaming API an event belongs to, and whether it is a token, read from the
//! event's own shape (never from a path or a port): OpenAI Chat Completions and
//! Completions (`choices`, one token stream per choice index), OpenAI Responses
//! (`response.*.delta`), Anthropic Messages (`content_block_delta`), Gemini
//! (`candidates[].content.parts[].text`), Hugging Face TGI (`token`, `special`) and
//! Ollama (`done`, `response` / `message.content`). The text is read here and dropped:
//! only the verdict leaves, with a hash of a token's text (FNV-1a, never the text), so
//! a gateway that re-serialises every chunk can be joined by the tokens it forwards.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::ingest::model::{Api, SseKind, TokenKind};

mod fast;

/// One event's verdict: what it is, whose, and for a token its choice and kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub kind: SseKind,
    pub api: Api,
    pub choice: u32,
    pub token: TokenKind,
    /// A token's text, hashed (`super::fingerprint` of the unescaped string); 0 when it
    /// has none (a role-only chunk) or the API's text is not read.
    pub text: u64,
}

impl Verdict {
    fn new(kind: SseKind, api: Api) -> Verdict {
        Verdict {
            kind,
            api,
            choice: 0,
            token: TokenKind::Text,
            text: 0,
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
#[derive(Default, Deserialize)]
struct Shape<'a> {
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    object: Option<Cow<'a, str>>,
    choices: Option<Vec<Choice>>,
    delta: Option<Loose>,
    candidates: Option<Vec<Candidate>>,
    token: Option<TgiToken>,
    #[serde(default, deserialize_with = "present")]
    generated_text: Option<bool>,
    done: Option<bool>,
    response: Option<Loose>,
    message: Option<Loose>,
    thinking: Option<Loose>,
}

/// A field read without keeping it: whether it is a non-empty string (or array), or of
/// an object: its `type` (Anthropic's delta kinds), whether its `content` or
/// `thinking` is non-empty (Ollama's chat message), and whether it carries reasoning
/// or tool calls (an OpenAI delta), and the hash of its text (a string's, or an
/// object's `content`, `text` or reasoning). Nothing is allocated but unescaped strings.
#[derive(Default)]
struct Loose {
    text: bool,
    print: u64,
    kind: Option<DeltaKind>,
    content: bool,
    thinking: bool,
    reasoning: bool,
    tool: bool,
}

impl Loose {
    fn or_print(&mut self, print: u64) {
        if self.print == 0 {
            self.print = print;
        }
    }

    /// An object's `content`: the text; the other fields stand in when it is empty.
    fn take_content(&mut self, v: Loose) {
        self.content = v.text;
        if v.print != 0 {
            self.print = v.print;
        }
    }

    /// An object's `reasoning_content` or `reasoning`.
    fn take_reasoning(&mut self, v: Loose) {
        self.reasoning |= v.text;
        self.or_print(v.print);
    }
}

/// A token's text hashed; 0 for none (and never for some).
fn text_print(text: &str) -> u64 {
    if text.is_empty() {
        0
    } else {
        super::print(text.as_bytes()).max(1)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DeltaKind {
    Text,
    Thinking,
    InputJson,
    Other,
}

impl<'de> Deserialize<'de> for Loose {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Loose, D::Error> {
        d.deserialize_any(LooseVisitor)
    }
}

struct LooseVisitor;

impl<'de> serde::de::Visitor<'de> for LooseVisitor {
    type Value = Loose;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<Loose, E> {
        Ok(Loose {
            text: !v.is_empty(),
            print: text_print(v),
            ..Loose::default()
        })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Loose, A::Error> {
        let mut out = Loose::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "type" => {
                    let v: Loose = map.next_value_seed(KindSeed)?;
                    out.kind = v.kind;
                }
                "content" => out.take_content(map.next_value()?),
                "text" | "partial_json" => out.or_print(map.next_value::<Loose>()?.print),
                "thinking" => {
                    let v: Loose = map.next_value()?;
                    out.thinking = v.text;
                    out.or_print(v.print);
                }
                "reasoning_content" | "reasoning" => out.take_reasoning(map.next_value()?),
                "tool_calls" => out.tool = map.next_value::<Loose>()?.text,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Loose, A::Error> {
        let mut items = false;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            items = true;
        }
        Ok(Loose {
            text: items,
            ..Loose::default()
        })
    }

    fn visit_bool<E>(self, _: bool) -> Result<Loose, E> {
        Ok(Loose::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<Loose, E> {
        Ok(Loose::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<Loose, E> {
        Ok(Loose::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<Loose, E> {
        Ok(Loose::default())
    }
    fn visit_unit<E>(self) -> Result<Loose, E> {
        Ok(Loose::default())
    }
}

/// An object's `type` value, as the delta kind it names.
struct KindSeed;

impl<'de> serde::de::DeserializeSeed<'de> for KindSeed {
    type Value = Loose;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Loose, D::Error> {
        let v: Option<Cow<'de, str>> = Option::deserialize(d)?;
        let kind = match v.as_deref() {
            Some("text_delta") => DeltaKind::Text,
            Some("thinking_delta") => DeltaKind::Thinking,
            Some("input_json_delta") => DeltaKind::InputJson,
            _ => DeltaKind::Other,
        };
        Ok(Loose {
            kind: Some(kind),
            ..Loose::default()
        })
    }
}

#[derive(Deserialize)]
struct Choice {
    index: Option<u32>,
    delta: Option<Loose>,
    text: Option<Loose>,
}

#[derive(Deserialize)]
struct Candidate {
    index: Option<u32>,
    content: Option<Content>,
    #[serde(rename = "finishReason")]
    finish_reason: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Content {
    parts: Option<Vec<Part>>,
}

#[derive(Deserialize)]
struct Part {
    text: Option<Loose>,
    thought: Option<bool>,
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
    fast::openai_chunk(data).unwrap_or_else(|| classify_general(data))
}

/// The fast reading of OpenAI chunks alone: None where it leaves the event to the
/// general reading. For the fuzz target that holds both to the same verdicts.
#[doc(hidden)]
pub fn classify_fast(data: &[u8]) -> Option<Vec<Verdict>> {
    fast::openai_chunk(data)
}

/// The general reading (serde) alone, every API. For the same fuzz target.
#[doc(hidden)]
pub fn classify_general(data: &[u8]) -> Vec<Verdict> {
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
        if let Some(mut v) = responses(kind).or_else(|| anthropic(kind, &shape)) {
            // Both carry a token's text in `delta` (a string, or an object's `text`).
            if v.kind == SseKind::Choice {
                v.text = shape.delta.as_ref().map_or(0, |d| d.print);
            }
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
    let Some(first) = choices.first() else {
        // The usage chunk.
        return vec![Verdict::new(SseKind::Data, api)];
    };
    // One event, one token (vllm bench serve's rule), of its first choice.
    let delta = first.delta.as_ref();
    let token = if delta.is_some_and(|d| d.reasoning) {
        TokenKind::Reasoning
    } else if delta.is_some_and(|d| d.tool) {
        TokenKind::Tool
    } else {
        TokenKind::Text
    };
    let text = delta
        .map(|d| d.print)
        .filter(|&p| p != 0)
        .or_else(|| first.text.as_ref().map(|t| t.print))
        .unwrap_or(0);
    vec![Verdict {
        choice: first.index.unwrap_or(0),
        text,
        ..Verdict::token(api, token)
    }]
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
            Some(match shape.delta.as_ref().and_then(|d| d.kind) {
                Some(DeltaKind::Text) => Verdict::token(api, TokenKind::Text),
                Some(DeltaKind::Thinking) => Verdict::token(api, TokenKind::Reasoning),
                Some(DeltaKind::InputJson) => Verdict::token(api, TokenKind::Tool),
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
    // The first part with text, and its candidate.
    let text = candidates.iter().find_map(|c| {
        let parts = c.content.as_ref()?.parts.as_ref()?;
        let part = parts
            .iter()
            .find(|p| p.text.as_ref().is_some_and(|t| t.text))?;
        Some((c.index.unwrap_or(0), part.thought == Some(true)))
    });
    let end = candidates.iter().any(|c| c.finish_reason.is_some());
    let mut v = Vec::with_capacity(2);
    if let Some((choice, thought)) = text {
        let kind = if thought {
            TokenKind::Reasoning
        } else {
            TokenKind::Text
        };
        v.push(Verdict {
            choice,
            ..Verdict::token(api, kind)
        });
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
    let text = shape.response.as_ref().is_some_and(|r| r.text)
        || shape.message.as_ref().is_some_and(|m| m.content);
    let thinking = shape.thinking.as_ref().is_some_and(|t| t.text)
        || shape.message.as_ref().is_some_and(|m| m.thinking);
    if text {
        let print = [&shape.response, &shape.message]
            .into_iter()
            .flatten()
            .map(|l| l.print)
            .find(|&p| p != 0)
            .unwrap_or(0);
        Verdict {
            text: print,
            ..Verdict::token(api, TokenKind::Text)
        }
    } else if thinking {
        Verdict::token(api, TokenKind::Reasoning)
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
    fn a_tokens_text_is_hashed_the_same_however_the_event_is_written() {
        let text = |data: &str| classify(data.as_bytes())[0].text;
        let engine = r#"{"choices":[{"delta":{"content":" h\u00e9"},"finish_reason":null,"index":0}],"id":"a","object":"chat.completion.chunk"}"#;
        let gateway = r#"{"id":"b","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" hé"}}]}"#;
        assert_ne!(text(engine), 0);
        assert_eq!(
            text(engine),
            text(gateway),
            "unescaped, key order and other fields aside"
        );
        assert_ne!(
            text(engine),
            text(r#"{"choices":[{"delta":{"content":" ho"},"index":0}]}"#)
        );
        assert_eq!(
            text(r#"{"choices":[{"delta":{"role":"assistant","content":""},"index":0}]}"#),
            0,
            "a role-only chunk has no text"
        );
        assert_eq!(
            text(r#"{"choices":[{"delta":{},"finish_reason":"length","index":0}]}"#),
            0
        );
        // Completions, Anthropic, Responses and Ollama carry it elsewhere.
        let completions =
            text(r#"{"object":"text_completion","choices":[{"text":" hé","index":0}]}"#);
        assert_eq!(completions, text(gateway));
        assert_eq!(
            text(
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" hé"}}"#
            ),
            completions
        );
        assert_eq!(
            text(r#"{"type":"response.output_text.delta","delta":" hé"}"#),
            completions
        );
        assert_eq!(
            text(r#"{"model":"m","response":" hé","done":false}"#),
            completions
        );
        assert_eq!(
            text(r#"{"model":"m","message":{"role":"assistant","content":" hé"},"done":false}"#),
            completions
        );
    }

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
        let two = classify(br#"{"choices":[{"index":1,"text":"a"},{"index":0,"text":"b"}]}"#);
        assert_eq!(
            two.iter().map(|v| v.choice).collect::<Vec<_>>(),
            [1],
            "one event, one token, of its first choice"
        );
        let reasoning = r#"{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}"#;
        assert_eq!(one(reasoning).3, TokenKind::Reasoning);
        let tool = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}"#;
        assert_eq!(one(tool).3, TokenKind::Tool);
        let empty = r#"{"choices":[{"index":0,"delta":{"content":"x","tool_calls":[]}}]}"#;
        assert_eq!(one(empty).3, TokenKind::Text);
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
        assert_eq!(
            one(r#"{"model":"m","response":"","thinking":"h","done":false}"#).3,
            TokenKind::Reasoning
        );
        let chat_thinking = r#"{"model":"m","message":{"role":"assistant","content":"","thinking":"h"},"done":false}"#;
        assert_eq!(one(chat_thinking).0, Tok);
        assert_eq!(one(r#"{"model":"m","response":"","done":false}"#).0, Data);
        let thought =
            r#"{"candidates":[{"index":2,"content":{"parts":[{"text":"h","thought":true}]}}]}"#;
        assert_eq!(one(thought), (Tok, Api::Gemini, 2, TokenKind::Reasoning));
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
