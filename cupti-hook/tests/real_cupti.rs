//! The hook against the real libcupti.so.12 from PyPI on a machine with no NVIDIA driver:
//! one clear line, a HookError for the collector, and the host runs on.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

mod common;
#[path = "common/wheel.rs"]
mod wheel;

use std::time::Duration;

use common::*;
use tokenscope_cupti_hook::HookListener;

/// Present when the NVIDIA kernel driver is loaded.
const DRIVER: &str = "/proc/driver/nvidia/version";

#[test]
fn real_libcupti_without_a_driver_reports_once_and_the_host_runs_on() {
    let wheel = wheel::cupti_wheel();
    let dir = tempfile::tempdir().unwrap();
    let listener = HookListener::bind(dir.path().join("cupti.sock")).unwrap();
    let host = spawn_host(&wheel.libcupti(), listener.path(), &[], &["flush"]);
    let (code, out, stderr) = host.finish();
    assert_eq!(code, 0, "host must exit 0: stdout {out:?} stderr {stderr}");
    assert!(
        out.iter().any(|l| l == "host done"),
        "host ran to its end: {out:?}"
    );
    assert!(
        listener.wait_until(Duration::from_secs(30), |s| s.closed >= 1),
        "hook connection closes"
    );
    if std::path::Path::new(DRIVER).exists() {
        // A GPU machine: the real CUPTI must accept the hook instead.
        let stats = listener.stats();
        assert!(
            stats.errors.is_empty() && stats.hellos.len() == 1,
            "with a driver the hook starts: {stats:?} {stderr}"
        );
        return;
    }
    let lines = hook_lines(&stderr);
    assert_eq!(lines.len(), 1, "exactly one hook line on stderr: {stderr}");
    assert!(
        lines[0].contains("CUPTI_ERROR_NOT_INITIALIZED")
            && lines[0].contains("driver is not available"),
        "the line names CUPTI's refusal and its cause: {}",
        lines[0]
    );
    let stats = listener.stats();
    assert_eq!(
        stats.errors.len(),
        1,
        "the collector hears the refusal: {stats:?}"
    );
    assert_eq!(stats.errors[0].message, lines[0]);
    assert!(
        stats.hellos.is_empty() && listener.drain().is_empty(),
        "nothing was enabled"
    );
    eprintln!("real libcupti said: {}", lines[0]);
}
