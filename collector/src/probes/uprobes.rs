//! The uprobe families (libcuda calls, OpenSSL plaintext): one entry and one return
//! program each, attached to every symbol of the set in each file found.

use std::path::PathBuf;

use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope};
use aya::programs::UProbe;
use aya::Ebpf;
use probe_ebpf::abi;

use super::{error_chain, one_line, preflight, prologue, ProbeError};

/// A family of uprobes: one entry and one return program for many symbols, the
/// attach cookie saying which symbol fired.
pub(super) struct UprobeSet {
    /// What the set traces, for the line that says it is off.
    what: &'static str,
    entry: &'static str,
    ret: &'static str,
    symbols: &'static [(&'static str, u32)],
    /// Symbols whose return is not probed (their entry alone means something).
    entry_only: &'static [u32],
}

pub(super) const CUDA_UPROBES: &UprobeSet = &UprobeSet {
    what: "GPU calls (libcuda)",
    entry: probe_ebpf::UPROBE_CUDA_ENTRY,
    ret: probe_ebpf::UPROBE_CUDA_RETURN,
    symbols: probe_ebpf::CUDA_SYMBOLS,
    // What a step needs is each launch's and copy's entry and the return of what waits
    // (a synchronisation, a blocking copy); a launch's return says nothing (it is
    // asynchronous), and a return probe costs a second trap on the engine's launch path.
    // On the lab's load this leaves 8 of its 14 hits per step (and 2% of the events);
    // an eager prefill's hundreds of launches gain the most.
    entry_only: &[
        abi::CU_LAUNCH_KERNEL,
        abi::CU_LAUNCH_KERNEL | abi::CU_PER_THREAD,
        abi::CU_LAUNCH_KERNEL_EX,
        abi::CU_LAUNCH_KERNEL_EX | abi::CU_PER_THREAD,
        abi::CU_GRAPH_LAUNCH,
        abi::CU_GRAPH_LAUNCH | abi::CU_PER_THREAD,
        abi::CU_MEMCPY_DTOH_ASYNC,
        abi::CU_MEMCPY_DTOH_ASYNC | abi::CU_PER_THREAD,
    ],
};

pub(super) const TLS_UPROBES: &UprobeSet = &UprobeSet {
    what: "TLS plaintext (OpenSSL)",
    entry: probe_ebpf::UPROBE_SSL_ENTRY,
    ret: probe_ebpf::UPROBE_SSL_RETURN,
    symbols: probe_ebpf::SSL_SYMBOLS,
    entry_only: &[abi::SSL_SHUTDOWN, abi::SSL_FREE],
};

/// Uprobes on every symbol of `set` in each file (entry and return). A symbol a
/// file lacks is skipped with a line; uprobes are optional as a whole.
pub(super) fn attach_uprobes(
    ebpf: &mut Ebpf,
    set: &UprobeSet,
    files: &[PathBuf],
    attached: &mut Vec<String>,
    skipped: &mut Vec<String>,
) -> Result<Vec<(&'static str, UProbeLinkId)>, ProbeError> {
    let mut links = Vec::new();
    if files.is_empty() {
        return Ok(links);
    }
    // Both programs load, or the set is off with a line (a kernel before 5.15 has no
    // attach cookies, which say which symbol fired): never half a set, never a failed
    // recording for want of optional uprobes.
    for program in [set.entry, set.ret] {
        if let Err(e) = uprobe_program(ebpf, program)?.load() {
            skipped.push(format!(
                "uprobe program {program}: {}",
                one_line(&error_chain(&e))
            ));
            return Ok(links);
        }
    }
    // Each symbol's probe goes past a leading guard compare where there is one (see
    // prologue.rs): the same call seen, without the single-step trap.
    let names: Vec<&str> = set.symbols.iter().map(|&(s, _)| s).collect();
    let offsets: Vec<Vec<u64>> = files
        .iter()
        .map(|f| prologue::guard_offsets(f, &names))
        .collect();
    for program in [set.entry, set.ret] {
        let up = uprobe_program(ebpf, program)?;
        for (file, offsets) in files.iter().zip(&offsets) {
            let mut missing = Vec::new();
            for (&(symbol, cookie), &offset) in set.symbols.iter().zip(offsets) {
                if program == set.ret && set.entry_only.contains(&cookie) {
                    continue;
                }
                let at = if offset == 0 {
                    String::new()
                } else {
                    format!("+{offset}")
                };
                let label = format!("uprobe:{symbol}{at}@{}", file.display());
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::SymbolOffset(symbol, offset),
                    cookie: Some(u64::from(cookie)),
                };
                match up.attach(point, file, UProbeScope::AllProcesses) {
                    Ok(id) => {
                        links.push((program, id));
                        if program == set.entry {
                            attached.push(label);
                        }
                    }
                    Err(e) if program == set.entry => {
                        let why = one_line(&error_chain(&e));
                        // Without CAP_SYS_ADMIN the kernel refuses every uprobe: one
                        // line for the set, not one per symbol and file.
                        if is_refused(&why) && !preflight::has_sys_admin() {
                            skipped.push(format!(
                                "{} not traced: uprobes need CAP_SYS_ADMIN, which this process \
                                 lacks ({why})",
                                set.what
                            ));
                            return Ok(links);
                        }
                        // A library exports some of the variants only (`_ptsz` forms,
                        // newer calls): those are listed once per file, below.
                        if why.contains("unknown symbol") {
                            missing.push(symbol);
                        } else {
                            skipped.push(format!("{label}: {why}"));
                        }
                    }
                    // A return probe that fails where the entry attached leaves calls
                    // that never end: say so (the entry attempt said why it failed).
                    Err(e) if attached.contains(&label) => {
                        skipped.push(format!("{label} (return): {}", one_line(&error_chain(&e))))
                    }
                    Err(_) => {}
                }
            }
            if program == set.entry && !missing.is_empty() {
                skipped.push(not_exported(file, set.symbols, &missing));
            }
        }
    }
    Ok(links)
}

/// perf_event_open said no for want of privilege.
fn is_refused(why: &str) -> bool {
    why.contains("Permission denied") || why.contains("Operation not permitted")
}

/// One line for the symbols of a set a file does not export: all of them means the file
/// gives nothing (not the library the engine calls, or a driver too old or too new).
fn not_exported(file: &std::path::Path, all: &[(&str, u32)], missing: &[&str]) -> String {
    if missing.len() == all.len() {
        let names: Vec<&str> = all.iter().map(|(s, _)| *s).collect();
        format!(
            "uprobe: {} exports none of {}: no calls from it",
            file.display(),
            names.join(", ")
        )
    } else {
        format!(
            "uprobe: {} does not export {} (the rest are probed)",
            file.display(),
            missing.join(", ")
        )
    }
}

fn uprobe_program<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut UProbe, ProbeError> {
    ebpf.program_mut(program)
        .ok_or_else(|| ProbeError::Load(format!("program {program} missing from the object")))?
        .try_into()
        .map_err(|e| ProbeError::Load(format!("{program}: {e}")))
}
