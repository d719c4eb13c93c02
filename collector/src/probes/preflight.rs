//! Checks that turn the usual set-up problems into one clear line each, before
//! aya gets a chance to fail with an errno deep in a map creation.

use std::path::{Path, PathBuf};

use super::{ProbeConfig, ProbeError};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const TRACEFS_PATHS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

pub(super) fn check(cfg: &ProbeConfig) -> Result<(), ProbeError> {
    let caps = effective_caps().unwrap_or(0);
    let has = |c: u32| caps & (1u64 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
            .into_iter()
            .filter(|(c, _)| !has(*c))
            .map(|(_, name)| name)
            .chain(["CAP_SYS_ADMIN"])
            .collect();
        return Err(ProbeError::NotPrivileged(missing.join(", ")));
    }
    if cfg.btf.is_none() {
        let btf = kernel_btf_path();
        if !btf.exists() {
            return Err(ProbeError::NoBtf(btf.display().to_string()));
        }
    }
    for pid in &cfg.pids {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(ProbeError::NoSuchPid(*pid));
        }
    }
    Ok(())
}

/// The kernel's own BTF. `TOKENSCOPE_KERNEL_BTF` points elsewhere, so a kernel without
/// BTF can be played on one that has it (the tests do).
pub fn kernel_btf_path() -> PathBuf {
    std::env::var_os("TOKENSCOPE_KERNEL_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The mounted tracefs, if any.
pub fn tracefs_root() -> Option<PathBuf> {
    TRACEFS_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
}

/// The mounted tracefs, mounting it at /sys/kernel/tracing when it is not.
pub(super) fn ensure_tracefs() -> Result<PathBuf, ProbeError> {
    if let Some(p) = tracefs_root() {
        return Ok(p);
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(ProbeError::NoTracefs(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    tracefs_root()
        .ok_or_else(|| ProbeError::NoTracefs("mounted, but no events directory appeared".into()))
}
