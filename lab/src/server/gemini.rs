//! Gemini (`POST /v1beta/models/{model}:streamGenerateContent?alt=sse`): SSE events
//! without names, each a whole `GenerateContentResponse` with one token's text. The last
//! one carries the last token's text together with `finishReason` and `usageMetadata`.
//! Events end with CRLF CRLF, as Google's front ends write them. No `[DONE]`.
use serde_json::{json, Value};

use super::error::{field_error, ApiError};
use super::fields;
use super::framing::{Framer, StreamContext};
use crate::engine::{EngineConfig, TokenEvent};

/// The path's prefix and suffix around the model name.
const PATH_PREFIX: &str = "/v1beta/models/";
const STREAM_METHOD: &str = ":streamGenerateContent";

/// The model named by a streamGenerateContent path, if `path` is one.
pub(crate) fn model_of_path(path: &str) -> Option<&str> {
    path.strip_prefix(PATH_PREFIX)?.strip_suffix(STREAM_METHOD)
}

/// A validated streamGenerateContent request.
#[derive(Debug, Clone)]
pub(crate) struct GeminiRequest {
    pub(crate) model: String,
    pub(crate) prompt_text: String,
    pub(crate) max_tokens: usize,
}

/// Parses the path's model, the query (`alt=sse`: the lab streams SSE only) and the body.
pub(crate) fn parse(
    path_model: &str,
    query: Option<&str>,
    body: &[u8],
    cfg: &EngineConfig,
) -> Result<GeminiRequest, ApiError> {
    let sse = query.is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
    if !sse {
        return Err(ApiError::bad_request(
            "the lab streams Gemini as server-sent events only: add ?alt=sse",
            Some("alt"),
        ));
    }
    let model = fields::known_model(path_model.to_string(), cfg)?;
    let obj = fields::json_object(body)?;
    let mut prompt_text = String::new();
    if let Some(system) = obj.get("systemInstruction").filter(|v| !v.is_null()) {
        let text = fields::content_text(system.get("parts"), "systemInstruction")?;
        prompt_text.push_str(&format!("system: {}\n", text.unwrap_or_default()));
    }
    let contents = match obj.get("contents") {
        Some(Value::Array(c)) if !c.is_empty() => c,
        _ => return Err(field_error("contents", "a non-empty list of contents")),
    };
    for content in contents {
        let role = content
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        let text = fields::content_text(content.get("parts"), "contents")?;
        prompt_text.push_str(&format!("{role}: {}\n", text.unwrap_or_default()));
    }
    let limit = obj
        .get("generationConfig")
        .and_then(|g| g.get("maxOutputTokens"));
    let max_tokens = fields::max_tokens(limit, "generationConfig.maxOutputTokens", cfg)?;
    Ok(GeminiRequest {
        model,
        prompt_text,
        max_tokens,
    })
}

/// Frames one streamGenerateContent response.
pub(crate) struct GeminiFramer {
    id: String,
    ctx: StreamContext,
    tokens: usize,
}

impl GeminiFramer {
    pub(crate) fn new(ctx: StreamContext) -> Self {
        GeminiFramer {
            id: format!("lab-{}", ctx.request_id),
            ctx,
            tokens: 0,
        }
    }
}

impl Framer for GeminiFramer {
    fn response_id(&self) -> &str {
        &self.id
    }

    fn on_token(&mut self, ev: &TokenEvent) -> Vec<u8> {
        self.tokens += 1;
        let mut candidate = json!({
            "content": {"parts": [{"text": ev.text}], "role": "model"},
            "index": 0,
        });
        let mut chunk = json!({
            "candidates": [],
            "modelVersion": self.ctx.model,
            "responseId": self.id,
        });
        if ev.finished {
            candidate["finishReason"] = Value::from("STOP");
            let p = self.ctx.prompt_tokens;
            let mut usage = json!({
                "promptTokenCount": p,
                "candidatesTokenCount": self.tokens,
                "totalTokenCount": p + self.tokens,
            });
            if ev.cached_prompt_tokens > 0 {
                usage["cachedContentTokenCount"] = Value::from(ev.cached_prompt_tokens);
            }
            chunk["usageMetadata"] = usage;
        }
        chunk["candidates"] = json!([candidate]);
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(chunk.to_string().as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_model_and_requests_need_alt_sse() {
        assert_eq!(
            model_of_path("/v1beta/models/lab-model:streamGenerateContent"),
            Some("lab-model")
        );
        assert_eq!(
            model_of_path("/v1beta/models/lab-model:generateContent"),
            None
        );
        let cfg = EngineConfig::default();
        let body = br#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;
        assert!(
            parse("lab-model", None, body, &cfg).is_err(),
            "alt=sse is required"
        );
        let req = parse("lab-model", Some("alt=sse"), body, &cfg).expect("a valid request");
        assert_eq!(req.max_tokens, cfg.default_max_tokens);
        let e = parse("other", Some("alt=sse"), body, &cfg).expect_err("unknown model");
        assert_eq!(e.status, 404);
    }
}
