//! Error responses in each API's own shape. Messages never echo request content (prompts
//! must not leak into any output).
use bytes::Bytes;
use serde_json::json;

use crate::api::Api;

/// An error answer: status, a message in words, and OpenAI's error type.
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

    /// The body as `api`'s servers shape their errors.
    pub fn body_for(&self, api: Api) -> Bytes {
        let v = match api {
            Api::OpenAiChat | Api::OpenAiCompletions | Api::OpenAiResponses => return self.body(),
            Api::Anthropic => json!({
                "type": "error",
                "error": {"type": self.anthropic_type(), "message": self.message},
            }),
            Api::Gemini => json!({
                "error": {"code": self.status, "message": self.message,
                          "status": self.google_status()},
            }),
            Api::Tgi => json!({"error": self.message, "error_type": self.tgi_type()}),
            Api::OllamaGenerate | Api::OllamaChat => json!({"error": self.message}),
        };
        Bytes::from(v.to_string())
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status {
            404 => "not_found_error",
            413 => "request_too_large",
            503 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    fn google_status(&self) -> &'static str {
        match self.status {
            404 => "NOT_FOUND",
            408 => "DEADLINE_EXCEEDED",
            503 => "UNAVAILABLE",
            s if s >= 500 => "INTERNAL",
            _ => "INVALID_ARGUMENT",
        }
    }

    fn tgi_type(&self) -> &'static str {
        match self.status {
            s if s >= 500 => "overloaded",
            _ => "validation",
        }
    }
}

/// `'param' must be ...`, pointing at the field.
pub(crate) fn field_error(param: &'static str, expected: &str) -> ApiError {
    ApiError::bad_request(format!("'{param}' must be {expected}"), Some(param))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_gets_its_own_error_shape() {
        let e = ApiError::bad_request("'max_tokens' must be an integer", Some("max_tokens"));
        for api in Api::ALL {
            let v: serde_json::Value =
                serde_json::from_slice(&e.body_for(api)).expect("error bodies are JSON");
            let message = match api {
                Api::OpenAiChat | Api::OpenAiCompletions | Api::OpenAiResponses => {
                    &v["error"]["message"]
                }
                Api::Anthropic => &v["error"]["message"],
                Api::Gemini => &v["error"]["message"],
                Api::Tgi | Api::OllamaGenerate | Api::OllamaChat => &v["error"],
            };
            assert_eq!(
                message.as_str(),
                Some(e.message.as_str()),
                "{api}: the message sits where its clients look: {v}"
            );
        }
    }
}
