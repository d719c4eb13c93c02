//! `cargo xtask gpu-check`: on a machine with an NVIDIA GPU, exercises the real
//! NVML library and the libcuda uprobes against small CUDA workloads and checks what
//! tokenscope recorded: one that calls the driver through ctypes (PTX JIT, no toolkit
//! needed: eager steps, the same through the `_ptsz` entry points, and CUDA graph
//! replays), and, where python3 has torch, one that calls it as engines do (cudart and
//! cuBLAS, eager and CUDA graph steps). The CUPTI hook is loaded into both
//! (CUDA_INJECTION64_PATH); it needs a libcupti (CUDA toolkit, TOKENSCOPE_CUPTI_LIB,
//! libcupti.so.12 beside prebuilt binaries, or the PyPI wheel the cupti-hook tests unpack
//! into target/tmp/cupti-wheel), and without one the check says so instead of failing.
//! It prints one table: calls seen per probed symbol, and the steps CPU-timed (libcuda
//! calls) beside GPU-timed (CUPTI).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

const STEPS: u32 = 50;

const USAGE: &str = "\
usage: cargo xtask gpu-check [--prebuilt DIR] [--keep DIR]

  --prebuilt DIR  use DIR/tokenscope and DIR/libtokenscope_cupti_hook.so (and DIR/libcupti.so.12
                  when there) instead of installing packages and building: for GPU machines
                  with no network or no Rust toolchain
  --keep DIR      leave the recording (gpu.tsrec) and the report (report.txt) in DIR

example, binaries built on another machine and copied beside the workspace:
  xtask gpu-check --prebuilt .gpu --keep /tmp/gpu-check";

struct Options {
    prebuilt: Option<PathBuf>,
    keep: Option<PathBuf>,
}

fn options(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        prebuilt: None,
        keep: None,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .map(PathBuf::from)
                .with_context(|| format!("{arg} needs a folder\n{USAGE}"))
        };
        match arg.as_str() {
            "--prebuilt" => opts.prebuilt = Some(value()?),
            "--keep" => opts.keep = Some(value()?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument '{other}'\n{USAGE}"),
        }
    }
    Ok(opts)
}

pub(crate) fn run(args: &[String]) -> Result<()> {
    let opts = options(args)?;
    if !Path::new("/dev/nvidia0").exists() && Command::new("nvidia-smi").output().is_err() {
        bail!("no NVIDIA GPU here (/dev/nvidia0 missing, no nvidia-smi): gpu-check needs one");
    }
    let (bin, hook) = match &opts.prebuilt {
        Some(dir) => {
            crate::setup::mount_tracefs()?;
            let dir = std::fs::canonicalize(dir)
                .with_context(|| format!("--prebuilt {}", dir.display()))?;
            (
                dir.join("tokenscope"),
                dir.join("libtokenscope_cupti_hook.so"),
            )
        }
        None => {
            crate::setup::run()?;
            // No `--bin`: it would leave the hook's cdylib out of target/release.
            crate::cargo(&[
                "build",
                "--release",
                "-p",
                "tokenscope",
                "-p",
                "tokenscope-cupti-hook",
            ])?;
            let release = crate::target_dir().join("release");
            (
                release.join("tokenscope"),
                release.join("libtokenscope_cupti_hook.so"),
            )
        }
    };
    for file in [&bin, &hook] {
        if !file.is_file() {
            bail!("{} is missing", file.display());
        }
    }
    let dir = std::env::temp_dir().join(format!("tokenscope-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let workloads = [
        (dir.join("workload.py"), include_str!("workload.py")),
        (
            dir.join("workload_torch.py"),
            include_str!("workload_torch.py"),
        ),
    ];
    for (path, text) in &workloads {
        std::fs::write(path, text)?;
    }
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
        .or_else(driver_dir_libcuda)
        .context("libcuda.so.1 not found (ctypes.util.find_library('cuda'), /usr/local/nvidia)")?;
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
    let cupti = cupti_lib(opts.prebuilt.as_deref());
    match &cupti {
        Some(lib) => println!("gpu-check: libcupti {lib}"),
        None => println!("gpu-check: no libcupti found; the hook will say so"),
    }
    let mut said = String::new();
    let mut failed = None;
    for (workload, _) in &workloads {
        let mut cmd = Command::new("python3");
        cmd.arg(workload)
            .arg(STEPS.to_string())
            .env("CUDA_INJECTION64_PATH", &hook)
            .env("TOKENSCOPE_CUPTI_SOCKET", &socket);
        if let Some(lib) = &cupti {
            cmd.env("TOKENSCOPE_CUPTI_LIB", lib);
        }
        let output = cmd.output()?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        print!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
        said.push_str(&stdout);
        if !output.status.success() && failed.is_none() {
            failed = Some(workload.display().to_string());
        }
    }
    print!("{}", rec.stop_output()?);
    if let Some(workload) = failed {
        bail!("the CUDA workload {workload} failed");
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
    if let Some(keep) = &opts.keep {
        std::fs::create_dir_all(keep)?;
        std::fs::copy(&out, keep.join("gpu.tsrec"))?;
        std::fs::write(keep.join("report.txt"), text.as_bytes())?;
        println!("gpu-check: recording and report kept in {}", keep.display());
    }
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

/// TOKENSCOPE_CUPTI_LIB, a libcupti the loader knows, one beside prebuilt binaries, or the
/// PyPI wheel the cupti-hook tests unpack.
fn cupti_lib(prebuilt: Option<&Path>) -> Option<String> {
    if let Ok(lib) = std::env::var("TOKENSCOPE_CUPTI_LIB") {
        return Some(lib);
    }
    if let Some(lib) = resolve("libcupti.so.12") {
        return Some(lib);
    }
    let beside = prebuilt.map(|dir| dir.join("libcupti.so.12"));
    let wheel = crate::target_dir().join("tmp/cupti-wheel/nvidia/cuda_cupti/lib/libcupti.so.12");
    first_existing(beside.into_iter().chain([wheel]))
}

/// The first of `files` that exists, as the file behind any links.
fn first_existing(files: impl IntoIterator<Item = std::path::PathBuf>) -> Option<String> {
    files
        .into_iter()
        .find(|lib| lib.exists())
        .and_then(|lib| std::fs::canonicalize(lib).ok())
        .map(|lib| lib.display().to_string())
}

/// Container images mount the driver's libraries under /usr/local/nvidia, which the
/// loader's cache may not list.
fn driver_dir_libcuda() -> Option<String> {
    first_existing(
        [
            "/usr/local/nvidia/lib64",
            "/usr/local/nvidia/lib",
            "/usr/lib/x86_64-linux-gnu",
        ]
        .iter()
        .map(|dir| Path::new(dir).join("libcuda.so.1")),
    )
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
