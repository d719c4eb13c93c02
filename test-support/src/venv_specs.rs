//! The Python venvs the end-to-end tests use: (name under the temp dir, pip
//! requirements, import check). `cargo xtask test` builds them in the background while
//! the workspace compiles (xtask/src/venvs.rs includes this file); a test finds its
//! venv ready, or builds it itself (`pyvenv::python_for`). Plain constants: xtask reads
//! this file without test-support's dependencies.

/// A venv: (name, requirements, import check).
pub type VenvSpec = (&'static str, &'static str, &'static str);

/// The LiteLLM proxy, the newest release that installs from PyPI alone (later ones
/// require a `litellm-proxy` package the registry does not have).
pub const LITELLM: VenvSpec = (
    "tokenscope-litellm-venv",
    "litellm[proxy]==1.108.7",
    "import litellm",
);
/// Google's perfetto Python bindings (the trace decodes with them).
pub const PERFETTO: VenvSpec = (
    "tokenscope-perfetto-venv",
    "perfetto",
    "from perfetto.protos.perfetto.trace import perfetto_trace_pb2",
);
/// The openai SDK over HTTP/2 (httpx with h2).
pub const OPENAI_H2: VenvSpec = (
    "tokenscope-openai-h2-venv",
    "openai httpx[http2]",
    "import openai, httpx, h2",
);
/// The openai SDK (the lab engine's own test).
pub const LAB_OPENAI: VenvSpec = ("tokenscope-lab-openai-venv", "openai", "import openai");
/// Every API's SDK (the lab engine's API tests).
pub const LAB_API_SDKS: VenvSpec = (
    "tokenscope-lab-api-sdks-venv",
    "openai anthropic google-genai ollama huggingface_hub",
    "import openai, anthropic, ollama, huggingface_hub; from google import genai",
);

/// The OpenTelemetry protobuf schema (the agent's OTLP exports decode with it).
pub const OTLP: VenvSpec = (
    "tokenscope-otlp-venv",
    "opentelemetry-proto",
    "from opentelemetry.proto.collector.trace.v1 import trace_service_pb2",
);

/// All of them, the slowest to install first.
pub const ALL: [VenvSpec; 6] = [LITELLM, LAB_API_SDKS, OPENAI_H2, PERFETTO, LAB_OPENAI, OTLP];
