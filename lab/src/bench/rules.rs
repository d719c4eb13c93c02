//! Each API's token rule: which event of its stream is a token (and of what kind), which
//! one ends the stream, and where its usage count and response id sit. The profiler
//! applies the same rules to what it sees on the wire (lab/API-SHAPES.md); they must
//! agree exactly. Pure functions of one event's payload: nothing here panics on bad input.
use serde::Serialize;
use serde_json::Value;

use crate::api::Api;

/// What a token carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenKind {
    /// Answer text.
    #[default]
    Text,
    /// Reasoning or thinking text.
    Reasoning,
    /// A tool call's arguments.
    Tool,
}

impl TokenKind {
    pub fn is_text(&self) -> bool {
        *self == TokenKind::Text
    }
}

/// A token event's facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenMark {
    /// The choice it belongs to (OpenAI `n`; a Gemini candidate); 0 elsewhere.
    pub choice_index: u32,
    pub kind: TokenKind,
    /// It carries non-empty text (OpenAI's chat role chunk is a token event without).
    pub content: bool,
}

/// What one event (an SSE event with data, an NDJSON line, a whole JSON body) said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireEvent {
    pub token: Option<TokenMark>,
    /// The API's end-of-stream event.
    pub end: bool,
    /// Output tokens as the server counted them, when the event says.
    pub usage_tokens: Option<u32>,
    /// The response's id, when the event carries it.
    pub id: Option<String>,
}

/// Ids are short server tokens; anything long is not an id worth keeping.
fn short_id(v: &Value) -> Option<String> {
    v.as_str()
        .filter(|s| !s.is_empty() && s.len() <= 128)
        .map(str::to_string)
}

fn count(v: &Value) -> Option<u32> {
    v.as_u64().map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

fn non_empty(v: &Value) -> bool {
    v.as_str().is_some_and(|s| !s.is_empty())
}

fn text(kind: TokenKind, content: bool) -> Option<TokenMark> {
    Some(TokenMark {
        choice_index: 0,
        kind,
        content,
    })
}

/// One SSE event's data (or one NDJSON line) of a streamed response of `api`.
pub fn classify_event(api: Api, data: &[u8]) -> WireEvent {
    if matches!(api, Api::OpenAiChat | Api::OpenAiCompletions) && data == b"[DONE]" {
        return WireEvent {
            end: true,
            ..WireEvent::default()
        };
    }
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return WireEvent::default();
    };
    match api {
        Api::OpenAiChat | Api::OpenAiCompletions => openai(&v),
        Api::OpenAiResponses => responses(&v),
        Api::Anthropic => anthropic(&v),
        Api::Gemini => gemini(&v),
        Api::Tgi => tgi(&v),
        Api::OllamaGenerate | Api::OllamaChat => ollama(&v),
    }
}

/// A non-streamed response's whole body: never a token; it ends the response when it is
/// the API's complete answer.
pub fn classify_whole(api: Api, body: &[u8]) -> WireEvent {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return WireEvent::default();
    };
    match api {
        Api::OllamaGenerate | Api::OllamaChat => WireEvent {
            end: v["done"] == Value::Bool(true),
            usage_tokens: count(&v["eval_count"]),
            ..WireEvent::default()
        },
        _ => WireEvent {
            end: v["choices"].is_array(),
            usage_tokens: count(&v["usage"]["completion_tokens"]),
            id: short_id(&v["id"]),
            ..WireEvent::default()
        },
    }
}

/// vllm bench serve's rule: an event whose `choices` is a non-empty list is a token (the
/// role chunk too); the usage chunk (`"choices": []`) is not.
fn openai(v: &Value) -> WireEvent {
    let choice = &v["choices"][0];
    let token = v["choices"]
        .as_array()
        .is_some_and(|c| !c.is_empty())
        .then(|| {
            let delta = &choice["delta"];
            let reasoning =
                non_empty(&delta["reasoning_content"]) || non_empty(&delta["reasoning"]);
            let tool = delta["tool_calls"]
                .as_array()
                .is_some_and(|t| !t.is_empty());
            let kind = match (reasoning, tool) {
                (true, _) => TokenKind::Reasoning,
                (false, true) => TokenKind::Tool,
                (false, false) => TokenKind::Text,
            };
            TokenMark {
                choice_index: count(&choice["index"]).unwrap_or(0),
                kind,
                content: non_empty(&choice["text"])
                    || non_empty(&delta["content"])
                    || reasoning
                    || tool,
            }
        });
    WireEvent {
        token,
        end: false,
        usage_tokens: count(&v["usage"]["completion_tokens"]),
        id: short_id(&v["id"]),
    }
}

