//! The request bench sends for each API: its body (the same prompt words, each in that
//! API's fields), the headers its servers expect, and what ends its response.
use bytes::Bytes;
use serde_json::{json, Value};

use super::{prompt_words, BenchConfig, BenchError};
use crate::api::{Api, MAX_CHOICES};

/// The tool a `--tool-call` request forces.
const TOOL_NAME: &str = "search";

/// Refuses options the chosen API has no field for.
pub fn check(cfg: &BenchConfig) -> Result<(), BenchError> {
    let api = cfg.api();
    let bad = |why: String| Err(BenchError::Config(why));
    if !(1..=MAX_CHOICES).contains(&cfg.n) {
        return bad(format!("--n must be from 1 to {MAX_CHOICES}"));
    }
    if cfg.n > 1 && !api.has_choices() {
        return bad(format!(
            "--n applies to openai-chat and openai-completions, not {api}"
        ));
    }
    if !cfg.stream && !api.can_answer_whole() {
        return bad(format!("--no-stream: the lab serves {api} streaming only"));
    }
    if (cfg.reasoning || cfg.tool_call) && !api.has_reasoning_and_tools() {
        return bad(format!(
            "--reasoning and --tool-call apply to openai-responses and anthropic, not {api}"
        ));
    }
    Ok(())
}

/// The event that ends a response of `api` (for error messages).
pub fn end_event(api: Api, stream: bool) -> &'static str {
    match (api, stream) {
        (_, false) => "a complete JSON body",
        (Api::OpenAiChat | Api::OpenAiCompletions, true) => "[DONE]",
        (Api::OpenAiResponses, true) => "response.completed",
        (Api::Anthropic, true) => "message_stop",
        (Api::Gemini, true) => "a finishReason",
        (Api::Tgi, true) => "generated_text",
        (Api::OllamaGenerate | Api::OllamaChat, true) => "\"done\": true",
    }
}

/// The Accept header a client of `api` sends.
pub fn accept(api: Api, stream: bool) -> &'static str {
    match (stream, api.is_ndjson()) {
        (false, _) => "application/json",
        (true, true) => "application/x-ndjson",
        (true, false) => "text/event-stream",
    }
}

/// Headers the API's servers require beside the body (Anthropic's version header).
pub fn extra_headers(api: Api) -> &'static [(&'static str, &'static str)] {
    match api {
        Api::Anthropic => &[("anthropic-version", "2023-06-01")],
        _ => &[],
    }
}

/// The body of request `index` and its prompt length in words.
pub fn body(cfg: &BenchConfig, index: u64, run_seed: u64) -> (Bytes, usize) {
    let (prefix, own, total) = prompt_words(cfg, index, run_seed);
    let body = match cfg.api() {
        api @ (Api::OpenAiChat | Api::OpenAiCompletions) => openai(cfg, api, &prefix, own),
        Api::OpenAiResponses => responses(cfg, &prefix, own),
        Api::Anthropic => anthropic(cfg, &prefix, own),
        Api::Gemini => gemini(cfg, &prefix, own),
        Api::Tgi => json!({
            "inputs": joined(&prefix, &own),
            "parameters": {"max_new_tokens": cfg.max_tokens},
        }),
        Api::OllamaGenerate => {
            let mut b = ollama(cfg);
            b["prompt"] = Value::from(own);
            if !prefix.is_empty() {
                b["system"] = Value::from(prefix);
            }
            b
        }
        Api::OllamaChat => {
            let mut b = ollama(cfg);
            b["messages"] = messages(&prefix, own);
            b
        }
    };
    (Bytes::from(body.to_string()), total)
}

fn joined(prefix: &str, own: &str) -> String {
    let sep = if prefix.is_empty() || own.is_empty() {
        ""
    } else {
        " "
    };
    format!("{prefix}{sep}{own}")
}

/// A system message for the shared prefix (if any), then the user's words.
fn messages(prefix: &str, own: String) -> Value {
    let mut messages = Vec::new();
    if !prefix.is_empty() {
        messages.push(json!({"role": "system", "content": prefix}));
    }
    messages.push(json!({"role": "user", "content": own}));
    Value::Array(messages)
}

fn openai(cfg: &BenchConfig, api: Api, prefix: &str, own: String) -> Value {
    let mut body = json!({
        "model": cfg.model,
        "max_tokens": cfg.max_tokens,
        "stream": cfg.stream,
        "ignore_eos": true,
    });
    if cfg.stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    if cfg.n > 1 {
        body["n"] = Value::from(cfg.n);
    }
    if api == Api::OpenAiChat {
        body["messages"] = messages(prefix, own);
    } else {
        body["prompt"] = Value::from(joined(prefix, &own));
    }
    body
}

fn responses(cfg: &BenchConfig, prefix: &str, own: String) -> Value {
    let mut body = json!({
        "model": cfg.model,
        "input": own,
        "max_output_tokens": cfg.max_tokens,
        "stream": true,
    });
    if !prefix.is_empty() {
        body["instructions"] = Value::from(prefix);
    }
    if cfg.reasoning {
        body["reasoning"] = json!({"effort": "medium"});
    }
    if cfg.tool_call {
        body["tools"] = json!([{
            "type": "function", "name": TOOL_NAME, "description": "Search the lab's notes.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        }]);
        body["tool_choice"] = Value::from("required");
    }
    body
}

fn anthropic(cfg: &BenchConfig, prefix: &str, own: String) -> Value {
    let mut body = json!({
        "model": cfg.model,
        "max_tokens": cfg.max_tokens,
        "messages": [{"role": "user", "content": own}],
        "stream": true,
    });
    if !prefix.is_empty() {
        body["system"] = Value::from(prefix);
    }
    if cfg.reasoning {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": cfg.max_tokens / 2});
    }
    if cfg.tool_call {
        body["tools"] = json!([{
            "name": TOOL_NAME, "description": "Search the lab's notes.",
            "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
        }]);
        body["tool_choice"] = json!({"type": "any"});
    }
    body
}

fn gemini(cfg: &BenchConfig, prefix: &str, own: String) -> Value {
    let mut body = json!({
        "contents": [{"role": "user", "parts": [{"text": own}]}],
        "generationConfig": {"maxOutputTokens": cfg.max_tokens},
    });
    if !prefix.is_empty() {
        body["systemInstruction"] = json!({"parts": [{"text": prefix}]});
    }
    body
}

fn ollama(cfg: &BenchConfig) -> Value {
    json!({
        "model": cfg.model,
        "stream": cfg.stream,
        "options": {"num_predict": cfg.max_tokens},
    })
}
