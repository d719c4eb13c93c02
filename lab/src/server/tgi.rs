//! Hugging Face TGI's native `POST /generate_stream`: `data:{json}` events (no space after
//! the colon, as TGI writes them), one per token; the stream closes with the EOS token
//! (`special: true`) carrying the whole `generated_text` and the `details`. The EOS event
//! is written with the last token: `max_new_tokens` counts the text tokens only.
use serde::Serialize;
use serde_json::{json, Value};

use super::error::{field_error, ApiError};
use super::fields;
use super::framing::{to_json, Framer, StreamContext};
use crate::engine::{EngineConfig, TokenEvent};
use crate::words::seed_of;

/// The id TGI's tokenisers give `</s>`.
const EOS_ID: u32 = 2;

/// A validated /generate_stream request.
#[derive(Debug, Clone)]
pub(crate) struct TgiRequest {
    pub(crate) prompt_text: String,
    pub(crate) max_tokens: usize,
}

/// Parses `{"inputs": "...", "parameters": {"max_new_tokens": N}}`.
pub(crate) fn parse(body: &[u8], cfg: &EngineConfig) -> Result<TgiRequest, ApiError> {
    let obj = fields::json_object(body)?;
    let prompt_text = match obj.get("inputs") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(field_error("inputs", "a string")),
    };
    let limit = match obj.get("parameters") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => p.get("max_new_tokens"),
        Some(_) => return Err(field_error("parameters", "an object")),
    };
    let max_tokens = fields::max_tokens(limit, "parameters.max_new_tokens", cfg)?;
    Ok(TgiRequest {
        prompt_text,
        max_tokens,
    })
}

#[derive(Serialize)]
struct Token<'a> {
    id: u32,
    text: &'a str,
    logprob: f64,
    special: bool,
}

/// One stream event, fields in TGI's order.
#[derive(Serialize)]
struct StreamEvent<'a> {
    index: usize,
    token: Token<'a>,
    generated_text: Option<&'a str>,
    details: Value,
}

/// Frames one /generate_stream response.
pub(crate) struct TgiFramer {
    id: String,
    text: String,
}

impl TgiFramer {
    pub(crate) fn new(ctx: &StreamContext) -> Self {
        TgiFramer {
            id: format!("tgi-lab-{}", ctx.request_id),
            text: String::new(),
        }
    }
}

fn push_event(out: &mut Vec<u8>, ev: &StreamEvent<'_>) {
    out.extend_from_slice(b"data:");
    out.extend_from_slice(to_json(ev).as_bytes());
    out.extend_from_slice(b"\n\n");
}

impl Framer for TgiFramer {
    fn response_id(&self) -> &str {
        &self.id
    }

    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        let h = seed_of(&ev.text);
        self.text.push_str(&ev.text);
        push_event(
            &mut out,
            &StreamEvent {
                index: ev.index + 1,
                token: Token {
                    id: 3 + (h % 32_000) as u32,
                    text: &ev.text,
                    logprob: -(((h >> 20) % 2000) as f64) / 1000.0,
                    special: false,
                },
                generated_text: None,
                details: Value::Null,
            },
        );
        if ev.finished {
            push_event(
                &mut out,
                &StreamEvent {
                    index: ev.index + 2,
                    token: Token {
                        id: EOS_ID,
                        text: "</s>",
                        logprob: -0.01,
                        special: true,
                    },
                    generated_text: Some(&self.text),
                    details: json!({
                        "finish_reason": "eos_token",
                        "generated_tokens": ev.index + 1,
                        "seed": null,
                    }),
                },
            );
        }
        out
    }
}
