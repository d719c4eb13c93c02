//! Loading and attaching the eBPF probes (the only module that imports aya).
//! A tracepoint the kernel lacks is skipped with a reason, unless the
//! recording would be useless without it.

mod detach;
mod discover;
mod heap;
mod io_source;
mod netns;
mod preflight;
mod prologue;
mod ring;
mod uprobes;

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, Map, PerCpuArray};
use aya::programs::kprobe::KProbeLinkId;
use aya::programs::trace_point::TracePointLinkId;
use aya::programs::uprobe::UProbeLinkId;
use aya::programs::{KProbe, TracePoint};
use aya::{Btf, Ebpf, EbpfLoader, Endianness};
use probe_ebpf::{abi, ProbeGroup, Tracepoint, KPROBES, TRACEPOINTS};

pub use heap::give_back_freed_memory;
use io_source::KernelFeatures;
pub use io_source::{IoSource, IoSourceChoice};
pub use netns::NetnsTarget;
pub use preflight::{kernel_btf_path, tracefs_root};
use uprobes::{attach_uprobes, CUDA_UPROBES, TLS_UPROBES};

/// Default ring buffer: 8 MiB; a token-sized I/O record is ~350 bytes.
pub const DEFAULT_RING_BYTES: u32 = 8 << 20;
/// Default ring buffer of a live view (`top`), which drains it every
/// `record::DRAIN_LIVE` (100 ms) rather than every `record::DRAIN_TO_FILE` (500 ms):
/// 4 MiB, woken at 1 MiB pending. At issue 17's load (~6 MB/s of records) a drain takes
/// 0.6 MB. The ring's pages are resident once it has wrapped: the 8 MiB ring was 8 MB
/// of top's RSS (of a 64 MB target), and kernel memory whether mapped or not.
pub const LIVE_RING_BYTES: u32 = 4 << 20;

/// Whether the probes take a ring buffer of `bytes`: a power of two, at least a page.
pub fn ring_bytes_ok(bytes: u32) -> bool {
    bytes >= 4096 && bytes.is_power_of_two()
}
/// Default payload bytes copied per I/O: a buffering proxy's coalesced SSE writes fit.
pub const DEFAULT_PAYLOAD_CAP: u32 = 16384;
/// The probes wake the consumer once this much is pending (a quarter of a smaller
/// ring): each wake-up costs a context switch and a cold start of the consumer's
/// working set, so fewer and larger drains (`record::DRAIN_TO_FILE`). 6 MiB of the
/// default ring stay free for what arrives while a drain runs (a drain of 2 MiB
/// takes ~10 ms).
const WAKEUP_BYTES: u64 = 2 << 20;

