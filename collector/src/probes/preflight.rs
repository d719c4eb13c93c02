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
    if let Some(mode) = lockdown() {
        if mode == "confidentiality" {
            return Err(ProbeError::LockedDown(format!("{LOCKDOWN}: [{mode}]")));
        }
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

const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

/// The kernel's lockdown mode (`none`, `integrity`, `confidentiality`: the one in
/// brackets), when securityfs shows it. Only `confidentiality` stops the probes: it
/// denies eBPF reads of kernel memory (LOCKDOWN_BPF_READ_KERNEL).
fn lockdown() -> Option<String> {
    let text = std::fs::read_to_string(LOCKDOWN).ok()?;
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

/// The kernel's own BTF. `TOKENSCOPE_KERNEL_BTF` points elsewhere, so a kernel without
/// BTF can be played on one that has it (the tests do).
pub fn kernel_btf_path() -> PathBuf {
    std::env::var_os("TOKENSCOPE_KERNEL_BTF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/sys/kernel/btf/vmlinux"))
}

/// Uprobes (perf_event_open on the uprobe PMU) need CAP_SYS_ADMIN, not CAP_PERFMON.
pub(super) fn has_sys_admin() -> bool {
    effective_caps().is_some_and(|c| c & (1u64 << CAP_SYS_ADMIN) != 0)
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

/// tracefs as the probes need it: found mounted, or mounted here and unmounted again
/// when dropped (after the probes it served), so the host is left as it was found.
#[derive(Debug)]
pub(super) struct Tracefs {
    pub path: PathBuf,
    mounted_here: bool,
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if !self.mounted_here {
            return;
        }
        let Ok(path) = std::ffi::CString::new(self.path.as_os_str().as_encoded_bytes()) else {
            return;
        };
        // SAFETY: a valid NUL-terminated path. Busy (another process opened a file in
        // it since): detached, so it goes once that file is closed.
        unsafe {
            if libc::umount2(path.as_ptr(), 0) != 0 {
                libc::umount2(path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
}

/// The mounted tracefs, mounting it at /sys/kernel/tracing when it is not.
pub(super) fn ensure_tracefs() -> Result<Tracefs, ProbeError> {
    if let Some(path) = tracefs_root() {
        return Ok(Tracefs {
            path,
            mounted_here: false,
        });
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
    let mounted = Tracefs {
        path: PathBuf::from("/sys/kernel/tracing"),
        mounted_here: true,
    };
    match tracefs_root() {
        Some(path) if path == mounted.path => Ok(mounted),
        _ => Err(ProbeError::NoTracefs(
            "mounted, but no events directory appeared".into(),
        )),
    }
}
