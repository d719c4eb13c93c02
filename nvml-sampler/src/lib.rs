//! NVML device counters for tokenscope: a thread samples every device at a fixed
//! interval into a bounded queue that never blocks it (full: drop and count).
//!
//! Timestamps are CLOCK_MONOTONIC nanoseconds taken just before a device is read,
//! the clock every other tokenscope source uses (DESIGN.md section 7).

#![cfg_attr(test, allow(unused_crate_dependencies))] // unit tests see every dev-dependency

mod error;
mod sampler;
#[cfg(feature = "standin")]
pub mod standin;

pub use error::NvmlError;
pub use sampler::{Sampler, DEFAULT_INTERVAL, QUEUE_CAPACITY};

/// One reading of one device. A field NVML refuses for that device is `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlSample {
    /// CLOCK_MONOTONIC nanoseconds, taken just before this device was read.
    pub ts_ns: u64,
    /// NVML device index.
    pub device: u32,
    /// Percent of the last sample period in which a kernel ran.
    pub gpu_util_pct: Option<u32>,
    /// Percent of the last sample period in which device memory was read or written.
    pub mem_util_pct: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub mem_used_bytes: Option<u64>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
    /// nvmlClocksThrottleReason* bits. nvml-wrapper keeps only the bits it knows
    /// (0x1..=0x100 as of NVML 12), so an undocumented bit never shows here.
    pub throttle_reasons: Option<u64>,
    pub pcie_tx_kbps: Option<u32>,
    pub pcie_rx_kbps: Option<u32>,
}

/// A device found when sampling started. `name`/`uuid` are empty where NVML refuses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
}
