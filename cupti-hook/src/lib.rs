//! tokenscope's CUPTI hook. Built as a cdylib it is what an engine loads through
//! `CUDA_INJECTION64_PATH`: `InitializeInjection` enables CUPTI activity records (kernels,
//! memcpy, CUDA graphs, NVTX) and streams them, in CLOCK_MONOTONIC ns, over the Unix socket
//! named by `TOKENSCOPE_CUPTI_SOCKET`. As an rlib it gives the collector the wire format and
//! `HookListener`.

#![cfg_attr(test, allow(unused_crate_dependencies))] // unit tests see every dev-dependency

pub mod bindings;
pub mod inject;
pub mod listener;
mod parse;
mod sender;
pub mod wire;

pub use inject::{
    InitializeInjection, DEFAULT_QUEUE_RECORDS, ENV_CUPTI_LIB, ENV_MODE, ENV_NVTX_INJECTION,
    ENV_QUEUE_RECORDS, ENV_SOCKET,
};
pub use listener::{read_hook_stream, GpuActivity, HookListener, HookStats, MAX_MESSAGE_BYTES};

/// Where build.rs put the stand-in libcupti (`libcupti_standin.so`) and the host
/// program that loads the hook like CUDA does (`cupti_host`), for tests.
pub fn standin_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CUPTI_STANDIN_DIR"))
}
