//! The OpenAI Responses API (`POST /v1/responses`, streaming): typed SSE events with a
//! sequence number, output items (reasoning, message, function call) opened and closed
//! around their deltas, `response.completed` with the usage last. No `[DONE]`.
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::error::{field_error, ApiError};
use super::fields;
use super::framing::{
    push_named, to_json, tool_arguments_piece, Framer, OutputPlan, PartKind, StreamContext, Typed,
};
use crate::engine::{EngineConfig, TokenEvent};

/// A validated /v1/responses request.
#[derive(Debug, Clone)]
pub(crate) struct ResponsesRequest {
    pub(crate) model: String,
    pub(crate) prompt_text: String,
    pub(crate) max_tokens: usize,
    /// Tokens of reasoning before the answer (from `reasoning.effort`).
    pub(crate) reasoning_tokens: usize,
    /// `tool_choice: "required"` with tools: the answer is a function call's arguments.
    pub(crate) tool_name: Option<String>,
}

/// Parses a /v1/responses body; the lab serves it streaming only.
pub(crate) fn parse(body: &[u8], cfg: &EngineConfig) -> Result<ResponsesRequest, ApiError> {
    let obj = fields::json_object(body)?;
    let model = fields::model(&obj, cfg)?;
    fields::streaming_only(&obj, "/v1/responses")?;
    let mut prompt_text = match obj.get("instructions") {
        Some(Value::String(s)) => format!("system: {s}\n"),
        None | Some(Value::Null) => String::new(),
        Some(_) => return Err(field_error("instructions", "a string")),
    };
    match obj.get("input") {
        Some(Value::String(s)) => prompt_text.push_str(&format!("user: {s}\n")),
        list @ Some(Value::Array(_)) => {
            const ROLES: [&str; 4] = ["system", "developer", "user", "assistant"];
            prompt_text.push_str(&fields::messages_text(list, "input", &ROLES)?);
        }
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request("'input' is required", Some("input")))
        }
        Some(_) => return Err(field_error("input", "a string or a list of messages")),
    }
    let max_tokens = fields::max_tokens(obj.get("max_output_tokens"), "max_output_tokens", cfg)?;
    let reasoning_tokens =
        reasoning_share(obj.get("reasoning"))?.map_or(0, |(num, den)| max_tokens * num / den);
    Ok(ResponsesRequest {
        model,
        prompt_text,
        max_tokens,
        reasoning_tokens,
        tool_name: forced_tool(&obj)?,
    })
}

/// The share of the output `reasoning.effort` spends reasoning (numerator, denominator).
fn reasoning_share(reasoning: Option<&Value>) -> Result<Option<(usize, usize)>, ApiError> {
    let effort = match reasoning {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o.get("effort").and_then(Value::as_str).unwrap_or("medium"),
        Some(_) => return Err(field_error("reasoning", "an object")),
    };
    match effort {
        "minimal" => Ok(Some((1, 8))),
        "low" => Ok(Some((1, 4))),
        "medium" => Ok(Some((1, 2))),
        "high" => Ok(Some((3, 4))),
        _ => Err(field_error(
            "reasoning",
            "{\"effort\": \"minimal\" | \"low\" | \"medium\" | \"high\"}",
        )),
    }
}

/// The function the request forces a call to: `tool_choice` `"required"` (the first
/// tool) or `{"type": "function", "name": ...}`, with a non-empty `tools` list.
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
    match obj.get("tool_choice") {
        Some(Value::String(s)) if s == "required" => Ok(Some(first_tool)),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            Ok(Some(
                o.get("name")
                    .and_then(Value::as_str)
                    .map_or(first_tool, str::to_string),
            ))
        }
        _ => Ok(None),
    }
}

/// A delta event, its fields in the order the Responses API writes them.
#[derive(Serialize)]
struct Delta<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    item_id: &'a str,
    output_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<usize>,
    delta: &'a str,
    sequence_number: u64,
}

/// One output item as it builds up.
struct Item {
    kind: PartKind,
    id: String,
    text: String,
}

/// Frames one streaming response.
pub(crate) struct ResponsesFramer {
    id: String,
    ctx: StreamContext,
    plan: OutputPlan,
    tool_name: String,
    /// The item a delta is being written to, if one is open.
    open: Option<usize>,
    items: Vec<Item>,
    sequence: u64,
    tokens: usize,
    cached: usize,
}

impl ResponsesFramer {
    pub(crate) fn new(req: &ResponsesRequest, ctx: StreamContext) -> Self {
        let plan = OutputPlan::new(
            req.max_tokens,
            req.reasoning_tokens,
            req.tool_name.is_some(),
        );
        ResponsesFramer {
            id: format!("resp_lab_{}", ctx.request_id),
            ctx,
            plan,
            tool_name: req.tool_name.clone().unwrap_or_default(),
            open: None,
            items: Vec::new(),
            sequence: 0,
            tokens: 0,
            cached: 0,
        }
    }

    fn event(&mut self, out: &mut Vec<u8>, kind: &str, body: Value) {
        let ev = Typed {
            kind,
            body,
            sequence_number: Some(self.sequence),
        };
        self.sequence += 1;
        push_named(out, kind, &to_json(&ev));
    }

