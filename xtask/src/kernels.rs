//! `cargo xtask test-kernels`: the kernel matrix. Boots each kernel the package
//! registries offer in QEMU with virtme-ng (PyPI), over this machine's root
//! filesystem, and runs the privileged I/O-source tests (tests/io_sources.rs: lab
//! engine, real nginx, bench, record, report) inside it.
//!
//! Measured on these machines: nested KVM aborts (qemu on MSR 0x10a), so guests run
//! under TCG, which makes every instruction tens of times dearer; a 6.1 boot takes
//! ~20 s. The generic flavour is used: the cloud one lacks 9p, which virtme needs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One kernel of the matrix: the newest Debian package whose name matches.
struct MatrixKernel {
    /// What it stands for (the distributions that ship this line).
    label: &'static str,
    /// `apt-cache search --names-only` pattern.
    package: &'static str,
}

const MATRIX: &[MatrixKernel] = &[MatrixKernel {
    label: "Debian 12 / Amazon Linux 2023 line (6.1)",
    package: r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
}];

/// The test binary run inside each guest.
const GUEST_TESTS: &str = "io_sources";
/// Per guest: boot, tests and power-off.
const GUEST_TIMEOUT: Duration = Duration::from_secs(20 * 60);

pub(crate) fn run() -> Result<()> {
    crate::setup::run()?;
    let work = crate::root().join("target/kernel-matrix");
    std::fs::create_dir_all(&work).context("create target/kernel-matrix")?;
    let vng = virtme_ng(&work)?;
    let tests = build_tests()?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for k in MATRIX {
        let started = Instant::now();
        let (package, kimg) = kernel_image(&work, k)?;
        println!("xtask: booting {package} ({}) under TCG", k.label);
        let outcome = boot_and_test(&vng, &kimg, &tests, &work.join("out").join(&package));
        let secs = started.elapsed().as_secs();
        match outcome {
            Ok(summary) => rows.push(format!("{package}: passed in {secs} s; {summary}")),
            Err(e) => {
                rows.push(format!("{package}: FAILED in {secs} s: {e:#}"));
                failed.push(package);
            }
        }
    }
    println!("xtask: kernel matrix");
    for r in &rows {
        println!("  {r}");
    }
    if !failed.is_empty() {
        bail!("the kernel matrix failed on {}", failed.join(", "));
    }
    Ok(())
}

/// virtme-ng in a venv of its own (PyPI is reachable; Debian 12 does not package it).
fn virtme_ng(work: &Path) -> Result<PathBuf> {
    let venv = work.join("venv");
    let vng = venv.join("bin/vng");
    if !vng.exists() {
        crate::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        crate::run(Command::new(venv.join("bin/pip")).args([
            "install",
            "-q",
            "--disable-pip-version-check",
            "virtme-ng",
        ]))?;
    }
    Ok(vng)
}

/// Builds the guest's test binary (and the tokenscope binary it runs); its path.
fn build_tests() -> Result<PathBuf> {
    // The demo test runs the lab's binary; no cargo builds it inside the guest. Built as
    // `cargo xtask test` builds the workspace (the same features, so there a no-op).
    crate::cargo(&["build", "--workspace", "--all-targets"])?;
    let out = crate::cargo_command(&["test", "--workspace", "--test", GUEST_TESTS, "--no-run"])
        .output()
        .context("cargo test --no-run")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("building the {GUEST_TESTS} tests failed:\n{stderr}");
    }
    // "  Executable tests/io_sources.rs (/path/target/debug/deps/io_sources-<hash>)"
    stderr
        .lines()
        .filter(|l| l.contains(&format!("tests/{GUEST_TESTS}.rs")))
        .find_map(|l| l.rsplit_once('(')?.1.strip_suffix(')').map(PathBuf::from))
        .with_context(|| format!("cargo did not name the {GUEST_TESTS} test binary:\n{stderr}"))
}