#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// Trace only these processes (empty: all). TCP state changes and
    /// retransmits run in softirq, so they are filtered by port and namespace only.
    pub pids: Vec<u32>,
    /// Trace only sockets with one of these local or remote ports (empty: all).
    pub ports: Vec<u16>,
    /// Ring buffer size in bytes (a power of two, at least one page).
    pub ring_bytes: u32,
    /// Payload bytes copied per socket I/O (at most `abi::PAYLOAD_MAX`).
    pub payload_cap: u32,
    /// libcuda files to put uprobes on (empty: no GPU probes).
    pub libcuda: Vec<PathBuf>,
    /// Files exporting OpenSSL's SSL_read/SSL_write (libssl.so*, or executables that
    /// link it statically and export it) to put plaintext uprobes on (empty: none).
    pub libssl: Vec<PathBuf>,
    /// Where socket I/O events come from (auto: the best the kernel has).
    pub io_source: IoSourceChoice,
    /// A BTF file for kernels without /sys/kernel/btf/vmlinux (BTFHub-style).
    pub btf: Option<PathBuf>,
    /// Trace only this network namespace (None: every one). Sockets are tested by
    /// their own namespace, uprobes by the calling process's.
    pub netns: Option<NetnsTarget>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            pids: Vec::new(),
            ports: Vec::new(),
            ring_bytes: DEFAULT_RING_BYTES,
            payload_cap: DEFAULT_PAYLOAD_CAP,
            libcuda: Vec::new(),
            libssl: Vec::new(),
            io_source: IoSourceChoice::Auto,
            btf: None,
            netns: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("this tokenscope was built without its eBPF probes (clang was missing at build time); run `cargo xtask setup` and rebuild")]
    NotBuilt,
    #[error("not privileged (no {0}): loading eBPF needs root, or CAP_BPF and CAP_PERFMON (plus CAP_SYS_ADMIN for uprobes); run as root or: setcap cap_bpf,cap_perfmon,cap_sys_admin+ep tokenscope")]
    NotPrivileged(String),
    #[error("the kernel is locked down ({0}): it refuses eBPF programs that read kernel memory, which every tokenscope probe does; boot with lockdown=integrity (or none), e.g. by turning off Secure Boot's lockdown for this host")]
    LockedDown(String),
    #[error("kernel BTF not found at {0}: this kernel was built without CONFIG_DEBUG_INFO_BTF; pass one for it with --btf FILE (BTFHub-style)")]
    NoBtf(String),
    #[error("--btf {path}: {reason}")]
    BadBtf { path: String, reason: String },
    #[error("--netns {target}: {reason}")]
    BadNetns { target: String, reason: String },
    #[error("no usable socket I/O source in this kernel ({0})")]
    NoIoSource(String),
    #[error("--io-source {name}: not available in this kernel: {why}")]
    IoSourceUnavailable { name: &'static str, why: String },
    #[error("tracefs is not mounted and mounting it failed ({0}); as root run: mount -t tracefs nodev /sys/kernel/tracing")]
    NoTracefs(String),
    #[error("pid {0}: no such process")]
    NoSuchPid(u32),
    #[error("at most {max} --port filters are supported, got {got}")]
    TooManyPorts { max: usize, got: usize },
    #[error("--ring-size {0}: must be a power of two of at least 4096 bytes")]
    BadRingSize(u32),
    #[error("--payload-cap {got}: must be at most {max}")]
    BadPayloadCap { got: u32, max: usize },
    #[error("loading the eBPF object: {0}")]
    Load(String),
    #[error("attaching {probe}: {reason}")]
    Attach { probe: String, reason: String },
}

impl ProbeError {
    /// This kernel, or this process's privileges, cannot host tokenscope, or an option
    /// names what this host lacks (a BTF file, a network namespace), as opposed to a
    /// transient error: callers exit with status 2 for these.
    pub fn is_unsupported_kernel(&self) -> bool {
        matches!(
            self,
            ProbeError::NoBtf(_)
                | ProbeError::LockedDown(_)
                | ProbeError::BadBtf { .. }
                | ProbeError::BadNetns { .. }
                | ProbeError::NoIoSource(_)
                | ProbeError::IoSourceUnavailable { .. }
                | ProbeError::NotPrivileged(_)
        )
    }
}

