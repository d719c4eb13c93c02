//! Anthropic Messages (`POST /v1/messages`, streaming): `message_start`, content blocks
//! (thinking, text or tool_use) of `content_block_delta` events, `ping`s, `message_delta`
//! with the stop reason and usage, `message_stop`. No `[DONE]`.
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::error::{field_error, ApiError};
use super::fields;
use super::framing::{
    push_named, to_json, tool_arguments_piece, Framer, OutputPlan, PartKind, StreamContext, Typed,
};
use crate::engine::{EngineConfig, TokenEvent};

/// A validated /v1/messages request.
#[derive(Debug, Clone)]
pub(crate) struct MessagesRequest {
    pub(crate) model: String,
    pub(crate) prompt_text: String,
    pub(crate) max_tokens: usize,
    /// Tokens of thinking before the answer (`thinking.budget_tokens`, capped).
    pub(crate) thinking_tokens: usize,
    /// The tool a `tool_choice` of type `any` or `tool` forces.
    pub(crate) tool_name: Option<String>,
}

/// Parses a /v1/messages body; the lab serves it streaming only.
pub(crate) fn parse(body: &[u8], cfg: &EngineConfig) -> Result<MessagesRequest, ApiError> {
    let obj = fields::json_object(body)?;
    let model = fields::model(&obj, cfg)?;
    fields::streaming_only(&obj, "/v1/messages")?;
    let mut prompt_text = match fields::content_text(obj.get("system"), "system")? {
        Some(s) => format!("system: {s}\n"),
        None => String::new(),
    };
    prompt_text.push_str(&fields::messages_text(
        obj.get("messages"),
        "messages",
        &["user", "assistant"],
    )?);
    let max_tokens = fields::max_tokens(obj.get("max_tokens"), "max_tokens", cfg)?;
    let thinking_tokens = match obj.get("thinking") {
        None | Some(Value::Null) => 0,
        Some(Value::Object(t)) => match t.get("type").and_then(Value::as_str) {
            Some("enabled") => t
                .get("budget_tokens")
                .and_then(Value::as_u64)
                .map_or(max_tokens / 2, |b| b as usize),
            Some("disabled") => 0,
            _ => {
                return Err(field_error(
                    "thinking",
                    "{\"type\": \"enabled\" | \"disabled\"}",
                ))
            }
        },
        Some(_) => return Err(field_error("thinking", "an object")),
    };
    Ok(MessagesRequest {
        model,
        prompt_text,
        max_tokens,
        thinking_tokens,
        tool_name: forced_tool(&obj)?,
    })
}

/// `tool_choice` `{"type": "any"}` (the first tool) or `{"type": "tool", "name": ...}`
/// with a non-empty `tools` list.
fn forced_tool(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    let first_tool = match obj.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(tools)) if tools.is_empty() => return Ok(None),
        Some(Value::Array(tools)) => tools[0]
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("lab_tool")
            .to_string(),
        Some(_) => return Err(field_error("tools", "a list of tools")),
    };
    let choice = obj.get("tool_choice");
    match choice.and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("any") => Ok(Some(first_tool)),
        Some("tool") => Ok(Some(
            choice
                .and_then(|c| c.get("name"))
                .and_then(Value::as_str)
                .map_or(first_tool, str::to_string),
        )),
        _ => Ok(None),
    }
}

/// A `content_block_delta`, fields in Anthropic's order.
#[derive(Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    delta: DeltaBody<'a>,
}

/// The `delta` of a `content_block_delta`, tagged by its `type`.
#[derive(Serialize)]
#[serde(tag = "type")]
enum DeltaBody<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// Frames one streaming message.
pub(crate) struct MessagesFramer {
    id: String,
    ctx: StreamContext,
    plan: OutputPlan,
    tool_name: String,
    /// The content block open now (its index is its part of the plan).
    open: Option<usize>,
    tokens: usize,
}

impl MessagesFramer {
    pub(crate) fn new(req: &MessagesRequest, ctx: StreamContext) -> Self {
        MessagesFramer {
            id: format!("msg_lab_{}", ctx.request_id),
            plan: OutputPlan::new(req.max_tokens, req.thinking_tokens, req.tool_name.is_some()),
            tool_name: req.tool_name.clone().unwrap_or_default(),
            ctx,
            open: None,
            tokens: 0,
        }
    }

    fn event(out: &mut Vec<u8>, kind: &str, body: Value) {
        let ev = Typed {
            kind,
            body,
            sequence_number: None,
        };
        push_named(out, kind, &to_json(&ev));
    }

    fn start_block(&mut self, out: &mut Vec<u8>, index: usize, kind: PartKind) {
        self.open = Some(index);
        let block = match kind {
            PartKind::Reasoning => json!({"type": "thinking", "thinking": ""}),
            PartKind::Text => json!({"type": "text", "text": ""}),
            PartKind::ToolCall => json!({
                "type": "tool_use", "id": format!("toolu_lab_{}", self.ctx.request_id),
                "name": self.tool_name, "input": {},
            }),
        };
        Self::event(
            out,
            "content_block_start",
            json!({"index": index, "content_block": block}),
        );
    }

    fn stop_block(&mut self, out: &mut Vec<u8>, index: usize) {
        self.open = None;
        Self::event(out, "content_block_stop", json!({"index": index}));
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        let stop_reason = if self.plan.parts().any(|k| k == PartKind::ToolCall) {
            "tool_use"
        } else {
            "max_tokens"
        };
        Self::event(
            out,
            "message_delta",
            json!({
                "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": self.tokens},
            }),
        );
        Self::event(out, "message_stop", json!({}));
    }
}

impl Framer for MessagesFramer {
    fn response_id(&self) -> &str {
        &self.id
    }

    /// `message_start`, the first block's start and a ping, as Anthropic opens a stream.
    fn preamble(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(768);
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.ctx.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.ctx.prompt_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 1},
        });
        Self::event(&mut out, "message_start", json!({"message": message}));
        let first = self.plan.position(0);
        self.start_block(&mut out, first.part, first.kind);
        out.extend_from_slice(&self.keepalive());
        out
    }

    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        self.tokens += 1;
        let pos = self.plan.position(ev.index);
        if let Some(open) = self.open.filter(|&b| b != pos.part) {
            self.stop_block(&mut out, open);
        }
        if self.open.is_none() {
            self.start_block(&mut out, pos.part, pos.kind);
        }
        let piece;
        let delta = match pos.kind {
            PartKind::Reasoning => DeltaBody::Thinking { thinking: &ev.text },
            PartKind::Text => DeltaBody::Text { text: &ev.text },
            PartKind::ToolCall => {
                piece = tool_arguments_piece(&ev.text, pos.first, pos.last || ev.finished);
                DeltaBody::InputJson {
                    partial_json: &piece,
                }
            }
        };
        let json = to_json(&BlockDelta {
            kind: "content_block_delta",
            index: pos.part,
            delta,
        });
        push_named(&mut out, "content_block_delta", &json);
        if ev.finished {
            self.stop_block(&mut out, pos.part);
            self.finish(&mut out);
        }
        out
    }

    fn sends_keepalives(&self) -> bool {
        true
    }

    fn keepalive(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(40);
        Self::event(&mut out, "ping", json!({}));
        out
    }
}