/// The newest package matching `k`, downloaded and unpacked; (package, vmlinuz path).
fn kernel_image(work: &Path, k: &MatrixKernel) -> Result<(String, PathBuf)> {
    let package = match newest_package(k.package)? {
        Some(p) => p,
        None => {
            // A fresh machine may not have read the package lists yet.
            crate::run(Command::new("apt-get").args(["update", "-q"]))?;
            newest_package(k.package)?
                .with_context(|| format!("no package matches {} in apt", k.package))?
        }
    };
    let unpacked = work.join(&package);
    let boot = unpacked.join("boot");
    if !boot.is_dir() {
        let debs = work.join("debs");
        std::fs::create_dir_all(&debs)?;
        crate::run(
            Command::new("apt-get")
                .args(["download", "-q", &package])
                .current_dir(&debs),
        )?;
        let deb = std::fs::read_dir(&debs)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            })
            .with_context(|| format!("apt-get download left no .deb for {package}"))?;
        crate::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    }
    let kimg = std::fs::read_dir(&boot)
        .with_context(|| format!("{}", boot.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no vmlinuz in {}", boot.display()))?;
    Ok((package, kimg))
}

fn newest_package(pattern: &str) -> Result<Option<String>> {
    let out = Command::new("apt-cache")
        .args(["search", "--names-only", pattern])
        .output()
        .context("apt-cache search")?;
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    // linux-image-6.1.0-<ABI>-amd64-unsigned: the ABI number orders them.
    names.sort_by_key(|n| {
        n.split('-')
            .filter_map(|p| p.parse::<u32>().ok())
            .collect::<Vec<_>>()
    });
    Ok(names.pop())
}

/// Boots `kimg` with the host's root filesystem (modules from the unpacked package),
/// runs the tests, and returns their one-line summary. virtme's console carries the
/// kernel's messages; the tests write to a shared writable folder instead.
fn boot_and_test(vng: &Path, kimg: &Path, tests: &Path, out: &Path) -> Result<String> {
    std::fs::create_dir_all(out)?;
    let (log, status) = (out.join("tests.log"), out.join("status"));
    for f in [&log, &status] {
        let _ = std::fs::remove_file(f);
    }
    let script = format!(
        "cd {root} && TOKENSCOPE_KERNEL_MATRIX=1 {tests} --test-threads=1 --nocapture \
         > {log} 2>&1; echo $? > {status}",
        root = crate::root().display(),
        tests = tests.display(),
        log = log.display(),
        status = status.display(),
    );
    let console = std::fs::File::create(out.join("console.log"))?;
    let path = format!(
        "{}:{}:/usr/sbin:/sbin",
        vng.parent().expect("venv bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new(vng)
        .arg("--run")
        .arg(kimg)
        // One vCPU: under TCG a second one adds cross-CPU interrupts and host threads
        // competing for the host's cores, and tails of a whole 4 ms tick to the timings
        // (measured: TTFT error p99 1.4 ms with two, 0.5 ms with one). The TSC, unlike
        // the HPET the kernel picks under TCG, is read without an emulated device access.
        .args([
            "--disable-kvm",
            "--memory",
            "4G",
            "--cpus",
            "1",
            "--verbose",
        ])
        .args(["--append", "tsc=reliable clocksource=tsc"])
        .arg("--rwdir")
        .arg(out)
        .arg("--exec")
        .arg(&script)
        .env("PATH", path)
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("start vng")?;
    let deadline = Instant::now() + GUEST_TIMEOUT;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the guest ran past {} s (console: {})",
                GUEST_TIMEOUT.as_secs(),
                out.join("console.log").display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    print!("{text}");
    let code = std::fs::read_to_string(&status).with_context(|| {
        format!(
            "the guest never ran the tests to the end (console: {})",
            out.join("console.log").display()
        )
    })?;
    // The figures the tests print: accuracy against bench, and source vs source.
    let summary = text
        .lines()
        .filter_map(|l| {
            let at = l
                .find("accuracy, ")
                .or_else(|| l.find(" ... ").filter(|_| l.contains("vs syscall source:")))?;
            Some(l[at..].trim_start_matches(" ... ").trim().to_string())
        })
        .collect::<Vec<_>>()
        .join("; ");
    match code.trim() {
        "0" => Ok(summary),
        other => bail!("the tests exited with status {other} in the guest"),
    }
}