/// Loaded and attached probes; dropping them detaches everything.
pub struct Probes {
    ebpf: Ebpf,
    ring: ring::Ring,
    links: Vec<(&'static str, TracePointLinkId)>,
    kprobe_links: Vec<(&'static str, KProbeLinkId)>,
    uprobe_links: Vec<(&'static str, UProbeLinkId)>,
    /// Where socket I/O events come from.
    pub io_source: IoSource,
    /// `category:name` of each attached tracepoint.
    pub attached: Vec<String>,
    /// `category:name: reason` of each tracepoint the kernel lacked.
    pub skipped: Vec<String>,
    /// The inode of the one network namespace traced (`--netns`), if any.
    pub netns: Option<u32>,
    /// Last, so that it is unmounted (when mounted here) after the probes detached.
    tracefs: Option<preflight::Tracefs>,
}

impl Probes {
    pub fn load(cfg: &ProbeConfig) -> Result<Probes, ProbeError> {
        let object = probe_ebpf::object().ok_or(ProbeError::NotBuilt)?;
        // A namespace that is not there is a mistake in the command line: said before
        // anything about this host's privileges or kernel.
        let netns = match &cfg.netns {
            Some(target) => Some(target.inode().map_err(|reason| ProbeError::BadNetns {
                target: target.to_string(),
                reason,
            })?),
            None => None,
        };
        preflight::check(cfg)?;
        let tracefs = preflight::ensure_tracefs()?;
        if !ring_bytes_ok(cfg.ring_bytes) {
            return Err(ProbeError::BadRingSize(cfg.ring_bytes));
        }
        if cfg.payload_cap as usize > abi::PAYLOAD_MAX {
            return Err(ProbeError::BadPayloadCap {
                got: cfg.payload_cap,
                max: abi::PAYLOAD_MAX,
            });
        }
        if cfg.ports.len() > abi::MAX_FILTER_PORTS {
            return Err(ProbeError::TooManyPorts {
                max: abi::MAX_FILTER_PORTS,
                got: cfg.ports.len(),
            });
        }
        // Declared before the BTF, dropped after it.
        let _loading = heap::LoadingAllocations::start();
        let btf = match &cfg.btf {
            Some(path) => Some(Btf::parse_file(path, Endianness::default()).map_err(|e| {
                ProbeError::BadBtf {
                    path: path.display().to_string(),
                    reason: error_chain(&e),
                }
            })?),
            None => None,
        };
        let candidates = KernelFeatures::probe(&tracefs.path)
            .candidates(cfg.io_source)
            .map_err(|(forced, why)| match forced {
                Some(s) => ProbeError::IoSourceUnavailable {
                    name: s.name(),
                    why,
                },
                None => ProbeError::NoIoSource(why),
            })?;
        // A source the kernel seems to have can still refuse to attach (a kprobe on a
        // function the kernel blacklists): fall back to the next, and say so.
        let mut fell_back = Vec::new();
        for (i, &source) in candidates.iter().enumerate() {
            match Self::load_with(cfg, object, &tracefs.path, source, btf.as_ref(), netns) {
                Ok(mut probes) => {
                    probes.tracefs = Some(tracefs);
                    probes.skipped.extend(fell_back);
                    return Ok(probes);
                }
                Err(e @ ProbeError::Attach { .. }) if i + 1 < candidates.len() => {
                    fell_back.push(format!(
                        "I/O source {}: {}",
                        source.name(),
                        one_line(&e.to_string())
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("candidates() is never empty")
    }

    fn load_with(
        cfg: &ProbeConfig,
        object: &[u8],
        tracefs: &std::path::Path,
        source: IoSource,
        btf: Option<&Btf>,
        netns: Option<u32>,
    ) -> Result<Probes, ProbeError> {
        let mut ports = [0u16; abi::MAX_FILTER_PORTS];
        ports[..cfg.ports.len()].copy_from_slice(&cfg.ports);
        let self_tgid = std::process::id();
        let filter_pids = u32::from(!cfg.pids.is_empty());
        let n_ports = cfg.ports.len() as u32;
        let io_source = source.abi();
        let netns_inode = netns.unwrap_or(0);
        let tls = u32::from(!cfg.libssl.is_empty());
        // A small ring must still wake its consumer before it fills.
        let wakeup_bytes = WAKEUP_BYTES.min(u64::from(cfg.ring_bytes) / 4);

        let mut loader = EbpfLoader::new();
        if btf.is_some() {
            loader.btf(btf);
        }
        let mut ebpf = loader
            .override_global(probe_ebpf::CFG_SELF_TGID, &self_tgid, true)
            .override_global(probe_ebpf::CFG_FILTER_PIDS, &filter_pids, true)
            .override_global(probe_ebpf::CFG_N_PORTS, &n_ports, true)
            .override_global(probe_ebpf::CFG_PORTS, &ports, true)
            .override_global(probe_ebpf::CFG_WAKEUP_BYTES, &wakeup_bytes, true)
            .override_global(probe_ebpf::CFG_PAYLOAD_CAP, &cfg.payload_cap, true)
            .override_global(probe_ebpf::CFG_IO_SOURCE, &io_source, true)
            .override_global(probe_ebpf::CFG_NETNS, &netns_inode, true)
            .override_global(probe_ebpf::CFG_TLS, &tls, true)
            .map_max_entries(probe_ebpf::MAP_EVENTS, cfg.ring_bytes)
            .map_max_entries(probe_ebpf::MAP_IO_SCRATCH, possible_cpus()?)
            .load(object)
            .map_err(|e| ProbeError::Load(error_chain(&e)))?;
        // The parsed kernel BTF goes with the loader: freed before the ring buffer's
        // ring_bytes are mapped below, not on top of them.
        drop(loader);
        heap::give_back_freed_memory();

        if !cfg.pids.is_empty() {
            let map = ebpf
                .map_mut(probe_ebpf::MAP_PID_FILTER)
                .ok_or_else(|| missing_map(probe_ebpf::MAP_PID_FILTER))?;
            let mut filter: BpfHashMap<_, u32, u8> =
                BpfHashMap::try_from(map).map_err(|e| ProbeError::Load(e.to_string()))?;
            for pid in &cfg.pids {
                filter
                    .insert(pid, 1, 0)
                    .map_err(|e| ProbeError::Load(format!("pid filter: {e}")))?;
            }
        }

        let mut attached = Vec::new();
        let mut skipped = Vec::new();
        let links = attach_tracepoints(&mut ebpf, tracefs, source, &mut attached, &mut skipped)?;
        let kprobe_links = if source == IoSource::Kprobe {
            attach_kprobes(&mut ebpf, &mut attached)?
        } else {
            Vec::new()
        };
        let mut uprobe_links = attach_uprobes(
            &mut ebpf,
            CUDA_UPROBES,
            &cfg.libcuda,
            &mut attached,
            &mut skipped,
        )?;
        uprobe_links.extend(attach_uprobes(
            &mut ebpf,
            TLS_UPROBES,
            &cfg.libssl,
            &mut attached,
            &mut skipped,
        )?);
        let map = ebpf
            .take_map(probe_ebpf::MAP_EVENTS)
            .ok_or_else(|| missing_map(probe_ebpf::MAP_EVENTS))?;
        let Map::RingBuf(map) = map else {
            return Err(ProbeError::Load(format!(
                "map {}: not a ring buffer",
                probe_ebpf::MAP_EVENTS
            )));
        };
        let ring = ring::Ring::new(map, cfg.ring_bytes)
            .map_err(|e| ProbeError::Load(format!("mapping the ring buffer: {e}")))?;
        Ok(Probes {
            ebpf,
            ring,
            links,
            kprobe_links,
            uprobe_links,
            io_source: source,
            attached,
            skipped,
            netns,
            tracefs: None,
        })
    }

    /// "I/O source: kprobes tcp_sendmsg/tcp_cleanup_rbuf, kernel 6.1.0-57-amd64"
    pub fn io_source_line(&self) -> String {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        format!(
            "I/O source: {}, kernel {}",
            self.io_source.describe(),
            release.trim()
        )
    }

    /// Waits until the kernel signals pending data or `timeout` passes. The probes
    /// wake user space only every `WAKEUP_BYTES` pending, so callers drain on a timer as well.
    pub fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.ring.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; EINTR (a signal) just returns early.
        unsafe {
            libc::poll(
                &mut pfd,
                1,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
    }

    /// Hands every pending record to `f`; returns how many there were.
    pub fn drain(&mut self, f: impl FnMut(&[u8])) -> u64 {
        self.ring.drain(f)
    }

    pub fn ring_fd(&self) -> RawFd {
        self.ring.fd()
    }

    /// `(submitted, dropped)` summed over CPUs.
    pub fn counters(&self) -> Result<(u64, u64), ProbeError> {
        Ok((
            self.counter(abi::CNT_SUBMITTED)?,
            self.counter(abi::CNT_DROPPED)?,
        ))
    }

    /// TLS plaintext calls whose SSL* had no known socket (the session began before
    /// the recording and no socket I/O has run inside a call on it since), and writes
    /// still waiting for their thread's next send (read after the probes detached).
    pub fn tls_untied(&self) -> Result<u64, ProbeError> {
        let untied = self.counter(abi::CNT_TLS_UNTIED)?;
        // Without the TLS uprobes the program that fills it is not loaded.
        let Some(map) = self.ebpf.map(probe_ebpf::MAP_TLS_HELD) else {
            return Ok(untied);
        };
        let held: BpfHashMap<_, u32, [u8; abi::TLS_HELD_SIZE]> =
            BpfHashMap::try_from(map).map_err(|e| ProbeError::Load(e.to_string()))?;
        Ok(untied + held.keys().filter(Result::is_ok).count() as u64)
    }

    fn counter(&self, idx: u32) -> Result<u64, ProbeError> {
        let map = self
            .ebpf
            .map(probe_ebpf::MAP_COUNTERS)
            .ok_or_else(|| missing_map(probe_ebpf::MAP_COUNTERS))?;
        let counters: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|e| ProbeError::Load(e.to_string()))?;
        let per_cpu = counters
            .get(&idx, 0)
            .map_err(|e| ProbeError::Load(format!("reading counters: {e}")))?;
        Ok(per_cpu.iter().sum())
    }
}

/// libcuda files mapped by `pids` (every process when empty), for `--gpu auto`.
pub fn find_libcuda(pids: &[u32]) -> Vec<PathBuf> {
    discover::mapped(pids, |name| name.starts_with("libcuda.so"))
}

/// Files to put the TLS plaintext uprobes on, for `--tls auto`: see [`discover::libssl`].
pub fn find_libssl(pids: &[u32]) -> Vec<PathBuf> {
    discover::libssl(pids)
}

/// The processes in the network namespace whose inode is `inode`, for discovery
/// under `--netns`.
pub fn processes_in_netns(inode: u32) -> Vec<u32> {
    discover::in_netns(inode)
}

/// The tracepoints `source` uses (every one but the socket-layer pair, which only the
/// sock source emits from). Those it cannot do without fail the load; the rest are
/// skipped with a reason.
fn attach_tracepoints(
    ebpf: &mut Ebpf,
    tracefs: &std::path::Path,
    source: IoSource,
    attached: &mut Vec<String>,
    skipped: &mut Vec<String>,
) -> Result<Vec<(&'static str, TracePointLinkId)>, ProbeError> {
    let mut links = Vec::new();
    for t in TRACEPOINTS {
        if t.group == ProbeGroup::SockIo && source != IoSource::Sock {
            continue;
        }
        let required = t.required
            || (t.group == ProbeGroup::SockIo)
            || (t.group == ProbeGroup::Io && source == IoSource::Syscall);
        let label = format!("{}:{}", t.category, t.name);
        let result = if tracefs
            .join("events")
            .join(t.category)
            .join(t.name)
            .exists()
        {
            attach(ebpf, t)
        } else {
            Err("tracepoint not in this kernel".to_string())
        };
        match result {
            Ok(id) => {
                links.push((t.program, id));
                attached.push(label);
            }
            Err(reason) if !required => skipped.push(format!("{label}: {}", one_line(&reason))),
            Err(reason) => {
                return Err(ProbeError::Attach {
                    probe: label,
                    reason,
                })
            }
        }
    }
    Ok(links)
}

/// The kprobe I/O source's programs; all of them or none.
fn attach_kprobes(
    ebpf: &mut Ebpf,
    attached: &mut Vec<String>,
) -> Result<Vec<(&'static str, KProbeLinkId)>, ProbeError> {
    let mut links = Vec::new();
    for k in KPROBES {
        let fail = |reason: String| ProbeError::Attach {
            probe: format!("kprobe:{} ({})", k.function, k.program),
            reason,
        };
        let program = ebpf
            .program_mut(k.program)
            .ok_or_else(|| fail("program missing from the object".into()))?;
        let kp: &mut KProbe = program.try_into().map_err(|e| fail(format!("{e}")))?;
        kp.load().map_err(|e| fail(error_chain(&e)))?;
        let id = kp
            .attach(k.function, 0)
            .map_err(|e| fail(error_chain(&e)))?;
        links.push((k.program, id));
        attached.push(format!("kprobe:{} ({})", k.function, k.program));
    }
    Ok(links)
}

fn attach(ebpf: &mut Ebpf, t: &Tracepoint) -> Result<TracePointLinkId, String> {
    let program = ebpf
        .program_mut(t.program)
        .ok_or_else(|| format!("program {} missing from the object", t.program))?;
    let tp: &mut TracePoint = program.try_into().map_err(|e| format!("{e}"))?;
    tp.load().map_err(|e| error_chain(&e))?;
    tp.attach(t.category, t.name).map_err(|e| error_chain(&e))
}

fn possible_cpus() -> Result<u32, ProbeError> {
    let n = aya::util::nr_cpus().map_err(|(path, e)| ProbeError::Load(format!("{path}: {e}")))?;
    Ok(n as u32)
}

fn missing_map(name: &str) -> ProbeError {
    ProbeError::Load(format!("map {name} missing from the object"))
}

/// A reason as the header and the first lines keep it: a verifier log runs to
/// kilobytes, its first line says what failed.
fn one_line(reason: &str) -> String {
    const MAX: usize = 240;
    let line = reason.lines().next().unwrap_or_default();
    match line.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &line[..cut]),
        None => line.to_string(),
    }
}

/// aya errors keep the useful part (verifier log, errno) in their sources.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_verifier_log_is_cut_to_its_first_line() {
        let log = format!(
            "load failed: invalid func unknown#176\n{}",
            "0: r1 = r6\n".repeat(500)
        );
        assert_eq!(one_line(&log), "load failed: invalid func unknown#176");
        let long = "é".repeat(300);
        let cut = one_line(&long);
        assert_eq!(cut.chars().count(), 243, "240 characters and an ellipsis");
    }
}
