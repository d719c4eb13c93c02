//! The GPU side: libcuda calls (uprobes) grouped into steps. Pure, like stitch.

pub mod steps;

pub use steps::{steps, GpuStep, StepKind, StepTracker};
