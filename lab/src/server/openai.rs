//! The OpenAI wire format as vLLM speaks it: request validation, response JSON, SSE frames.
//! Errors never echo request content (prompts must not leak into any output).
use bytes::Bytes;
use serde_json::{json, Value};

use crate::engine::{EngineConfig, TokenEvent};

/// Which generation route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenerationRequest {
    pub endpoint: Endpoint,
    pub model: String,
    /// The text the engine tokenises (chat messages flattened with their roles).
    pub prompt_text: String,
    pub max_tokens: usize,
    pub stream: bool,
    pub include_usage: bool,
}

/// An OpenAI-style error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param,
        }
    }

    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
        }
    }

    /// `{"error": {"message", "type", "param", "code"}}` as OpenAI sends it.
    pub fn body(&self) -> Bytes {
        let v = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        });
        Bytes::from(v.to_string())
    }
}

fn field_error(param: &'static str, expected: &str) -> ApiError {
    ApiError::bad_request(format!("'{param}' must be {expected}"), Some(param))
}

/// Parses and validates a /v1/completions or /v1/chat/completions body.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    cfg: &EngineConfig,
) -> Result<GenerationRequest, ApiError> {
    // Parse to Value first: serde's typed errors would quote the offending value.
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(
            format!(
                "request body is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
            None,
        )
    })?;
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad_request("request body must be a JSON object", None))?;
    let model = match obj.get("model") {
        None | Some(Value::Null) => cfg.model.clone(),
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(field_error("model", "a string")),
    };
    if model != cfg.model {
        return Err(ApiError::new(
            404,
            "NotFoundError",
            format!("The model `{model}` does not exist."),
        ));
    }
    let prompt_text = match endpoint {
        Endpoint::Completions => completion_prompt(obj.get("prompt"))?,
        Endpoint::ChatCompletions => chat_prompt(obj.get("messages"))?,
    };
    let max_tokens = match obj
        .get("max_completion_tokens")
        .or_else(|| obj.get("max_tokens"))
    {
        None | Some(Value::Null) => cfg.default_max_tokens,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(t) if t >= 1 && t as usize <= cfg.max_tokens_limit => t as usize,
            _ => {
                return Err(field_error(
                    "max_tokens",
                    &format!("an integer from 1 to {}", cfg.max_tokens_limit),
                ))
            }
        },
        Some(_) => return Err(field_error("max_tokens", "an integer")),
    };
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(field_error("stream", "a boolean")),
    };
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(field_error("stream_options", "{\"include_usage\": bool}")),
        },
        Some(_) => return Err(field_error("stream_options", "an object")),
    };
    if !stream && obj.get("stream_options").is_some_and(|o| !o.is_null()) {
        return Err(ApiError::bad_request(
            "'stream_options' is only allowed when 'stream' is true",
            Some("stream_options"),
        ));
    }
    match obj.get("n") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(field_error("n", "1 (the lab samples one choice)")),
    }
    Ok(GenerationRequest {
        endpoint,
        model,
        prompt_text,
        max_tokens,
        stream,
        include_usage,
    })
}

fn completion_prompt(p: Option<&Value>) -> Result<String, ApiError> {
    match p {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
            Value::String(s) => Ok(s.clone()),
            // Token ids: one id = one token, as the engine counts words.
            Value::Array(ids) if ids.iter().all(Value::is_u64) => Ok("t ".repeat(ids.len())),
            _ => Err(field_error("prompt", "a string or a list of one string")),
        },
        Some(Value::Array(ids)) if !ids.is_empty() && ids.iter().all(Value::is_u64) => {
            Ok("t ".repeat(ids.len()))
        }
        Some(Value::Array(_)) => Err(field_error(
            "prompt",
            "a string, a list of one string, or token ids (batches are not supported)",
        )),
        None | Some(Value::Null) => Err(ApiError::bad_request(
            "'prompt' is required",
            Some("prompt"),
        )),
        Some(_) => Err(field_error("prompt", "a string")),
    }
}

fn chat_prompt(m: Option<&Value>) -> Result<String, ApiError> {
    let messages = match m {
        Some(Value::Array(a)) if !a.is_empty() => a,
        None | Some(Value::Null) => {
            return Err(ApiError::bad_request(
                "'messages' is required",
                Some("messages"),
            ))
        }
        Some(_) => return Err(field_error("messages", "a non-empty list of messages")),
    };
    let mut text = String::new();
    for msg in messages {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| field_error("messages", "messages with a string 'role'"))?;
        if !matches!(
            role,
            "system" | "user" | "assistant" | "tool" | "developer" | "function"
        ) {
            return Err(field_error(
                "messages",
                "messages whose role is system, user, assistant, tool or developer",
            ));
        }
        text.push_str(role);
        text.push_str(": ");
        match msg.get("content") {
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    match part.get("text").and_then(Value::as_str) {
                        Some(t) => {
                            text.push_str(t);
                            text.push(' ');
                        }
                        None => {
                            return Err(field_error(
                                "messages",
                                "content parts of type text with a 'text' string",
                            ))
                        }
                    }
                }
            }
            None | Some(Value::Null) if role == "assistant" => {}
            _ => return Err(field_error("messages", "messages with string content")),
        }
        text.push('\n');
    }
    Ok(text)
}

