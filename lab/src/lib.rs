//! The tokenscope lab: a simulated OpenAI-compatible streaming engine (continuous
//! batching, prefix cache, chunked prefill) that does its GPU work through a stand-in
//! libcuda.so.1, real nginx set-ups in front of it, and `bench`, an SSE load client that
//! times what users feel. All timestamps are CLOCK_MONOTONIC nanoseconds.
pub mod bench;
pub mod cli;
pub mod clock;
pub mod cuda;
pub mod demo;
pub mod engine;
pub mod proxy;
pub mod pyvenv;
pub mod scenario;
pub mod server;
pub mod words;

pub use engine::{Engine, EngineConfig, EngineError, Step, StepKind, StepLog};
