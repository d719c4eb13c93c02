//! Each API's official Python SDK streams from the lab engine: the wire shapes are the
//! real servers' as far as their own clients can tell (OpenAI Responses and n=2,
//! Anthropic thinking and tool use, google-genai, ollama, huggingface_hub for TGI). The
//! test makes its own venv (python3 -m venv, Debian package python3-venv) from PyPI.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::{Path, PathBuf};
use std::process::Command;

use tokenscope_lab::{Engine, EngineConfig};

const CLIENT: &str = r#"
import json, sys
base = sys.argv[1]
out = {}
import openai
c = openai.OpenAI(base_url=base + "/v1", api_key="lab-test-key", max_retries=0)
events = list(c.responses.create(model="lab-model", input="hi there", max_output_tokens=6,
                                 stream=True, reasoning={"effort": "medium"}))
out["responses_deltas"] = [e.type for e in events if e.type.endswith(".delta")]
out["responses_usage"] = events[-1].response.usage.output_tokens
events = list(c.responses.create(model="lab-model", input="hi", max_output_tokens=4, stream=True,
    tools=[{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    tool_choice="required"))
out["responses_arguments"] = [e.arguments for e in events
                              if e.type == "response.function_call_arguments.done"]
chunks = list(c.chat.completions.create(model="lab-model", max_tokens=3, n=2, stream=True,
                                        messages=[{"role": "user", "content": "hi"}]))
out["chat_choices"] = sorted({ch.choices[0].index for ch in chunks if ch.choices})
import anthropic
a = anthropic.Anthropic(base_url=base, api_key="lab-test-key", max_retries=0)
with a.messages.stream(model="lab-model", max_tokens=6, messages=[{"role": "user", "content": "hi"}],
                       thinking={"type": "enabled", "budget_tokens": 3}) as s:
    m = s.get_final_message()
out["anthropic_blocks"] = [b.type for b in m.content]
out["anthropic_usage"] = m.usage.output_tokens
with a.messages.stream(model="lab-model", max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                       tools=[{"name": "search", "input_schema": {"type": "object"}}],
                       tool_choice={"type": "any"}) as s:
    m = s.get_final_message()
out["anthropic_tool_inputs"] = [b.input for b in m.content if b.type == "tool_use"]
from google import genai
g = genai.Client(api_key="lab-test-key", http_options={"base_url": base, "api_version": "v1beta"})
chunks = list(g.models.generate_content_stream(model="lab-model", contents="hi",
                                              config={"max_output_tokens": 4}))
out["gemini_texts"] = sum(1 for ch in chunks if ch.text)
out["gemini_usage"] = chunks[-1].usage_metadata.candidates_token_count
import ollama
o = ollama.Client(host=base)
lines = list(o.generate(model="lab-model", prompt="hi", stream=True, options={"num_predict": 4}))
out["ollama_done"] = [l.done for l in lines]
lines = list(o.chat(model="lab-model", messages=[{"role": "user", "content": "hi"}], stream=True,
                    options={"num_predict": 3}))
out["ollama_chat_eval_count"] = lines[-1].eval_count
from huggingface_hub import InferenceClient
h = InferenceClient(model=base + "/generate_stream")
tokens = list(h.text_generation("hi", max_new_tokens=4, stream=True, details=True))
out["tgi_special"] = [t.token.special for t in tokens]
out["tgi_generated_tokens"] = tokens[-1].details.generated_tokens
print(json.dumps(out))
"#;

fn sdks_venv() -> PathBuf {
    test_support::pyvenv::python_for(test_support::venv_specs::LAB_API_SDKS)
}

fn sdk_run(python: &Path, base: &str) -> serde_json::Value {
    let out = Command::new(python)
        .args(["-c", CLIENT, base])
        .output()
        .unwrap_or_else(|e| panic!("cannot run the SDK client: {e}"));
    assert!(
        out.status.success(),
        "the SDK client failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|_| panic!("client prints JSON: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdks_stream_every_api_from_the_lab_engine() {
    let python = tokio::task::spawn_blocking(sdks_venv).await.unwrap();
    let e = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts");
    let base = e.base_url();
    let v = tokio::task::spawn_blocking(move || sdk_run(&python, &base))
        .await
        .unwrap();
    let reasoning = serde_json::json!([
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.delta"
    ]);
    assert_eq!(
        v["responses_deltas"], reasoning,
        "openai Responses: reasoning then text: {v}"
    );
    assert_eq!(v["responses_usage"], 6, "{v}");
    let args = v["responses_arguments"][0].as_str().unwrap_or_default();
    let args: serde_json::Value = serde_json::from_str(args)
        .unwrap_or_else(|_| panic!("function-call arguments join into JSON: {v}"));
    assert!(args["query"].is_string(), "{v}");
    assert_eq!(
        v["chat_choices"],
        serde_json::json!([0, 1]),
        "chat n=2: {v}"
    );
    assert_eq!(
        v["anthropic_blocks"],
        serde_json::json!(["thinking", "text"]),
        "{v}"
    );
    assert_eq!(v["anthropic_usage"], 6, "{v}");
    assert!(
        v["anthropic_tool_inputs"][0]["query"].is_string(),
        "the SDK parses the streamed tool input: {v}"
    );
    assert_eq!(
        (&v["gemini_texts"], &v["gemini_usage"]),
        (&4.into(), &4.into()),
        "{v}"
    );
    assert_eq!(
        v["ollama_done"],
        serde_json::json!([false, false, false, false, true]),
        "{v}"
    );
    assert_eq!(v["ollama_chat_eval_count"], 3, "{v}");
    assert_eq!(
        v["tgi_special"],
        serde_json::json!([false, false, false, false, true]),
        "TGI: four tokens, then the EOS: {v}"
    );
    assert_eq!(v["tgi_generated_tokens"], 4, "{v}");
    e.shutdown().await;
}
