//! The tokenscope lab: a simulated streaming engine (continuous batching, prefix cache,
//! chunked prefill) that speaks the OpenAI, Anthropic, Gemini, TGI and Ollama streaming
//! APIs and does its GPU work through a stand-in libcuda.so.1, real nginx set-ups in front
//! of it, and `bench`, a load client that times what users feel in each API. All timestamps are CLOCK_MONOTONIC nanoseconds.
//!
//! Its binary, `tokenscope-lab`, hosts the demo and the lab's commands; the
//! `tokenscope` profiler never links this crate (an SRE's production install gets
//! no simulated engine, stand-in libraries, nftables installer or accept-any-cert
//! TLS client with it).

#![cfg_attr(test, allow(unused_crate_dependencies))] // unit tests see every dev-dependency

pub mod api;
pub mod bench;
pub mod cli;
pub mod cuda;
pub mod demo;
pub mod engine;
pub mod profiler;
pub mod proxy;
pub mod replicate;
pub mod scenario;
pub mod server;
pub mod words;

pub use engine::{Engine, EngineConfig, EngineError, Step, StepKind, StepLog};
