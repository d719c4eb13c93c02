//! System set-up: the Debian packages the build and tests need, and tracefs.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Build: clang-19 + libbpf headers (+ kernel UAPI headers) compile the probes.
/// Tests: nginx, curl, openssl, bpftool, python3-venv (the openai SDK test and virtme-ng),
/// tmux (TUI test), QEMU (the kernel matrix), g++ (libFuzzer), Prometheus (the agent's
/// scrape test).
const PACKAGES: &[&str] = &[
    "clang-19",
    "libbpf-dev",
    "linux-libc-dev",
    "bpftool",
    "nginx",
    "curl",
    "openssl",
    "python3-venv",
    "tmux",
    "util-linux",
    // The lab's lossy scenario drops segments with an nftables rule.
    "nftables",
    // The kernel matrix (test-kernels): QEMU, and what virtme-ng needs of the host.
    "qemu-system-x86",
    "ipxe-qemu",
    "busybox-static",
    "kmod",
    // The fuzz targets (cargo xtask fuzz): libfuzzer-sys builds libFuzzer from C++.
    "g++",
    // A real Prometheus server scrapes `tokenscope agent` (tests/agent_prometheus.rs).
    "prometheus",
];
const POLICY_RC: &str = "/usr/sbin/policy-rc.d";

pub(crate) fn run() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        install(&missing)?;
    }
    mount_tracefs()?;
    Ok(())
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn install(missing: &[&str]) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("missing packages {missing:?}: run as root, or install them with apt-get");
    }
    println!("xtask: installing {}", missing.join(" "));
    // Keep Debian's maintainer scripts from starting nginx on port 80.
    let own_policy = !Path::new(POLICY_RC).exists();
    if own_policy {
        std::fs::write(POLICY_RC, "#!/bin/sh\nexit 101\n").context("write policy-rc.d")?;
        crate::run(Command::new("chmod").args(["755", POLICY_RC]))?;
    }
    let result = crate::run(Command::new("apt-get").args(["update", "-q"])).and_then(|_| {
        crate::run(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    });
    if own_policy {
        let _ = std::fs::remove_file(POLICY_RC);
    }
    result
}

pub(crate) fn mount_tracefs() -> Result<()> {
    if [
        "/sys/kernel/tracing/events",
        "/sys/kernel/debug/tracing/events",
    ]
    .iter()
    .any(|p| Path::new(p).is_dir())
    {
        return Ok(());
    }
    println!("xtask: mounting tracefs at /sys/kernel/tracing");
    crate::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}
