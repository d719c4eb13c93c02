//! `cargo xtask gpu-check`: on a machine with an NVIDIA GPU, exercises the real
//! NVML library and the libcuda uprobes against a small CUDA workload (PTX JIT
//! through the driver, no toolkit needed), and checks what tokenscope recorded.
//! The CUPTI hook is loaded into the workload too (CUDA_INJECTION64_PATH); it
//! needs a libcupti (CUDA toolkit, or TOKENSCOPE_CUPTI_LIB), and without one the
//! check says so instead of failing.

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
    let status = Command::new("python3")
        .arg(&workload)
        .arg(STEPS.to_string())
        .env("CUDA_INJECTION64_PATH", &hook)
        .env("TOKENSCOPE_CUPTI_SOCKET", &socket)
        .status()?;
    print!("{}", rec.stop_output()?);
    if !status.success() {
        bail!("the CUDA workload failed");
    }
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
    println!("gpu-check: {steps} GPU steps recorded for {STEPS} workload steps");
    if steps < STEPS {
        bail!("expected at least {STEPS} steps from the libcuda uprobes");
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
