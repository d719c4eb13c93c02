//! `cargo xtask gpu-check`: on a machine with an NVIDIA GPU, exercises the real
//! NVML library and the libcuda uprobes against a small CUDA workload (PTX JIT
//! through the driver, no toolkit needed: eager steps, the same through the `_ptsz`
//! entry points, and CUDA graph replays), and checks what tokenscope recorded.
//! The CUPTI hook is loaded into the workload too (CUDA_INJECTION64_PATH); it
//! needs a libcupti (CUDA toolkit, TOKENSCOPE_CUPTI_LIB, or the PyPI wheel the
//! cupti-hook tests unpack into target/tmp/cupti-wheel), and without one the
//! check says so instead of failing. It prints one table: calls seen per probed
//! symbol, and the steps CPU-timed (libcuda calls) beside GPU-timed (CUPTI).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

const STEPS: u32 = 50;

pub(crate) fn run() -> Result<()> {
    if !Path::new("/dev/nvidia0").exists() && Command::new("nvidia-smi").output().is_err() {
        bail!("no NVIDIA GPU here (/dev/nvidia0 missing, no nvidia-smi): gpu-check needs one");
    }
    crate::setup::run()?;
    crate::cargo(&[
        "build",
        "--release",
        "--bin",
        "tokenscope",
        "-p",
        "tokenscope",
        "-p",
        "tokenscope-cupti-hook",
    ])?;
    let hook = crate::root().join("target/release/libtokenscope_cupti_hook.so");
    let bin = crate::root().join("target/release/tokenscope");
    let dir = std::env::temp_dir().join(format!("tokenscope-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let workload = dir.join("workload.py");
    std::fs::write(&workload, include_str!("workload.py"))?;
    let libcuda = String::from_utf8(
        Command::new("python3")
            .args([
                "-c",
                "import ctypes.util; print(ctypes.util.find_library('cuda') or '')",
            ])
            .output()?
            .stdout,
    )?;
    let libcuda = resolve(libcuda.trim())
        .context("libcuda.so.1 not found by ctypes.util.find_library('cuda')")?;
    println!("gpu-check: libcuda at {libcuda}");

    let out = dir.join("gpu.tsrec");
    let socket = dir.join("cupti.sock");
    let rec = crate::bench::Recorder::spawn(
        &bin,
        &[
            "--port".as_ref(),
            "1".as_ref(),
            "--libcuda".as_ref(),
            libcuda.as_ref(),
            "--cupti-socket".as_ref(),
            socket.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
    )?;
    let mut workload_cmd = Command::new("python3");
    workload_cmd
        .arg(&workload)
        .arg(STEPS.to_string())
        .env("CUDA_INJECTION64_PATH", &hook)
        .env("TOKENSCOPE_CUPTI_SOCKET", &socket);
    match cupti_lib() {
        Some(lib) => {
            println!("gpu-check: libcupti {lib}");
            workload_cmd.env("TOKENSCOPE_CUPTI_LIB", lib);
        }
        None => println!("gpu-check: no libcupti found; the hook will say so"),
    }
    let output = workload_cmd.output()?;
    let said = String::from_utf8_lossy(&output.stdout);
    print!("{said}{}", String::from_utf8_lossy(&output.stderr));
    print!("{}", rec.stop_output()?);
    if !output.status.success() {
        bail!("the CUDA workload failed");
    }
    let phases = said
        .lines()
        .filter(|l| l.starts_with("workload:") && !l.contains("skipped"))
        .count() as u32;
    let report = Command::new(&bin)
        .arg("report")
        .arg(&out)
        .arg("--json")
        .output()?;
    let json = String::from_utf8_lossy(&report.stdout);
    let steps = json
        .split("\"steps\": ")
        .nth(1)
        .and_then(|s| {
            s.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u32>()
                .ok()
        })
        .unwrap_or(0);
    let dump = Command::new(&bin)
        .arg("dump")
        .arg(&out)
        .arg("--limit")
        .arg("0")
        .output()?;
    let header = String::from_utf8_lossy(&dump.stdout);
    print!("{header}");
    let all = Command::new(&bin).arg("dump").arg(&out).output()?;
    print_calls(&String::from_utf8_lossy(&all.stdout));
    let text = Command::new(&bin).arg("report").arg(&out).output()?;
    let text = String::from_utf8_lossy(&text.stdout);
    println!("gpu-check: steps, CPU-timed (libcuda calls) and on the device (CUPTI):");
    for line in text
        .lines()
        .skip_while(|l| !l.starts_with("GPU activity") && !l.starts_with("GPU steps"))
        .take_while(|l| !l.is_empty() && !l.starts_with("Diagnoses"))
    {
        println!("  {line}");
    }
    let want = STEPS * phases;
    println!("gpu-check: {steps} GPU steps recorded for {want} workload steps ({phases} phases)");
    if steps < want {
        bail!("expected at least {want} steps from the libcuda uprobes");
    }
    if !header.contains("# GPUs (NVML)") {
        bail!("NVML did not sample the GPU (see the header above)");
    }
    match header.lines().find(|l| l.starts_with("# CUPTI hook records received")) {
        Some(line) => println!("gpu-check: CUPTI hook: {line}"),
        None => println!("gpu-check: CUPTI hook sent nothing (see its line above: no libcupti, or another subscriber?)"),
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("gpu-check: NVML and libcuda uprobes OK");
    Ok(())
}

/// Calls seen per probed symbol (entries), from `tokenscope dump`'s `cuda SYMBOL entry`.
fn print_calls(dump: &str) {
    let mut calls: std::collections::BTreeMap<&str, u64> = Default::default();
    for line in dump.lines() {
        let mut words = line.split_whitespace().skip_while(|w| *w != "cuda").skip(1);
        if let (Some(symbol), Some("entry")) = (words.next(), words.next()) {
            *calls.entry(symbol).or_default() += 1;
        }
    }
    println!("gpu-check: {:<32}{:>8}", "probe", "calls");
    for (symbol, n) in &calls {
        println!("gpu-check: {symbol:<32}{n:>8}");
    }
    if calls.is_empty() {
        println!("gpu-check: no libcuda call was recorded");
    }
}

/// TOKENSCOPE_CUPTI_LIB, a libcupti the loader knows, or the PyPI wheel the cupti-hook
/// tests unpack (carried to a GPU machine with no network).
fn cupti_lib() -> Option<String> {
    if let Ok(lib) = std::env::var("TOKENSCOPE_CUPTI_LIB") {
        return Some(lib);
    }
    if let Some(lib) = resolve("libcupti.so.12") {
        return Some(lib);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| crate::root().join("target"), std::path::PathBuf::from);
    let wheel = target.join("tmp/cupti-wheel/nvidia/cuda_cupti/lib/libcupti.so.12");
    wheel.exists().then(|| wheel.display().to_string())
}

/// find_library gives a soname; the uprobes need the file behind it.
fn resolve(soname: &str) -> Option<String> {
    if soname.is_empty() {
        return None;
    }
    let ldconfig = Command::new("ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&ldconfig.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with(soname))
        .and_then(|l| l.rsplit("=> ").next())
        .map(|p| {
            std::fs::canonicalize(p.trim())
                .map_or(p.trim().to_string(), |c| c.display().to_string())
        })
}
