//! Privileged: GPU-timed steps. The lab engine runs as its own process on the stand-in
//! libcuda with tokenscope's CUPTI hook injected the way the driver does it
//! (CUDA_INJECTION64_PATH at cuInit) over the stand-in libcupti, which the stand-in driver
//! feeds the device span of every launch. The recording holds the uprobes' libcuda calls
//! and the hook's kernel, graph and copy records; each step must carry the device start
//! and end the simulated GPU logged, and each request's GPU-timed prefill the engine's.
//! The engine calling the per-thread default stream entry points (`_ptsz`) must give the
//! same steps.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use collector::gpu;
use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::engine::requests::ServedRequest;
use tokenscope_lab::Step;

struct Run {
    log: Vec<Step>,
    served: Vec<ServedRequest>,
    path: PathBuf,
    probes: Vec<String>,
    /// The engine's stdout (its driver call counts at exit).
    stdout: String,
    _dir: tempfile::TempDir,
}

fn hook() -> PathBuf {
    let hook = profiler()
        .parent()
        .expect("target dir")
        .join("deps")
        .join("libtokenscope_cupti_hook.so");
    assert!(
        hook.exists(),
        "the hook cdylib is built: {}",
        hook.display()
    );
    hook
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn wait_listening(engine: &mut Child, port: u16) {
    for _ in 0..300 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = engine.try_wait() {
            panic!("the lab engine exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the lab engine never listened on {port}");
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a log line"))
        .collect()
}

/// Records the lab engine (its own process, CUPTI hook injected) under `load`.
fn record(engine_args: &[&str], load: BenchConfig) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = tokenscope_lab::cuda::install_stand_in(dir.path()).expect("stand-in libcuda");
    let socket = dir.path().join("cupti.sock");
    let port = free_port();
    let rec = Recorder::start(
        dir.path(),
        &[
            "--port",
            &port.to_string(),
            "--libcuda",
            lib.to_str().unwrap(),
            "--cupti-socket",
            socket.to_str().unwrap(),
            "--nvml",
            "off",
        ],
    );
    let (steps, requests) = (
        dir.path().join("steps.jsonl"),
        dir.path().join("requests.jsonl"),
    );
    let mut engine = Command::new(lab())
        .arg("engine")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--libcuda")
        .arg(&lib)
        .arg("--step-log")
        .arg(&steps)
        .arg("--request-log")
        .arg(&requests)
        .args(engine_args)
        .env("CUDA_INJECTION64_PATH", hook())
        .env("TOKENSCOPE_CUPTI_SOCKET", &socket)
        .env(
            "TOKENSCOPE_CUPTI_LIB",
            standin::cupti_dir().join("libcupti_standin.so"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the lab engine");
    wait_listening(&mut engine, port);
    let load = BenchConfig {
        url: format!("http://127.0.0.1:{port}"),
        progress: false,
        timeout: Duration::from_secs(60),
        ..load
    };
    let out = runtime().block_on(bench::run(&load)).expect("bench");
    assert!(out.records.iter().all(|r| r.ok), "every request succeeded");
    // SIGTERM: the engine writes its logs and exits; the hook flushes CUPTI at exit.
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(engine.id() as i32, libc::SIGTERM) };
    let status = wait_timeout(&mut engine, Duration::from_secs(20)).expect("the engine exits");
    let (mut stdout, mut stderr) = (String::new(), String::new());
    {
        use std::io::Read;
        if let Some(mut o) = engine.stdout.take() {
            let _ = o.read_to_string(&mut stdout);
        }
        if let Some(mut e) = engine.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
    }
    assert!(status.success(), "engine: {status}: {stderr}");
    let path = rec.path.clone();
    rec.stop();
    let (header, _) = read_recording(&path);
    assert!(
        header.cupti_received > 0,
        "the hook's records reached the recording; engine said: {stderr}"
    );
    Run {
        log: read_lines(&steps)
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("a step"))
            .collect(),
        served: read_lines(&requests)
            .into_iter()
            .map(|v| serde_json::from_value(v).expect("a served request"))
            .collect(),
        path,
        probes: header.probes,
        stdout,
        _dir: dir,
    }
}

fn load(requests: u64, prompt: usize) -> BenchConfig {
    BenchConfig {
        concurrency: 4,
        requests: Some(requests),
        prompt_tokens: prompt,
        shared_prefix: 0,
        max_tokens: 16,
        ..BenchConfig::default()
    }
}

/// Every recorded step is GPU-timed, with exactly the device span the stand-in logged.
fn assert_steps_gpu_timed(run: &Run) {
    let (_, events) = read_recording(&run.path);
    let steps = gpu::steps(&events);
    assert_eq!(
        steps.len(),
        run.log.len(),
        "one recorded step per engine step; probes {:?}",
        run.probes
    );
    for (s, l) in steps.iter().zip(&run.log) {
        let d = s
            .device
            .unwrap_or_else(|| panic!("step {} has no CUPTI device time", l.index));
        assert_eq!(
            (Some(d.start_ns), Some(d.end_ns)),
            (l.gpu_start_ns, l.gpu_end_ns),
            "step {}: device start and end",
            l.index
        );
        assert_eq!(
            d.busy_ns,
            d.end_ns - d.start_ns,
            "the stand-in GPU never idles in a step"
        );
        assert_eq!(
            d.records,
            l.kernel_launches + l.graph_launches + 1,
            "step {}: a record per launch and the copy",
            l.index
        );
    }
    println!(
        "{} steps GPU-timed; device start/end equal the stand-in's log for every one",
        steps.len()
    );
}

/// |reported - logged| GPU prefill time per request, matched by the first token's time.
/// The engine's: device start of the step with its first prompt chunk to device end of the
/// step with its last.
fn gpu_prefill_errors(run: &Run, report: &Value) -> Vec<u64> {
    run.served
        .iter()
        .map(|served| {
            let (first, last) = prefill_steps(&run.log, served.request_id);
            let logged = last.gpu_end_ns.expect("GPU end") - first.gpu_start_ns.expect("GPU start");
            let r = reported_by_first_token(report, served.token_ns[0]);
            r["gpu"]["prefill_gpu_ns"]
                .as_u64()
                .unwrap_or_else(|| panic!("a GPU-timed prefill: {}", r["gpu"]))
                .abs_diff(logged)
        })
        .collect()
}

fn prefill_matches(engine_args: &[&str], what: &str) -> Run {
    let run = record(engine_args, load(16, 200));
    assert_steps_gpu_timed(&run);
    let report = report_json(&run.path);
    assert_eq!(
        report["gpu"]["gpu_timed"], report["gpu"]["steps"],
        "the report counts every step GPU-timed"
    );
    let errors = gpu_prefill_errors(&run, &report);
    let within = errors.iter().filter(|&&e| e <= 500_000).count();
    println!(
        "GPU-timed prefill vs the engine's log, {what}: {within} of {} within 0.5 ms, worst {} ns",
        errors.len(),
        errors.iter().max().copied().unwrap_or(0)
    );
    assert_eq!(errors.len(), 16, "16 requests served");
    assert_eq!(within, 16, "every request within 0.5 ms: {errors:?}");
    let text = report_text(&run.path);
    assert!(
        text.contains("GPU-timed by CUPTI") && text.contains("decode on the device"),
        "the text report says the steps are GPU-timed and how long they ran there: {text}"
    );
    run
}

#[test]
fn gpu_timed_prefill_matches_the_log_with_chunked_prefill() {
    let run = prefill_matches(&["--chunked-prefill", "on"], "chunked prefill on");
    // The trace draws the steps in device time beside the stream's kernels.
    let (header, events) = read_recording(&run.path);
    use collector::export::perfetto::{write_events, Compression, Windowing};
    // Uncompressed, so that the track's name is in the bytes as written.
    let mut trace = Vec::new();
    write_events(
        &header,
        &events,
        &mut trace,
        Windowing::whole(),
        Compression::None,
    )
    .expect("a trace");
    let name = b"GPU 0 stream 7 steps (device time)";
    assert!(
        trace.windows(name.len()).any(|w| w == name),
        "the trace has the device-time step track"
    );
}

#[test]
fn gpu_timed_prefill_matches_the_log_with_whole_prompt_prefills() {
    prefill_matches(
        &["--chunked-prefill", "off", "--prefix-cache", "off"],
        "chunked prefill off",
    );
}

/// The lab engine's line of stand-in driver calls per entry point.
fn driver_calls(run: &Run) -> &str {
    run.stdout
        .lines()
        .find(|l| l.starts_with("stand-in driver calls:"))
        .unwrap_or_else(|| panic!("the engine printed its driver calls: {}", run.stdout))
}

/// Whether `symbol` got a probe (on its entry, `uprobe:SYM@FILE`, or past a guard,
/// `uprobe:SYM+N@FILE`).
fn probed(run: &Run, symbol: &str) -> bool {
    run.probes.iter().any(|p| {
        p.strip_prefix("uprobe:")
            .and_then(|p| p.strip_prefix(symbol))
            .is_some_and(|rest| rest.starts_with('@') || rest.starts_with('+'))
    })
}

#[test]
fn per_thread_stream_entry_points_give_the_same_steps() {
    let run = prefill_matches(&["--per-thread-stream"], "_ptsz entry points");
    // The driver counted every call as coming through a _ptsz entry point.
    let calls = driver_calls(&run);
    let numbers: Vec<u64> = calls
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (total, ptsz) = (numbers[..4].iter().sum::<u64>(), numbers[4]);
    assert!(
        total > 0 && ptsz == total,
        "every call through _ptsz: {calls}"
    );
    println!("{calls}");
    for symbol in [
        "cuLaunchKernel_ptsz",
        "cuGraphLaunch_ptsz",
        "cuStreamSynchronize_ptsz",
    ] {
        assert!(probed(&run, symbol), "{symbol} probed: {:?}", run.probes);
    }
}

#[test]
fn steps_that_end_with_the_whole_device_synchronised_are_steps() {
    // PyTorch on CUDA 13: torch.cuda.synchronize() -> cudaDeviceSynchronize ->
    // cuCtxSynchronize_v2, which a CUDA 12 driver does not export.
    let run = prefill_matches(&["--device-sync"], "cuCtxSynchronize_v2");
    let calls = driver_calls(&run);
    let number_before = |what: &str| -> u64 {
        let head = &calls[..calls
            .find(what)
            .unwrap_or_else(|| panic!("{what} in {calls}"))];
        head.split_whitespace()
            .filter_map(|w| w.trim_start_matches('(').parse().ok())
            .next_back()
            .unwrap_or_else(|| panic!("a count before {what} in {calls}"))
    };
    let (syncs, whole) = (
        number_before(" synchronisations"),
        number_before(" of the whole device"),
    );
    assert!(
        syncs > 0 && whole == syncs,
        "every synchronisation of the whole device: {calls}"
    );
    assert!(
        probed(&run, "cuCtxSynchronize_v2"),
        "cuCtxSynchronize_v2 probed: {:?}",
        run.probes
    );
}

#[test]
fn a_host_bound_decode_loop_is_seen_on_the_device_and_async_scheduling_clears_it() {
    let rule_11 = |args: &[&str]| {
        let run = record(args, load(24, 40));
        let report = report_json(&run.path);
        report["diagnoses"]
            .as_array()
            .expect("diagnoses")
            .iter()
            .find(|d| d["rule"] == 11)
            .cloned()
    };
    let found = rule_11(&["--host-overhead-ms", "8"]).expect("rule 11 fires on 8 ms host work");
    let finding = found["finding"].as_str().unwrap_or_default();
    println!("rule 11, GPU-timed: {finding}");
    assert!(finding.contains("GPU-timed by CUPTI"), "{finding}");
    assert!(
        rule_11(&["--host-overhead-ms", "8", "--async-scheduling"]).is_none(),
        "overlapped host work is not host-bound"
    );
}

#[test]
fn kv_preemptions_the_engine_logged_are_the_ones_rule_12_names() {
    let cfg = BenchConfig {
        concurrency: 6,
        requests: Some(24),
        prompt_tokens: 40,
        shared_prefix: 0,
        max_tokens: 64,
        ..BenchConfig::default()
    };
    let run = record(&["--kv-cache-tokens", "320", "--prefix-cache", "off"], cfg);
    // The engine's truth: requests preempted after their first token, and the token gaps
    // that held a preemption (a request preempted again before its next token, right after
    // it was let back in, shows one stall).
    // Tokens each request had when step j was planned: those sampled in steps before it.
    let mut sampled: std::collections::HashMap<u64, usize> = Default::default();
    let mut stalls: Vec<(u64, usize)> = Vec::new();
    for s in &run.log {
        for id in &s.preempted {
            match sampled.get(id) {
                Some(&n) if n > 0 => stalls.push((*id, n)),
                _ => {}
            }
        }
        for r in s.requests.iter().filter(|r| r.sampled) {
            *sampled.entry(r.request_id).or_default() += 1;
        }
    }
    let preemptions = stalls.len();
    let served: std::collections::HashMap<u64, &Vec<u64>> = run
        .served
        .iter()
        .map(|s| (s.request_id, &s.token_ns))
        .collect();
    let lengths: Vec<String> = stalls
        .iter()
        .filter_map(|(id, n)| {
            let t = served.get(id)?;
            Some(format!("{:.0}", (t.get(*n)? - t[n - 1]) as f64 / 1e6))
        })
        .collect();
    println!("engine-side stalls (ms): {}", lengths.join(" "));
    stalls.sort_unstable();
    stalls.dedup();
    let mut requests: Vec<u64> = stalls.iter().map(|s| s.0).collect();
    requests.dedup();
    let report = report_json(&run.path);
    let found = report["diagnoses"]
        .as_array()
        .expect("diagnoses")
        .iter()
        .find(|d| d["rule"] == 12)
        .cloned()
        .expect("rule 12 fires");
    let figure = |name: &str| {
        found["evidence"]["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .and_then(|f| f["value"].as_f64())
            .unwrap_or(-1.0) as usize
    };
    println!(
        "engine log: {preemptions} mid-stream preemptions of {} requests in {} token gaps; rule 12: {} stalls of {} requests",
        requests.len(),
        stalls.len(),
        figure("stalls"),
        figure("preempted requests")
    );
    assert_eq!(
        figure("preempted requests"),
        requests.len(),
        "the preempted requests"
    );
    assert_eq!(figure("stalls"), stalls.len(), "each stalled token gap");
}
