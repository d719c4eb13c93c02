//! The hook, loaded like CUDA loads it, against the stand-in libcupti: records, clocks,
//! drops, and the refusals it must report while the host runs on.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

mod common;

use std::os::unix::net::UnixListener;
use std::time::Duration;

use common::*;
use tokenscope_clock::monotonic_ns;
use tokenscope_cupti_hook::bindings as b;
use tokenscope_cupti_hook::wire::{hook_message::Body, Hello};
use tokenscope_cupti_hook::{read_hook_stream, GpuActivity, HookListener};

const WAIT: Duration = Duration::from_secs(30);

fn listener(dir: &tempfile::TempDir) -> HookListener {
    HookListener::bind(dir.path().join("cupti.sock")).expect("bind hook listener")
}

/// Runs a host to completion against `listener`; returns its stderr.
fn run_host(listener: &HookListener, env: &[(&str, &str)], steps: &[&str]) -> String {
    let host = spawn_host(&standin_lib(), listener.path(), env, steps);
    let (code, out, stderr) = host.finish();
    assert_eq!(code, 0, "host must exit 0; stdout {out:?} stderr {stderr}");
    assert!(
        out.iter().any(|l| l == "host done"),
        "host must run to its end; stdout {out:?}"
    );
    assert!(
        listener.wait_until(WAIT, |s| s.closed >= 1),
        "the hook's connection never closed: {:?}",
        listener.stats()
    );
    stderr
}

fn only_hello(listener: &HookListener) -> Hello {
    let hellos = listener.stats().hellos;
    assert_eq!(hellos.len(), 1, "one hello per hooked process: {hellos:?}");
    hellos[0].clone()
}

#[test]
fn scripted_records_reach_the_listener_in_monotonic_time_with_their_fields() {
    let dir = tempfile::tempdir().unwrap();
    let listener = listener(&dir);
    let rounds = 50u32;
    let before = monotonic_ns();
    let stderr = run_host(
        &listener,
        &[("NVTX_INJECTION64_PATH", "")],
        &["emit", "50", "1", "1", "1"],
    );
    let after = monotonic_ns();
    assert!(
        hook_lines(&stderr).is_empty(),
        "a working hook prints nothing: {stderr}"
    );

    let hello = only_hello(&listener);
    assert_eq!(hello.clock, "CLOCK_MONOTONIC");
    assert_eq!(hello.clock_source, "timestamp-callback");
    assert_eq!(hello.cupti_version, 28, "the stand-in reports CUPTI API 28");
    assert_eq!(
        hello.cupti_path,
        standin_lib().to_string_lossy(),
        "hello names the libcupti loaded"
    );
    assert!(
        hello
            .notes
            .iter()
            .any(|n| n.starts_with("NVTX ranges need NVTX_INJECTION64_PATH=")),
        "without NVTX_INJECTION64_PATH the hello says NVTX needs it: {hello:?}"
    );
    for kind in [
        b::KIND_CONCURRENT_KERNEL,
        b::KIND_MEMCPY,
        b::KIND_MARKER,
        b::KIND_GRAPH_TRACE,
    ] {
        assert!(
            hello.enabled_kinds.contains(&kind),
            "kind {kind} must be enabled: {hello:?}"
        );
    }
    assert_eq!(
        listener.records_dropped(),
        0,
        "nothing may drop at this rate"
    );
    assert_eq!(listener.records_received(), u64::from(rounds) * 4);

    let all = listener.drain();
    assert_eq!(all.len() as u32, rounds * 4, "4 records per round");
    for a in &all {
        assert!(
            before <= a.start_ns() && a.start_ns() <= a.end_ns() && a.end_ns() <= after,
            "timestamps must be CLOCK_MONOTONIC ns within the host's run [{before}, {after}]: {a:?}"
        );
        assert_eq!(a.pid(), hello.pid, "records carry the hooked pid");
    }
    // Device records arrive in time order (the stand-in writes them in order).
    let device: Vec<&GpuActivity> = all
        .iter()
        .filter(|a| !matches!(a, GpuActivity::Marker { .. }))
        .collect();
    for w in device.windows(2) {
        assert!(
            w[0].start_ns() <= w[1].start_ns(),
            "out of time order: {:?} then {:?}",
            w[0],
            w[1]
        );
    }

    let kernels: Vec<_> = all
        .iter()
        .filter_map(|a| match a {
            GpuActivity::Kernel { kernel, .. } => Some(kernel),
            _ => None,
        })
        .collect();
    let memcpys: Vec<_> = all
        .iter()
        .filter_map(|a| match a {
            GpuActivity::Memcpy { memcpy, .. } => Some(memcpy),
            _ => None,
        })
        .collect();
    let graphs: Vec<_> = all
        .iter()
        .filter_map(|a| match a {
            GpuActivity::Graph { graph, .. } => Some(graph),
            _ => None,
        })
        .collect();
    let markers: Vec<_> = all
        .iter()
        .filter_map(|a| match a {
            GpuActivity::Marker { marker, .. } => Some(marker),
            _ => None,
        })
        .collect();
    let names = [
        "standin_kernel_gemm",
        "standin_kernel_attention",
        "standin_kernel_sampling",
    ];
    for i in 0..rounds {
        let (k, m, g, r) = (
            kernels[i as usize],
            memcpys[i as usize],
            graphs[i as usize],
            markers[i as usize],
        );
        let ii = i as i32;
        assert_eq!(k.correlation_id, 1000 + i, "kernel {i} correlation");
        assert_eq!(
            k.grid_block,
            vec![ii + 1, 2, 3, 128, 1, 1],
            "kernel {i} grid/block"
        );
        assert_eq!(
            (k.device_id, k.context_id, k.stream_id),
            (0, 1, 7 + i % 2),
            "kernel {i} device/context/stream"
        );
        assert_eq!(
            k.name,
            names[i as usize % 3],
            "kernel {i} name, resolved after the first send"
        );
        assert_eq!(
            k.name_hash,
            tokenscope_cupti_hook::wire::name_hash(k.name.as_bytes())
        );
        assert_eq!(k.graph_id, 40 + i % 4, "kernel {i} graph id");
        assert_eq!(
            (m.copy_kind, m.bytes, m.stream_id, m.correlation_id),
            (2, 4096 * u64::from(i + 1), 7, 5000 + i),
            "memcpy {i}"
        );
        assert_eq!(
            (g.graph_id, g.correlation_id, g.stream_id),
            (40 + i % 4, 7000 + i, 7),
            "graph {i}"
        );
        assert_eq!(
            (r.name.as_str(), r.domain.as_str(), r.id),
            (format!("step {}", i % 4).as_str(), "tokenscope", 9000 + i),
            "marker {i}"
        );
        assert!(
            r.start_ns <= k.start_ns && g.end_ns <= r.end_ns,
            "NVTX range {i} must enclose its round"
        );
    }
}

