//! Ollama's native `POST /api/generate` and `POST /api/chat`: newline-delimited JSON
//! (`application/x-ndjson`, chunked), one object per token with `"done": false`, then a
//! `"done": true` line with empty text and the timings. `"stream"` defaults to true;
//! `"stream": false` answers one JSON object after the last step.
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use super::error::{field_error, ApiError};
use super::fields;
use super::framing::{to_json, Framer, StreamContext};
use crate::engine::{EngineConfig, TokenEvent};
use collector::clock::monotonic_ns;

/// Which of Ollama's two generation routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OllamaRoute {
    Generate,
    Chat,
}

/// A validated /api/generate or /api/chat request.
#[derive(Debug, Clone)]
pub(crate) struct OllamaRequest {
    pub(crate) route: OllamaRoute,
    pub(crate) model: String,
    pub(crate) prompt_text: String,
    pub(crate) max_tokens: usize,
    pub(crate) stream: bool,
}

/// Parses a body: `prompt` (+ `system`) or `messages`, `options.num_predict`, `stream`.
pub(crate) fn parse(
    route: OllamaRoute,
    body: &[u8],
    cfg: &EngineConfig,
) -> Result<OllamaRequest, ApiError> {
    let obj = fields::json_object(body)?;
    let model = fields::model(&obj, cfg)?;
    let prompt_text = match route {
        OllamaRoute::Generate => {
            let mut text = match obj.get("system") {
                Some(Value::String(s)) => format!("system: {s}\n"),
                None | Some(Value::Null) => String::new(),
                Some(_) => return Err(field_error("system", "a string")),
            };
            match obj.get("prompt") {
                Some(Value::String(s)) => text.push_str(s),
                None | Some(Value::Null) => {}
                Some(_) => return Err(field_error("prompt", "a string")),
            }
            text
        }
        OllamaRoute::Chat => fields::messages_text(
            obj.get("messages"),
            "messages",
            &["system", "user", "assistant", "tool"],
        )?,
    };
    let limit = match obj.get("options") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => o.get("num_predict"),
        Some(_) => return Err(field_error("options", "an object")),
    };
    Ok(OllamaRequest {
        route,
        model,
        prompt_text,
        max_tokens: fields::max_tokens(limit, "options.num_predict", cfg)?,
        stream: fields::boolean(&obj, "stream", true)?,
    })
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

/// One line, fields in Ollama's order; the timings only on the `done` line.
#[derive(Serialize)]
struct Line<'a> {
    model: &'a str,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Message<'a>>,
    done: bool,
    #[serde(flatten)]
    timings: Option<Timings>,
}

#[derive(Serialize)]
struct Timings {
    done_reason: &'static str,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
    prompt_eval_duration: u64,
    eval_count: usize,
    eval_duration: u64,
}

/// Frames one response, streamed or whole.
pub(crate) struct OllamaFramer {
    id: String,
    route: OllamaRoute,
    ctx: StreamContext,
    first_token_ns: Option<u64>,
    tokens: usize,
}

impl OllamaFramer {
    pub(crate) fn new(req: &OllamaRequest, ctx: StreamContext) -> Self {
        OllamaFramer {
            id: format!("ollama-lab-{}", ctx.request_id),
            route: req.route,
            ctx,
            first_token_ns: None,
            tokens: 0,
        }
    }

    fn line(&self, text: &str, timings: Option<Timings>) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(self.ctx.created_unix_ns, |d| d.as_nanos());
        let (response, message) = match self.route {
            OllamaRoute::Generate => (Some(text), None),
            OllamaRoute::Chat => (
                None,
                Some(Message {
                    role: "assistant",
                    content: text,
                }),
            ),
        };
        to_json(&Line {
            model: &self.ctx.model,
            created_at: fields::rfc3339_utc(now),
            response,
            message,
            done: timings.is_some(),
            timings,
        })
    }

    fn timings(&self, eval_count: usize) -> Timings {
        let now = monotonic_ns();
        let received = self.ctx.received_ns;
        let first = self.first_token_ns.unwrap_or(now);
        Timings {
            done_reason: "stop",
            total_duration: now.saturating_sub(received),
            load_duration: 0,
            prompt_eval_count: self.ctx.prompt_tokens,
            prompt_eval_duration: first.saturating_sub(received),
            eval_count,
            eval_duration: now.saturating_sub(first),
        }
    }
}

impl Framer for OllamaFramer {
    fn response_id(&self) -> &str {
        &self.id
    }

    fn content_type(&self) -> &'static str {
        "application/x-ndjson"
    }

    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8> {
        self.first_token_ns.get_or_insert_with(monotonic_ns);
        self.tokens += 1;
        let mut out = self.line(&ev.text, None).into_bytes();
        out.push(b'\n');
        if ev.finished {
            out.extend_from_slice(self.line("", Some(self.timings(self.tokens))).as_bytes());
            out.push(b'\n');
        }
        out
    }

    fn whole_body(&self, tokens: &[TokenEvent]) -> Option<Bytes> {
        let text: String = tokens.iter().map(|t| t.text.as_str()).collect();
        Some(Bytes::from(
            self.line(&text, Some(self.timings(tokens.len()))),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_stream_by_default_and_read_num_predict() {
        let cfg = EngineConfig::default();
        let r = parse(
            OllamaRoute::Generate,
            br#"{"model":"lab-model","prompt":"hi","options":{"num_predict":3}}"#,
            &cfg,
        )
        .expect("a valid request");
        assert!(r.stream, "stream defaults to true");
        assert_eq!(r.max_tokens, 3);
        let e = parse(OllamaRoute::Chat, br#"{"messages":"hi"}"#, &cfg).expect_err("bad messages");
        assert_eq!(e.status, 400);
    }
}
