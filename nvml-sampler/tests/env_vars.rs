//! The stand-in's environment switches. Alone in this test binary because the
//! environment is process-wide.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::{Duration, Instant};

use nvml_sampler::standin::{standin_library, FAIL_INIT_ENV, SCRIPT_ENV};
use nvml_sampler::{NvmlError, Sampler};

#[test]
fn script_and_fail_init_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script");
    std::fs::write(&script, "devices 1\nrow 0 1 2 3 4 5 6 7 0x8 9 10\n").unwrap();
    std::env::set_var(SCRIPT_ENV, &script);
    let sampler = Sampler::start(Some(&standin_library()), Duration::from_millis(10))
        .expect("the stand-in initialises with the script from the environment");
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(s) = sampler.drain().into_iter().next() {
            break s;
        }
        assert!(Instant::now() < deadline, "no sample within 60 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    sampler.stop();
    assert_eq!(
        (
            first.gpu_util_pct,
            first.mem_used_bytes,
            first.throttle_reasons,
            first.pcie_rx_kbps
        ),
        (Some(1), Some(5), Some(8), Some(10)),
        "values from {SCRIPT_ENV}"
    );

    std::env::set_var(FAIL_INIT_ENV, "1");
    let err = Sampler::start(Some(&standin_library()), Duration::from_millis(10))
        .err()
        .expect("init fails under the switch");
    assert!(
        matches!(
            err,
            NvmlError::InitFailed(nvml_wrapper::error::NvmlError::DriverNotLoaded)
        ),
        "DRIVER_NOT_LOADED, got {err:?}"
    );
}