/// The Responses API: text, reasoning and function-argument deltas are tokens;
/// `response.completed` ends.
fn responses(v: &Value) -> WireEvent {
    let kind = match v["type"].as_str().unwrap_or("") {
        "response.output_text.delta" => Some(TokenKind::Text),
        "response.reasoning_text.delta" | "response.reasoning_summary_text.delta" => {
            Some(TokenKind::Reasoning)
        }
        "response.function_call_arguments.delta" => Some(TokenKind::Tool),
        _ => None,
    };
    let completed = v["type"] == "response.completed";
    WireEvent {
        token: kind.and_then(|k| text(k, non_empty(&v["delta"]))),
        end: completed,
        usage_tokens: if completed {
            count(&v["response"]["usage"]["output_tokens"])
        } else {
            None
        },
        id: short_id(&v["response"]["id"]),
    }
}

/// Anthropic: `content_block_delta` of text, thinking or tool input is a token;
/// `message_stop` ends.
fn anthropic(v: &Value) -> WireEvent {
    let token = if v["type"] == "content_block_delta" {
        let d = &v["delta"];
        match d["type"].as_str().unwrap_or("") {
            "text_delta" => text(TokenKind::Text, non_empty(&d["text"])),
            "thinking_delta" => text(TokenKind::Reasoning, non_empty(&d["thinking"])),
            "input_json_delta" => text(TokenKind::Tool, non_empty(&d["partial_json"])),
            _ => None,
        }
    } else {
        None
    };
    WireEvent {
        token,
        end: v["type"] == "message_stop",
        usage_tokens: if v["type"] == "message_delta" {
            count(&v["usage"]["output_tokens"])
        } else {
            None
        },
        id: short_id(&v["message"]["id"]),
    }
}

