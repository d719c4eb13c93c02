//! The official `openai` Python SDK streams from the lab engine to [DONE]. The test makes
//! its own venv (python3 -m venv, Debian package python3-venv) and pip-installs openai.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::{Path, PathBuf};
use std::process::Command;

use tokenscope_lab::{Engine, EngineConfig};

const CLIENT: &str = r#"
import json, sys
import openai
base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="lab-test-key", max_retries=0)
out = {}
chunks = list(client.chat.completions.create(
    model="lab-model", messages=[{"role": "user", "content": "say something"}],
    max_tokens=7, stream=True, stream_options={"include_usage": True}))
with_choice = [c for c in chunks if c.choices]
out["chat_content"] = sum(1 for c in with_choice if c.choices[0].delta.content)
out["chat_finish"] = with_choice[-1].choices[0].finish_reason
out["chat_usage"] = chunks[-1].usage.completion_tokens if chunks[-1].usage else None
comp = list(client.completions.create(model="lab-model", prompt="one two three",
                                      max_tokens=5, stream=True))
out["completion_chunks"] = len(comp)
out["completion_finish"] = comp[-1].choices[0].finish_reason
full = client.chat.completions.create(model="lab-model", max_tokens=3,
                                      messages=[{"role": "user", "content": "hi"}])
out["full_usage"] = full.usage.completion_tokens
try:
    client.completions.create(model="lab-model", prompt="x", max_tokens=0)
    out["bad_request"] = "accepted"
except openai.BadRequestError as e:
    out["bad_request"] = e.status_code
print(json.dumps(out))
"#;

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A venv with openai in the system temp dir, made once and reused by later runs. It is
/// built beside its final path and renamed into place, so concurrent runs never share a
/// half-made one.
fn openai_venv() -> PathBuf {
    test_support::pyvenv::python_for(test_support::venv_specs::LAB_OPENAI)
}

fn sdk_run(python: &Path, base: &str) -> serde_json::Value {
    let out = run(
        Command::new(python).args(["-c", CLIENT, base]),
        "the openai SDK client",
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("client prints JSON: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_streams_chat_and_completions_to_done() {
    let python = tokio::task::spawn_blocking(openai_venv).await.unwrap();
    let e = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
        .await
        .expect("engine starts");
    let base = e.base_url();
    let v = tokio::task::spawn_blocking(move || sdk_run(&python, &base))
        .await
        .unwrap();
    assert_eq!(v["chat_content"], 7, "7 chat tokens with content: {v}");
    assert_eq!(
        v["chat_finish"], "length",
        "the last chat chunk finishes: {v}"
    );
    assert_eq!(
        v["chat_usage"], 7,
        "include_usage sends the usage chunk: {v}"
    );
    assert_eq!(v["completion_chunks"], 5, "5 completion chunks: {v}");
    assert_eq!(v["completion_finish"], "length", "{v}");
    assert_eq!(v["full_usage"], 3, "non-streaming chat: {v}");
    assert_eq!(
        v["bad_request"], 400,
        "max_tokens=0 is a 400 BadRequestError: {v}"
    );
    e.shutdown().await;
}
