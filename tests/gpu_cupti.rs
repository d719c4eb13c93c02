//! Privileged (it records): the CUPTI hook streams to `tokenscope record`. A
//! host program loads the hook the way CUDA does (CUDA_INJECTION64_PATH:
//! dlopen + InitializeInjection) over the stand-in libcupti, which hands out
//! activity buffers in the real record layout.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::process::Command;

use collector::ingest::model::{event::Body, GpuActivity, GpuActivityKind};
use test_support::*;

#[test]
fn hook_records_reach_the_recording_in_monotonic_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("cupti.sock");
    let rec = Recorder::start(
        dir.path(),
        &[
            "--port",
            "1",
            "--gpu",
            "off",
            "--nvml",
            "off",
            "--cupti-socket",
            socket.to_str().unwrap(),
        ],
    );
    let standin = standin::cupti_dir();
    let deps = profiler().parent().expect("target dir").join("deps");
    let hook = deps.join("libtokenscope_cupti_hook.so");
    assert!(
        hook.exists(),
        "the hook cdylib is built beside the tests: {}",
        hook.display()
    );
    let before = collector::clock::monotonic_ns();
    let host = Command::new(standin.join("cupti_host"))
        .arg(&hook)
        .args(["emit", "20", "1", "1", "1", "flush"])
        .env("TOKENSCOPE_CUPTI_LIB", standin.join("libcupti_standin.so"))
        .env("TOKENSCOPE_CUPTI_SOCKET", &socket)
        .output()
        .expect("run the host");
    let after = collector::clock::monotonic_ns();
    let stdout = String::from_utf8_lossy(&host.stdout);
    assert!(
        host.status.success(),
        "the host runs on: {stdout} {}",
        String::from_utf8_lossy(&host.stderr)
    );
    assert!(stdout.contains("emitted"), "{stdout}");
    let path = rec.path.clone();
    rec.stop();

    let (header, events) = read_recording(&path);
    let gpu: Vec<&GpuActivity> = events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::Gpu(g)) => Some(g),
            _ => None,
        })
        .collect();
    let count = |k: GpuActivityKind| gpu.iter().filter(|g| g.kind() == k).count();
    assert_eq!(
        count(GpuActivityKind::Kernel),
        20,
        "20 kernels: {:?}",
        gpu.iter().map(|g| g.kind()).collect::<Vec<_>>()
    );
    assert!(
        count(GpuActivityKind::Memcpy) >= 20 && count(GpuActivityKind::Graph) >= 20,
        "a copy and a graph per round"
    );
    assert_eq!(
        header.cupti_received as usize,
        gpu.len(),
        "the header counts what arrived"
    );
    assert_eq!(header.cupti_dropped, 0);
    for g in &gpu {
        assert!(
            before <= g.start_ns && g.start_ns <= g.end_ns && g.end_ns <= after,
            "monotonic time inside the run: {g:?}"
        );
    }
    let kernels: Vec<&&GpuActivity> = gpu
        .iter()
        .filter(|g| g.kind() == GpuActivityKind::Kernel)
        .collect();
    assert!(
        kernels.windows(2).all(|w| w[0].start_ns <= w[1].start_ns),
        "kernels in time order"
    );
    assert!(
        kernels.iter().all(|k| !k.name.is_empty()),
        "kernel names arrive"
    );
}