    fn item_json(&self, index: usize, done: bool) -> Value {
        let item = &self.items[index];
        let status = if done { "completed" } else { "in_progress" };
        let n = self.ctx.request_id;
        match item.kind {
            PartKind::Reasoning => {
                let content = if done {
                    json!([{"type": "reasoning_text", "text": item.text}])
                } else {
                    json!([])
                };
                json!({"id": item.id, "type": "reasoning", "summary": [], "content": content})
            }
            PartKind::Text => {
                let content = if done {
                    json!([{"type": "output_text", "text": item.text, "annotations": []}])
                } else {
                    json!([])
                };
                json!({"id": item.id, "type": "message", "status": status,
                       "role": "assistant", "content": content})
            }
            PartKind::ToolCall => json!({
                "id": item.id, "type": "function_call", "status": status,
                "call_id": format!("call_lab_{n}"), "name": self.tool_name,
                "arguments": if done { item.text.as_str() } else { "" },
            }),
        }
    }

    fn response_json(&self, done: bool) -> Value {
        let (status, output, usage) = if done {
            let output: Vec<Value> = (0..self.items.len())
                .map(|i| self.item_json(i, true))
                .collect();
            let p = self.ctx.prompt_tokens;
            let usage = json!({
                "input_tokens": p,
                "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": self.tokens,
                "output_tokens_details": {"reasoning_tokens": self.plan.reasoning_tokens()},
                "total_tokens": p + self.tokens,
            });
            ("completed", output, usage)
        } else {
            ("in_progress", Vec::new(), Value::Null)
        };
        json!({
            "id": self.id, "object": "response", "created_at": self.ctx.created_unix,
            "status": status, "model": self.ctx.model, "output": output, "usage": usage,
        })
    }

    fn open_item(&mut self, out: &mut Vec<u8>, kind: PartKind) {
        let n = self.ctx.request_id;
        let id = match kind {
            PartKind::Reasoning => format!("rs_lab_{n}"),
            PartKind::Text => format!("msg_lab_{n}"),
            PartKind::ToolCall => format!("fc_lab_{n}"),
        };
        self.items.push(Item {
            kind,
            id: id.clone(),
            text: String::new(),
        });
        let index = self.items.len() - 1;
        self.open = Some(index);
        let item = self.item_json(index, false);
        self.event(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let part = match kind {
            PartKind::Reasoning => json!({"type": "reasoning_text", "text": ""}),
            PartKind::Text => json!({"type": "output_text", "text": "", "annotations": []}),
            PartKind::ToolCall => return,
        };
        self.event(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
    }

    fn close_item(&mut self, out: &mut Vec<u8>, index: usize) {
        self.open = None;
        let (kind, id, text) = {
            let it = &self.items[index];
            (it.kind, it.id.clone(), it.text.clone())
        };
        let at = json!({"item_id": id, "output_index": index});
        let (done_kind, part) = match kind {
            PartKind::Reasoning => (
                "response.reasoning_text.done",
                json!({"type": "reasoning_text", "text": text}),
            ),
            PartKind::Text => (
                "response.output_text.done",
                json!({"type": "output_text", "text": text, "annotations": []}),
            ),
            PartKind::ToolCall => {
                let mut body = at;
                body["arguments"] = Value::from(text);
                self.event(out, "response.function_call_arguments.done", body);
                let item = self.item_json(index, true);
                self.event(
                    out,
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                );
                return;
            }
        };
        let mut body = at.clone();
        body["content_index"] = Value::from(0);
        body["text"] = Value::from(text);
        self.event(out, done_kind, body);
        let mut body = at;
        body["content_index"] = Value::from(0);
        body["part"] = part;
        self.event(out, "response.content_part.done", body);
        let item = self.item_json(index, true);
        self.event(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    fn delta(&mut self, out: &mut Vec<u8>, index: usize, piece: &str) {
        let item = &self.items[index];
        let (kind, content_index) = match item.kind {
            PartKind::Reasoning => ("response.reasoning_text.delta", Some(0)),
            PartKind::Text => ("response.output_text.delta", Some(0)),
            PartKind::ToolCall => ("response.function_call_arguments.delta", None),
        };
        let ev = Delta {
            kind,
            item_id: &item.id,
            output_index: index,
            content_index,
            delta: piece,
            sequence_number: self.sequence,
        };
        let json = to_json(&ev);
        self.sequence += 1;
        push_named(out, kind, &json);
        self.items[index].text.push_str(piece);
    }
}

impl Framer for ResponsesFramer {
    fn response_id(&self) -> &str {
        &self.id
    }

    fn preamble(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(1024);
        let response = self.response_json(false);
        self.event(&mut out, "response.created", json!({"response": response}));
        let response = self.response_json(false);
        self.event(
            &mut out,
            "response.in_progress",
            json!({"response": response}),
        );
        out
    }

    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        self.tokens += 1;
        self.cached = ev.cached_prompt_tokens;
        let pos = self.plan.position(ev.index);
        if let Some(open) = self.open.filter(|&o| self.items[o].kind != pos.kind) {
            self.close_item(&mut out, open);
        }
        let index = match self.open {
            Some(i) => i,
            None => {
                self.open_item(&mut out, pos.kind);
                self.items.len() - 1
            }
        };
        let piece = match pos.kind {
            PartKind::ToolCall => {
                tool_arguments_piece(&ev.text, pos.first, pos.last || ev.finished)
            }
            _ => ev.text.clone(),
        };
        self.delta(&mut out, index, &piece);
        if ev.finished {
            self.close_item(&mut out, index);
            let response = self.response_json(true);
            self.event(
                &mut out,
                "response.completed",
                json!({"response": response}),
            );
        }
        out
    }
}