#[test]
fn without_a_timestamp_callback_paired_readings_convert_to_monotonic() {
    let dir = tempfile::tempdir().unwrap();
    let listener = listener(&dir);
    let before = monotonic_ns();
    run_host(
        &listener,
        &[("STANDIN_CUPTI_NO_TS_CALLBACK", "1")],
        &["emit", "20", "0", "0", "0"],
    );
    let after = monotonic_ns();
    assert_eq!(only_hello(&listener).clock_source, "paired-readings");
    let all = listener.drain();
    assert_eq!(all.len(), 20, "20 kernels");
    // The stand-in stamped CLOCK_REALTIME; one paired reading is good to well under 5 ms.
    let slack = 5_000_000;
    for a in &all {
        assert!(
            before - slack <= a.start_ns() && a.end_ns() <= after + slack,
            "converted timestamps must land in the host's monotonic run [{before}, {after}]: {a:?}"
        );
    }
}

#[test]
fn a_full_queue_drops_and_counts_instead_of_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stalled.sock");
    // A collector that accepts and then does not read until the host has emitted everything.
    let raw = UnixListener::bind(&path).unwrap();
    let emitted = 50_000u64;
    let host = spawn_host(
        &standin_lib(),
        &path,
        &[("TOKENSCOPE_CUPTI_QUEUE", "64")],
        &["emit", "50000", "0", "0", "0"],
    );
    let (stream, _) = raw.accept().unwrap();
    let line = host.expect_line("emitted");
    assert_eq!(
        line,
        format!("emitted {emitted}"),
        "the stand-in wrote every record while nobody read"
    );

    let (mut received, mut dropped) = (0u64, 0u64);
    read_hook_stream(stream, |msg| {
        if let Some(Body::Batch(batch)) = msg.body {
            received += batch.records.len() as u64;
            dropped = dropped.max(batch.dropped_total);
        }
    })
    .expect("hook stream decodes");
    let (code, _, stderr) = host.finish();
    assert_eq!(code, 0, "host exits 0: {stderr}");
    assert!(
        dropped > 0,
        "a 64-record queue behind a stalled socket must drop (received {received})"
    );
    assert!(
        received > 0,
        "records queued before and after the stall still arrive"
    );
    assert_eq!(
        received + dropped,
        emitted,
        "every record is either delivered or counted dropped"
    );
}

