//! The OpenAI wire format as vLLM speaks it: request validation, response JSON, SSE frames.
//! Errors never echo request content (prompts must not leak into any output).
use bytes::Bytes;
use serde_json::{json, Value};

use super::error::field_error;
pub use super::error::ApiError;
use super::fields;
use super::framing::{push_data, Framer};
pub use crate::api::MAX_CHOICES;
use crate::engine::{EngineConfig, TokenEvent};
use crate::words::{pseudo_word, seed_of};

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
    /// Choices sampled per step (`n`): each engine step yields one token for each.
    pub n: usize,
}

/// Parses and validates a /v1/completions or /v1/chat/completions body.
pub fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    cfg: &EngineConfig,
) -> Result<GenerationRequest, ApiError> {
    let obj = fields::json_object(body)?;
    let model = fields::model(&obj, cfg)?;
    let prompt_text = match endpoint {
        Endpoint::Completions => completion_prompt(obj.get("prompt"))?,
        Endpoint::ChatCompletions => chat_prompt(obj.get("messages"))?,
    };
    let max_tokens = fields::max_tokens(
        obj.get("max_completion_tokens")
            .or_else(|| obj.get("max_tokens")),
        "max_tokens",
        cfg,
    )?;
    let stream = fields::boolean(&obj, "stream", false)?;
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
    let n = match obj.get("n") {
        None | Some(Value::Null) => 1,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(n) if (1..=MAX_CHOICES as u64).contains(&n) => n as usize,
            _ => {
                return Err(field_error(
                    "n",
                    &format!("an integer from 1 to {MAX_CHOICES}"),
                ))
            }
        },
        Some(_) => return Err(field_error("n", "an integer")),
    };
    Ok(GenerationRequest {
        endpoint,
        model,
        prompt_text,
        max_tokens,
        stream,
        include_usage,
        n,
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

/// Chat messages flattened with their roles.
fn chat_prompt(m: Option<&Value>) -> Result<String, ApiError> {
    const ROLES: [&str; 6] = [
        "system",
        "user",
        "assistant",
        "tool",
        "developer",
        "function",
    ];
    fields::messages_text(m, "messages", &ROLES)
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
    n: usize,
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
            n: req.n.max(1),
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
        push_data(out, &v.to_string());
    }

    /// The chunk of choice `index`'s token.
    fn token_chunk(&self, ev: &TokenEvent, index: usize) -> Value {
        let finish = if ev.finished {
            Value::from("length")
        } else {
            Value::Null
        };
        let text = choice_text(ev, index);
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": text, "logprobs": null,
                "finish_reason": finish, "stop_reason": null,
            }),
            Endpoint::ChatCompletions => json!({
                "index": index, "delta": {"content": text}, "logprobs": null,
                "finish_reason": finish, "stop_reason": null,
            }),
        };
        self.chunk(json!([choice]))
    }
}

/// Choice `index`'s text for an engine token: choice 0 is the engine's word, the others
/// words of their own (the same step samples every choice).
fn choice_text(ev: &TokenEvent, index: usize) -> String {
    if index == 0 {
        ev.text.clone()
    } else {
        let seed =
            seed_of(&ev.text).wrapping_add((index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        format!(" {}", pseudo_word(seed, ev.index as u64))
    }
}

impl Framer for StreamFormatter {
    fn response_id(&self) -> &str {
        &self.id
    }

    /// The frame(s) for one token, written in one piece: the chat role chunks (one per
    /// choice) precede the first tokens (as vLLM sends them), then one chunk per choice;
    /// the usage chunk and [DONE] follow the last.
    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 * self.n);
        self.completion_tokens += self.n;
        if self.endpoint == Endpoint::ChatCompletions && ev.index == 0 {
            for index in 0..self.n {
                let role = self.chunk(json!([{
                    "index": index, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null,
                }]));
                Self::push_event(&mut out, &role);
            }
        }
        for index in 0..self.n {
            Self::push_event(&mut out, &self.token_chunk(ev, index));
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
        out
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

/// The non-streaming response: the same words as the stream would carry, per choice.
pub struct WholeResponse {
    pub req: GenerationRequest,
    pub id: String,
    pub created: u64,
    pub prompt_tokens: usize,
}

impl Framer for WholeResponse {
    fn response_id(&self) -> &str {
        &self.id
    }

    fn on_token(&mut self, _ev: &TokenEvent) -> Vec<u8> {
        Vec::new()
    }

    fn whole_body(&self, tokens: &[TokenEvent]) -> Option<Bytes> {
        Some(full_response(
            &self.req,
            &self.id,
            self.created,
            self.prompt_tokens,
            tokens,
        ))
    }
}

/// The non-streaming response body.
pub fn full_response(
    req: &GenerationRequest,
    id: &str,
    created: u64,
    prompt_tokens: usize,
    tokens: &[TokenEvent],
) -> Bytes {
    let cached = tokens.last().map(|t| t.cached_prompt_tokens).unwrap_or(0);
    let finish = if tokens.last().is_some_and(|t| t.finished) {
        Value::from("length")
    } else {
        Value::Null
    };
    let n = req.n.max(1);
    let choices: Vec<Value> = (0..n)
        .map(|index| {
            let text: String = tokens.iter().map(|t| choice_text(t, index)).collect();
            match req.endpoint {
                Endpoint::Completions => json!({
                    "index": index, "text": text, "logprobs": null,
                    "finish_reason": finish, "stop_reason": null,
                }),
                Endpoint::ChatCompletions => json!({
                    "index": index, "message": {"role": "assistant", "content": text},
                    "logprobs": null, "finish_reason": finish, "stop_reason": null,
                }),
            }
        })
        .collect();
    let usage = usage(prompt_tokens, tokens.len() * n, cached);
    let object = match req.endpoint {
        Endpoint::Completions => "text_completion",
        Endpoint::ChatCompletions => "chat.completion",
    };
    let v = json!({
        "id": id, "object": object, "created": created, "model": req.model,
        "choices": choices, "usage": usage,
    });
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
