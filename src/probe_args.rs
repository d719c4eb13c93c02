//! The probe options `record` and `agent` share, and the recording options they make.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use collector::probes::{NetnsTarget, ProbeConfig, DEFAULT_PAYLOAD_CAP, DEFAULT_RING_BYTES};
use collector::record::sink::Output;
use collector::record::{NvmlOptions, RecordOptions};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuMode {
    Auto,
    Off,
}

#[derive(Args, Debug, Clone)]
pub struct ProbeArgs {
    /// Trace only this process (repeatable).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Trace only sockets with this local or remote port (repeatable, up to 8).
    #[arg(long = "port", value_name = "N")]
    pub ports: Vec<u16>,
    /// Trace only one network namespace: a namespace file or a process's.
    ///
    /// PATH is a namespace file (/run/netns/NAME as `ip netns` makes them,
    /// /proc/PID/ns/net); PID names that process's /proc/PID/ns/net (write ./123 for a
    /// file called 123). Sockets are kept by their own namespace, so TCP state changes
    /// in softirq are filtered too; TLS and GPU uprobes by the calling process's. The
    /// recording's header names this namespace. With no -p, libraries are searched
    /// for uprobes in that namespace's processes only. E.g. --netns /run/netns/gw, or
    /// one pod on a Kubernetes node: --netns $(pgrep -o -f my-engine)
    #[arg(long, value_name = "PATH|PID")]
    pub netns: Option<NetnsTarget>,
    /// Ring buffer size in bytes (power of two). Small values make drops likely.
    #[arg(long, default_value_t = DEFAULT_RING_BYTES, value_name = "BYTES")]
    pub ring_size: u32,
    /// GPU probes: `auto` puts uprobes on every libcuda a traced process maps; `off` none.
    #[arg(long, value_enum, default_value_t = GpuMode::Auto)]
    pub gpu: GpuMode,
    /// Put the libcuda uprobes on this file (repeatable) instead of searching for it.
    #[arg(long, value_name = "PATH")]
    pub libcuda: Vec<PathBuf>,
    /// TLS plaintext: `auto` puts uprobes on OpenSSL's SSL_read/SSL_write in every
    /// libssl.so a traced process maps, the system's libssl, and traced executables
    /// that export them (node); `off` times TLS by record only.
    #[arg(long, value_enum, default_value_t = GpuMode::Auto)]
    pub tls: GpuMode,
    /// Put the TLS plaintext uprobes on this file (repeatable) instead of searching.
    #[arg(long, value_name = "PATH")]
    pub libssl: Vec<PathBuf>,
    #[command(flatten)]
    pub kernel: tokenscope_tui::KernelArgs,
    /// NVML device counters: `auto` samples when a driver is there (one line when not).
    #[arg(long, value_enum, default_value_t = GpuMode::Auto)]
    pub nvml: GpuMode,
    /// Use this NVML library instead of the system's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// How often NVML is sampled.
    #[arg(long, value_parser = collector::duration::parse, default_value = "100ms", value_name = "D")]
    pub nvml_interval: Duration,
    /// Listen here for the CUPTI hook: start the engine with
    /// CUDA_INJECTION64_PATH=<dir of tokenscope>/libtokenscope_cupti_hook.so and
    /// TOKENSCOPE_CUPTI_SOCKET=<this path> for exact kernel and copy spans. The socket is
    /// owner-only (0600; missing directories are made 0700) and takes hooks running as
    /// this user or root; others are refused and counted.
    #[arg(long, value_name = "PATH")]
    pub cupti_socket: Option<PathBuf>,
    /// Payload bytes copied per socket send/receive (parsed, then dropped; at most 16384).
    #[arg(long, default_value_t = DEFAULT_PAYLOAD_CAP, value_name = "BYTES")]
    pub payload_cap: u32,
}

impl ProbeArgs {
    /// The session's options, and a line to print when GPU probes found nothing to attach to.
    pub fn record_options(
        &self,
        duration: Option<Duration>,
        output: Output,
    ) -> (RecordOptions, Option<&'static str>) {
        // Uprobes cost microseconds per call (tens in VMs): say where they go, or why not.
        let searched = self.searched_pids();
        let libcuda = match (self.gpu, self.libcuda.is_empty()) {
            (GpuMode::Off, _) => Vec::new(),
            (GpuMode::Auto, false) => self.libcuda.clone(),
            (GpuMode::Auto, true) => collector::probes::find_libcuda(&searched),
        };
        let libssl = match (self.tls, self.libssl.is_empty()) {
            (GpuMode::Off, _) => Vec::new(),
            (GpuMode::Auto, false) => self.libssl.clone(),
            (GpuMode::Auto, true) => collector::probes::find_libssl(&searched),
        };
        let gpu_note = (self.gpu == GpuMode::Auto && libcuda.is_empty())
            .then_some("GPU probes off: no traced process maps libcuda.so (use --libcuda PATH)");
        let mut probes = ProbeConfig {
            pids: self.pids.clone(),
            ports: self.ports.clone(),
            ring_bytes: self.ring_size,
            payload_cap: self.payload_cap,
            libcuda,
            libssl,
            netns: self.netns.clone(),
            ..ProbeConfig::default()
        };
        self.kernel.apply(&mut probes);
        let opts = RecordOptions {
            probes,
            duration,
            output,
            cupti_socket: self.cupti_socket.clone(),
            nvml: (self.nvml == GpuMode::Auto).then(|| NvmlOptions {
                lib: self.nvml_lib.clone(),
                interval: self.nvml_interval,
            }),
        };
        (opts, gpu_note)
    }

    /// The processes whose libraries get uprobes (empty: every one). --netns alone
    /// narrows them to that namespace's: the probes would drop the others' calls, but
    /// each call would still pay for its uprobe. A namespace with no process yet stays
    /// broad (what starts in it will map the host's files); a bad --netns is left for
    /// the loader to report.
    fn searched_pids(&self) -> Vec<u32> {
        match (&self.netns, self.pids.is_empty()) {
            (Some(target), true) => target
                .inode()
                .map(collector::probes::processes_in_netns)
                .unwrap_or_default(),
            _ => self.pids.clone(),
        }
    }
}
