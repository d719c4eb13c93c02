//! `cargo xtask <task>`: the project's automation. A fresh Debian machine with
//! only the Rust toolchain needs nothing but `cargo xtask demo` or
//! `cargo xtask test`: both run `setup` first.

mod bench;
mod demo;
mod dist;
mod fixtures;
mod fuzz;
mod gpu;
mod kernels;
mod setup;
mod venvs;
mod watchdog;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  setup   install missing system packages (apt-get), mount tracefs
  test    setup, build once, run unit tests, then privileged end-to-end tests one at a time,
          then every fuzz target briefly and the planted-bug check, then the kernel matrix
          (test-kernels)
  test-kernels  boot older kernels (Debian 12's 6.1) in QEMU and run the I/O-source tests inside
  demo    setup, then run `tokenscope-lab demo --compare` (lab engine + nginx, untuned vs tuned)
  bench   setup, then, on the profiler as `dist` builds it, the cost table (record, report,
          export, top, 64/256/1000 streams, replay scaling; printed and written to
          BENCHMARKS.md), probe overhead and event
          throughput (same-run ratios), uprobe costs, the agent; `bench table`: the table
          alone; `bench top [BIN..]`: top's row alone (printed only), and each other tokenscope
          binary's in turn on the same lab (before/after); `bench scaling`: replay of a
          recording replicated 1x, 10x, 100x alone;
          `bench agent`: tokenscope agent's and record's CPU and RSS under the lab's loads alone
  lint    cargo fmt --check and clippy with warnings denied (the fuzz crate too)
  fuzz    coverage-guided fuzzing of every parser and decoder (libFuzzer); `fuzz --help`
  fixtures  re-record the diagnosis fixtures (tests/fixtures/diagnose) from the lab scenarios;
          `fixtures NAME..`: those scenarios only
  dist    the shipped profiler: release binary (lto, stripped) with its size, the CUPTI hook,
          shell completions (bash, zsh, fish) and man pages, in dist/
  gpu-check  on a machine with an NVIDIA GPU: real NVML and libcuda uprobes vs CUDA workloads
          (ctypes and, where python3 has it, PyTorch); `gpu-check --help`
  watchdog SECS PROGRAM [ARGS..]  run PROGRAM; after SECS print where its threads wait, kill
          it and exit 124 (`test` runs each test binary so, for 600 s at most)";

fn main() {
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "setup" => setup::run(),
        "test" => test(),
        "demo" => demo::run(),
        "bench" => bench::run(
            std::env::args().nth(2).as_deref(),
            &std::env::args().skip(3).collect::<Vec<_>>(),
        ),
        "lint" => lint(),
        "fixtures" => fixtures::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        "fuzz" => fuzz::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        "dist" => dist::run(),
        "gpu-check" => gpu::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        "test-kernels" => kernels::run(),
        "watchdog" => watchdog::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        "" | "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("{USAGE}");
            Err(anyhow::anyhow!("unknown task '{other}'"))
        }
    };
    if let Err(e) = result {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn test() -> Result<()> {
    setup::run()?;
    let started = std::time::Instant::now();
    let venvs = venvs::start();
    cargo(&["build", "--workspace", "--all-targets"])?;
    // Each test binary under a time limit: a hang fails with its stacks printed.
    let runner = watchdog::runner_config()?;
    let test = ["--config", runner.as_str(), "test"];
    // Unit tests need no privileges and run in parallel.
    cargo(&[&test[..], &["--workspace", "--lib", "--bins"]].concat())?;
    venvs.finish();
    // End-to-end tests load eBPF and share kernel state: one at a time. Every binary runs even
    // after a failure, so one run shows every failing test.
    cargo(
        &[
            &test[..],
            &["--workspace", "--no-fail-fast", "--test", "*"],
            &["--", "--test-threads=1"],
        ]
        .concat(),
    )?;
    // The delayed wire's self-test times a real TCP echo to the half millisecond: alone,
    // now that nothing else runs (among the parallel unit tests it read 0.5-1 ms late).
    // `--workspace --lib --bins` as the unit stage builds it: `-p tokenscope-test-support`
    // resolves features for that crate alone and rebuilt 90 crates (86 s of a CI run).
    cargo(
        &[
            &test[..],
            &["--workspace", "--lib", "--bins"],
            &["wire::tests::wire_holds_each_direction"],
            &["--", "--ignored", "--test-threads=1"],
        ]
        .concat(),
    )?;
    // Every parser and decoder under libFuzzer for a few seconds each, and proof that
    // the fuzzer finds a planted bug (a few minutes; see fuzz::CI_SECONDS).
    fuzz::ci()?;
    // The same probes on the kernels production hosts run (QEMU without KVM).
    kernels::run()?;
    println!("xtask: all tests passed in {:.0?}", started.elapsed());
    Ok(())
}

fn lint() -> Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    // The fuzz crate is a workspace of its own: `--workspace` leaves it out.
    let fuzz = "fuzz/Cargo.toml";
    cargo(&["fmt", "--manifest-path", fuzz, "--", "--check"])?;
    cargo(&[
        "clippy",
        "--manifest-path",
        fuzz,
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Where cargo builds: `CARGO_TARGET_DIR` when set (relative to the workspace,
/// where `crate::cargo` runs), else `target/`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    }
}

/// Builds the profiler and the lab (`release` or debug); the folder they are in.
pub fn build_binaries(release: bool) -> Result<PathBuf> {
    let mut args = vec![
        "build",
        "-p",
        "tokenscope",
        "-p",
        "tokenscope-lab",
        "--bins",
    ];
    if release {
        args.push("--release");
    }
    cargo(&args)?;
    Ok(target_dir().join(if release { "release" } else { "debug" }))
}

pub fn cargo(args: &[&str]) -> Result<()> {
    run(&mut cargo_command(args))
}

/// `cargo ARGS` in the workspace root, as a shell would run it (see `cargo`).
pub fn cargo_command(args: &[&str]) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    // `cargo xtask` runs us as `cargo run` does, with xtask's CARGO_PKG_*, CARGO_MANIFEST_*
    // and the like set; builds from here must see what a shell's see (and what
    // test-support's nested builds see), or build scripts watching them (ring's) rebuild
    // ring and everything above it on every switch: 100 s of each CI run.
    for (name, _) in std::env::vars_os() {
        let cargo_run_var = name.to_str().is_some_and(|n| {
            [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_RUSTC_CURRENT_DIR",
                "OUT_DIR",
            ]
            .iter()
            .any(|v| n.starts_with(v))
        });
        if cargo_run_var {
            cmd.env_remove(name);
        }
    }
    cmd.args(args).current_dir(root());
    cmd
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}