/// Gemini: an event with a non-empty text part is a token (its candidate's `index` is
/// the choice; a `thought` part is reasoning); one with a `finishReason` ends.
fn gemini(v: &Value) -> WireEvent {
    let candidates = v["candidates"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let token = candidates.iter().find_map(|c| {
        let parts = c["content"]["parts"].as_array()?;
        let part = parts.iter().find(|p| non_empty(&p["text"]))?;
        Some(TokenMark {
            choice_index: count(&c["index"]).unwrap_or(0),
            kind: if part["thought"] == Value::Bool(true) {
                TokenKind::Reasoning
            } else {
                TokenKind::Text
            },
            content: true,
        })
    });
    WireEvent {
        token,
        end: candidates.iter().any(|c| c["finishReason"].is_string()),
        usage_tokens: count(&v["usageMetadata"]["candidatesTokenCount"]),
        id: short_id(&v["responseId"]),
    }
}

/// TGI: a `token` that is not `special` is a token; `generated_text` set ends.
fn tgi(v: &Value) -> WireEvent {
    let token = (v["token"].is_object() && v["token"]["special"] == Value::Bool(false))
        .then(|| text(TokenKind::Text, non_empty(&v["token"]["text"])))
        .flatten();
    WireEvent {
        token,
        end: v["generated_text"].is_string(),
        usage_tokens: count(&v["details"]["generated_tokens"]),
        id: None,
    }
}

/// Ollama: a `"done": false` line with non-empty `response` (generate) or
/// `message.content` (chat) is a text token, with non-empty `thinking` (either place) a
/// reasoning token; `"done": true` ends and is not a token.
fn ollama(v: &Value) -> WireEvent {
    let done = v["done"] == Value::Bool(true);
    let open = v["done"] == Value::Bool(false);
    let kind = if non_empty(&v["response"]) || non_empty(&v["message"]["content"]) {
        Some(TokenKind::Text)
    } else if non_empty(&v["thinking"]) || non_empty(&v["message"]["thinking"]) {
        Some(TokenKind::Reasoning)
    } else {
        None
    };
    WireEvent {
        token: kind.filter(|_| open).and_then(|k| text(k, true)),
        end: done,
        usage_tokens: if done { count(&v["eval_count"]) } else { None },
        id: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(api: Api, data: &str) -> Option<TokenMark> {
        classify_event(api, data.as_bytes()).token
    }

    #[test]
    fn end_and_bookkeeping_events_are_never_tokens() {
        let cases: [(Api, &str); 10] = [
            (Api::OpenAiChat, "[DONE]"),
            (
                Api::OpenAiChat,
                r#"{"choices":[],"usage":{"completion_tokens":3}}"#,
            ),
            (
                Api::OpenAiResponses,
                r#"{"type":"response.completed","response":{}}"#,
            ),
            (
                Api::OpenAiResponses,
                r#"{"type":"response.output_text.done","text":"x"}"#,
            ),
            (Api::Anthropic, r#"{"type":"ping"}"#),
            (Api::Anthropic, r#"{"type":"message_stop"}"#),
            (
                Api::Anthropic,
                r#"{"type":"message_delta","usage":{"output_tokens":2}}"#,
            ),
            (
                Api::Tgi,
                r#"{"token":{"text":"</s>","special":true},"generated_text":"x"}"#,
            ),
            (
                Api::OllamaGenerate,
                r#"{"response":"","done":true,"eval_count":2}"#,
            ),
            (
                Api::Gemini,
                r#"{"candidates":[{"content":{"parts":[{"text":""}]},"finishReason":"STOP"}]}"#,
            ),
        ];
        for (api, data) in cases {
            assert_eq!(token(api, data), None, "{api}: {data} is not a token");
        }
        assert!(
            classify_event(Api::OpenAiChat, b"[DONE]").end,
            "[DONE] ends"
        );
        assert!(classify_event(Api::Anthropic, br#"{"type":"message_stop"}"#).end);
        assert_eq!(
            classify_event(Api::OllamaChat, br#"{"done":true,"eval_count":7}"#).usage_tokens,
            Some(7)
        );
    }

    #[test]
    fn token_kinds_and_choices_follow_each_api() {
        let t = token(
            Api::OpenAiChat,
            r#"{"choices":[{"index":3,"delta":{"role":"assistant","content":""}}]}"#,
        )
        .expect("the role chunk is a token event");
        assert_eq!((t.choice_index, t.content), (3, false));
        let t = token(
            Api::Anthropic,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":" a"}}"#,
        );
        assert_eq!(
            t.map(|t| (t.kind, t.choice_index)),
            Some((TokenKind::Reasoning, 0))
        );
        let t = token(
            Api::OpenAiResponses,
            r#"{"type":"response.function_call_arguments.delta","delta":"{"}"#,
        );
        assert_eq!(t.map(|t| t.kind), Some(TokenKind::Tool));
        let last = classify_event(
            Api::Gemini,
            br#"{"candidates":[{"content":{"parts":[{"text":" z"}]},"finishReason":"STOP"}]}"#,
        );
        assert!(
            last.end && last.token.is_some(),
            "a final chunk with text is a token that ends"
        );
        assert_eq!(
            token(
                Api::OllamaChat,
                r#"{"message":{"content":" a"},"done":false}"#
            )
            .map(|t| t.kind),
            Some(TokenKind::Text)
        );
        assert_eq!(
            token(Api::Tgi, "{not json"),
            None,
            "malformed data is not a token"
        );
        assert_eq!(
            token(Api::Tgi, r#"{"token":{"text":" a","special":false}}"#).map(|t| t.content),
            Some(true)
        );
    }

    #[test]
    fn whole_bodies_end_without_tokens() {
        let w = classify_whole(
            Api::OpenAiChat,
            br#"{"id":"c-1","choices":[{}],"usage":{"completion_tokens":4}}"#,
        );
        assert_eq!(
            (w.token, w.end, w.usage_tokens, w.id.as_deref()),
            (None, true, Some(4), Some("c-1"))
        );
        assert!(!classify_whole(Api::OllamaGenerate, b"{\"done\":false}").end);
        assert!(!classify_whole(Api::OpenAiCompletions, b"{trunc").end);
    }
}