#[test]
fn a_collector_that_hangs_up_does_not_hurt_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gone.sock");
    let raw = UnixListener::bind(&path).unwrap();
    let host = spawn_host(
        &standin_lib(),
        &path,
        &[],
        &[
            "emit", "5000", "1", "0", "0", "flush", "emit", "5000", "1", "0", "0",
        ],
    );
    drop(raw.accept().unwrap());
    drop(raw);
    let (code, out, stderr) = host.finish();
    assert_eq!(
        code, 0,
        "no SIGPIPE, no hang: stdout {out:?} stderr {stderr}"
    );
    assert!(
        out.iter().any(|l| l == "host done"),
        "host ran to its end: {out:?}"
    );
}

#[test]
fn another_cupti_subscriber_is_reported_once_and_the_host_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let listener = listener(&dir);
    let stderr = run_host(
        &listener,
        &[("STANDIN_CUPTI_SUBSCRIBER", "taken")],
        &["emit", "10", "1", "1", "1"],
    );
    let lines = hook_lines(&stderr);
    assert_eq!(lines.len(), 1, "exactly one line on stderr: {stderr}");
    assert!(
        lines[0].contains("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
            && lines[0].contains("another CUPTI subscriber"),
        "the line names the conflict: {}",
        lines[0]
    );
    let stats = listener.stats();
    assert_eq!(
        stats.errors.len(),
        1,
        "the collector hears it too: {stats:?}"
    );
    assert_eq!(
        stats.errors[0].cupti_result,
        b::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
    );
    assert_eq!(stats.errors[0].call, "cuptiSubscribe");
    assert_eq!(stats.errors[0].message, lines[0], "same line on both");
    assert!(
        listener.drain().is_empty(),
        "no activity was enabled, none may arrive"
    );
}

#[test]
fn a_missing_libcupti_is_reported_once_and_the_host_runs_on() {
    let dir = tempfile::tempdir().unwrap();
    let listener = listener(&dir);
    let host = spawn_host(
        &dir.path().join("no-such-libcupti.so.12"),
        listener.path(),
        &[],
        &[],
    );
    let (code, _, stderr) = host.finish();
    assert_eq!(code, 0, "host exits 0: {stderr}");
    let lines = hook_lines(&stderr);
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("libcupti not found"),
        "the line says what is missing: {}",
        lines[0]
    );
    assert!(
        listener.wait_until(WAIT, |s| s.errors.len() == 1),
        "the collector hears it: {:?}",
        listener.stats()
    );
    assert_eq!(listener.stats().errors[0].call, "dlopen");
}

#[test]
fn graph_traces_refused_leave_kernels_flowing_with_a_note() {
    let dir = tempfile::tempdir().unwrap();
    let listener = listener(&dir);
    run_host(
        &listener,
        &[("STANDIN_CUPTI_GRAPH_TRACE", "exclusive")],
        &["emit", "8", "0", "1", "0"],
    );
    let hello = only_hello(&listener);
    assert!(
        !hello.enabled_kinds.contains(&b::KIND_GRAPH_TRACE),
        "graph trace was refused: {hello:?}"
    );
    assert!(
        hello
            .notes
            .iter()
            .any(|n| n.contains("GRAPH_TRACE") && n.contains("CUPTI_ERROR_NOT_COMPATIBLE")),
        "a note says why: {hello:?}"
    );
    let all = listener.drain();
    assert_eq!(all.len(), 8, "kernels only: {all:?}");
    assert!(
        all.iter()
            .all(|a| matches!(a, GpuActivity::Kernel { kernel, .. } if kernel.graph_id >= 40)),
        "kernels keep their graph id"
    );
}

#[test]
fn graph_mode_puts_graph_launches_first_when_cupti_will_not_combine_them() {
    let dir = tempfile::tempdir().unwrap();
    let listener = listener(&dir);
    let env = [
        ("STANDIN_CUPTI_GRAPH_TRACE", "exclusive"),
        ("TOKENSCOPE_CUPTI_MODE", "graph"),
    ];
    run_host(&listener, &env, &["emit", "8", "1", "1", "1"]);
    let hello = only_hello(&listener);
    assert_eq!(
        hello.enabled_kinds,
        vec![b::KIND_GRAPH_TRACE, b::KIND_MARKER],
        "graph mode: {hello:?}"
    );
    assert!(
        hello
            .notes
            .iter()
            .any(|n| n.starts_with("CONCURRENT_KERNEL not enabled (CUPTI_ERROR_NOT_COMPATIBLE)")),
        "a note says kernels were refused: {hello:?}"
    );
    let all = listener.drain();
    let graphs = all
        .iter()
        .filter(|a| matches!(a, GpuActivity::Graph { .. }))
        .count();
    let markers = all
        .iter()
        .filter(|a| matches!(a, GpuActivity::Marker { .. }))
        .count();
    assert_eq!(
        (graphs, markers, all.len()),
        (8, 8, 16),
        "graph launches and NVTX ranges only: {all:?}"
    );
}
