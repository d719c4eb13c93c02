//! The GPU side: libcuda calls (uprobes) grouped into steps, timed on the device where a
//! CUPTI hook sent its records. Pure, like stitch.

pub mod device;
pub mod steps;

pub use device::{DeviceTime, StepTimer};
pub use steps::{steps, GpuStep, StepKind, StepTracker};