/// Turns engine tokens into SSE frames: `data: {json}\n\n`, then `data: [DONE]\n\n`.
pub struct StreamFormatter {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl StreamFormatter {
    pub fn new(req: &GenerationRequest, id: String, created: u64, prompt_tokens: usize) -> Self {
        StreamFormatter {
            endpoint: req.endpoint,
            id,
            created,
            model: req.model.clone(),
            include_usage: req.include_usage,
            prompt_tokens,
            completion_tokens: 0,
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::ChatCompletions => "chat.completion.chunk",
        };
        let mut v = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    fn push_event(out: &mut Vec<u8>, v: &Value) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(v.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// The frame(s) for one token, written in one piece: the chat role chunk precedes the
    /// first token (as vLLM sends it), the usage chunk and [DONE] follow the last.
    pub fn on_token(&mut self, ev: &TokenEvent) -> Bytes {
        let mut out = Vec::with_capacity(256);
        let finish = if ev.finished {
            Value::from("length")
        } else {
            Value::Null
        };
        self.completion_tokens += 1;
        match self.endpoint {
            Endpoint::Completions => {
                let c = self.chunk(json!([{
                    "index": 0, "text": ev.text, "logprobs": null,
                    "finish_reason": finish, "stop_reason": null,
                }]));
                Self::push_event(&mut out, &c);
            }
            Endpoint::ChatCompletions => {
                if ev.index == 0 {
                    let role = self.chunk(json!([{
                        "index": 0, "delta": {"role": "assistant", "content": ""},
                        "logprobs": null, "finish_reason": null,
                    }]));
                    Self::push_event(&mut out, &role);
                }
                let c = self.chunk(json!([{
                    "index": 0, "delta": {"content": ev.text}, "logprobs": null,
                    "finish_reason": finish, "stop_reason": null,
                }]));
                Self::push_event(&mut out, &c);
            }
        }
        if ev.finished {
            if self.include_usage {
                let mut u = self.chunk(json!([]));
                u["usage"] = usage(
                    self.prompt_tokens,
                    self.completion_tokens,
                    ev.cached_prompt_tokens,
                );
                Self::push_event(&mut out, &u);
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        Bytes::from(out)
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// The non-streaming response body.
pub fn full_response(
    req: &GenerationRequest,
    id: &str,
    created: u64,
    prompt_tokens: usize,
    tokens: &[TokenEvent],
) -> Bytes {
    let text: String = tokens.iter().map(|t| t.text.as_str()).collect();
    let cached = tokens.last().map(|t| t.cached_prompt_tokens).unwrap_or(0);
    let finish = if tokens.last().is_some_and(|t| t.finished) {
        Value::from("length")
    } else {
        Value::Null
    };
    let usage = usage(prompt_tokens, tokens.len(), cached);
    let v = match req.endpoint {
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "text": text, "logprobs": null,
                         "finish_reason": finish, "stop_reason": null}],
            "usage": usage,
        }),
        Endpoint::ChatCompletions => json!({
            "id": id, "object": "chat.completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": null, "finish_reason": finish, "stop_reason": null}],
            "usage": usage,
        }),
    };
    Bytes::from(v.to_string())
}

/// `/v1/models`.
pub fn models_body(cfg: &EngineConfig, created: u64) -> Bytes {
    Bytes::from(
        json!({
            "object": "list",
            "data": [{"id": cfg.model, "object": "model", "created": created,
                      "owned_by": "tokenscope-lab", "root": cfg.model, "parent": null,
                      "max_model_len": 32768}],
        })
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_bodies_are_400_without_echoing_content() {
        let cfg = EngineConfig::default();
        for body in [
            &b"{not json"[..],
            b"[1,2]",
            b"{\"prompt\": 5}",
            b"{\"prompt\": \"secret words\", \"max_tokens\": \"secret\"}",
            b"{\"prompt\": \"x\", \"stream\": \"yes\"}",
        ] {
            let e = parse_request(Endpoint::Completions, body, &cfg).expect_err("must be rejected");
            assert_eq!(e.status, 400, "malformed body gives 400");
            assert!(
                !e.message.contains("secret"),
                "error must not echo the request"
            );
        }
        let e = parse_request(Endpoint::ChatCompletions, b"{\"messages\": []}", &cfg).unwrap_err();
        assert_eq!(e.status, 400, "empty messages give 400");
    }

    #[test]
    fn stream_frames_follow_vllm() {
        let cfg = EngineConfig::default();
        let req = parse_request(
            Endpoint::ChatCompletions,
            br#"{"messages":[{"role":"user","content":"hi"}],"stream":true,
                 "stream_options":{"include_usage":true}}"#,
            &cfg,
        )
        .unwrap();
        let mut f = StreamFormatter::new(&req, "chatcmpl-1".into(), 0, 2);
        let first = f.on_token(&TokenEvent {
            index: 0,
            text: " ka".into(),
            finished: false,
            cached_prompt_tokens: 0,
        });
        let first = std::str::from_utf8(&first).unwrap();
        assert_eq!(
            first.matches("data: ").count(),
            2,
            "role chunk then first token"
        );
        assert!(first.ends_with("\n\n"), "each event ends with a blank line");
        let last = f.on_token(&TokenEvent {
            index: 1,
            text: " lo".into(),
            finished: true,
            cached_prompt_tokens: 0,
        });
        let last = std::str::from_utf8(&last).unwrap();
        assert!(
            last.ends_with("data: [DONE]\n\n"),
            "stream ends with [DONE]"
        );
        assert!(
            last.contains("\"completion_tokens\":2"),
            "usage chunk counts tokens"
        );
    }
}
