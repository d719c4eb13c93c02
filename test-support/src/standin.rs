//! The stand-in GPU libraries the tests load instead of NVIDIA's. Each is built by
//! the crate whose ABI it mirrors, so the two break together. The NVML one sits
//! behind nvml-sampler's `standin` feature (its path is baked in at build time),
//! which only this crate and the lab turn on. The CUPTI one is built beside the hook
//! as separate files the profiler never references (a feature there would rebuild
//! the hook's cdylib, whose file name carries no feature hash, whenever a build
//! without it alternates with a test build).

use std::path::PathBuf;

/// The scripted stand-in libnvidia-ml.so.1 (script format: nvml-sampler/standin).
pub use nvml_sampler::standin as nvml;

/// The directory holding the stand-in libcupti (`libcupti_standin.so`) and the host
/// program that loads the hook as CUDA does (`cupti_host`).
pub fn cupti_dir() -> PathBuf {
    tokenscope_cupti_hook::standin_dir()
}
