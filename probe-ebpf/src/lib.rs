//! tokenscope's eBPF programs, compiled from C (CO-RE) by build.rs, and the
//! names and ABI the loader needs. The C header `bpf/tokenscope.h` is the
//! source of truth for the ABI; [`abi`] mirrors it.

pub mod abi;

/// The ring buffer every probe writes to.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU `[submitted, dropped]` counters (indexes `abi::CNT_*`).
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Per-CPU scratch space for I/O records (an array indexed by CPU id).
pub const MAP_IO_SCRATCH: &str = "IO_SCRATCH";
/// TLS writes waiting, by thread, for the socket their thread sends on next
/// (values `abi::TLS_HELD_SIZE` bytes).
pub const MAP_TLS_HELD: &str = "TLS_HELD";
/// Pids to trace when `cfg_filter_pids` is set.
pub const MAP_PID_FILTER: &str = "PID_FILTER";

/// Read-only globals the loader sets before load.
pub const CFG_SELF_TGID: &str = "cfg_self_tgid";
pub const CFG_FILTER_PIDS: &str = "cfg_filter_pids";
pub const CFG_N_PORTS: &str = "cfg_n_ports";
pub const CFG_PORTS: &str = "cfg_ports";
pub const CFG_WAKEUP_BYTES: &str = "cfg_wakeup_bytes";
pub const CFG_PAYLOAD_CAP: &str = "cfg_payload_cap";
/// Which I/O source emits socket I/O events (`abi::IO_SRC_*`).
pub const CFG_IO_SOURCE: &str = "cfg_io_source";
/// The one network namespace traced (its inode); 0: every one.
pub const CFG_NETNS: &str = "cfg_netns";
/// 1 when the TLS plaintext uprobes are attached (0: the socket layer skips their notes).
pub const CFG_TLS: &str = "cfg_tls";

/// Which concern a probe serves; the recording's header lists what was attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeGroup {
    /// TCP state changes, accepts, retransmits.
    Conn,
    /// The syscalls that carry socket buffers: every I/O source needs them (the
    /// syscall source emits from them).
    Io,
    /// The socket-layer tracepoints that emit I/O records in the `sock` source.
    SockIo,
}

/// One tracepoint program: the C function name (what aya finds it by) and where it attaches.
#[derive(Clone, Copy, Debug)]
pub struct Tracepoint {
    pub program: &'static str,
    pub category: &'static str,
    pub name: &'static str,
    pub group: ProbeGroup,
    /// Without it the recording is not useful (the loader fails instead of skipping it).
    pub required: bool,
}

const fn tp(
    program: &'static str,
    category: &'static str,
    name: &'static str,
    group: ProbeGroup,
    required: bool,
) -> Tracepoint {
    Tracepoint {
        program,
        category,
        name,
        group,
        required,
    }
}

/// Every program in the object, in attach order: syscall entries/exits before the
/// socket-layer tracepoints that consume what they stash.
pub const TRACEPOINTS: &[Tracepoint] = &[
    tp(
        "tp_sys_enter_write",
        "syscalls",
        "sys_enter_write",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_write",
        "syscalls",
        "sys_exit_write",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_writev",
        "syscalls",
        "sys_enter_writev",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_writev",
        "syscalls",
        "sys_exit_writev",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_sendto",
        "syscalls",
        "sys_enter_sendto",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_sendto",
        "syscalls",
        "sys_exit_sendto",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_sendmsg",
        "syscalls",
        "sys_enter_sendmsg",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_sendmsg",
        "syscalls",
        "sys_exit_sendmsg",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_read",
        "syscalls",
        "sys_enter_read",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_read",
        "syscalls",
        "sys_exit_read",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_readv",
        "syscalls",
        "sys_enter_readv",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_readv",
        "syscalls",
        "sys_exit_readv",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_recvfrom",
        "syscalls",
        "sys_enter_recvfrom",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_recvfrom",
        "syscalls",
        "sys_exit_recvfrom",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_enter_recvmsg",
        "syscalls",
        "sys_enter_recvmsg",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_recvmsg",
        "syscalls",
        "sys_exit_recvmsg",
        ProbeGroup::Io,
        false,
    ),
    tp(
        "tp_sys_exit_accept4",
        "syscalls",
        "sys_exit_accept4",
        ProbeGroup::Conn,
        false,
    ),
    tp(
        "tp_sys_exit_accept",
        "syscalls",
        "sys_exit_accept",
        ProbeGroup::Conn,
        false,
    ),
    tp(
        "tp_sock_inet_sock_set_state",
        "sock",
        "inet_sock_set_state",
        ProbeGroup::Conn,
        true,
    ),
    tp(
        "tp_sock_sock_send_length",
        "sock",
        "sock_send_length",
        ProbeGroup::SockIo,
        false,
    ),
    tp(
        "tp_sock_sock_recv_length",
        "sock",
        "sock_recv_length",
        ProbeGroup::SockIo,
        false,
    ),
    tp(
        "tp_tcp_tcp_retransmit_skb",
        "tcp",
        "tcp_retransmit_skb",
        ProbeGroup::Conn,
        false,
    ),
];

/// One kprobe program of the `kprobe` I/O source.
#[derive(Clone, Copy, Debug)]
pub struct Kprobe {
    pub program: &'static str,
    /// The kernel function it attaches to.
    pub function: &'static str,
}

/// The `kprobe` I/O source: tcp_sendmsg's entry and return, tcp_cleanup_rbuf's entry.
pub const KPROBES: &[Kprobe] = &[
    Kprobe {
        program: "kp_tcp_sendmsg",
        function: "tcp_sendmsg",
    },
    Kprobe {
        program: "krp_tcp_sendmsg",
        function: "tcp_sendmsg",
    },
    Kprobe {
        program: "kp_tcp_cleanup_rbuf",
        function: "tcp_cleanup_rbuf",
    },
];

/// 1 when build.rs found no clang and embedded an empty object.
pub const STUB_BUILD: u8 = if cfg!(tokenscope_probes_stub) { 1 } else { 0 };

/// The uprobe programs for libcuda calls; the attach cookie is the call (`abi::CU_*`).
pub const UPROBE_CUDA_ENTRY: &str = "up_cuda_entry";
pub const UPROBE_CUDA_RETURN: &str = "up_cuda_return";

/// libcuda symbols probed, with the cookie each attachment carries. The `_ptsz` / `_ptds`
/// forms are what the runtime calls with per-thread default streams (`cuda.h` maps the
/// plain names to them under CUDA_API_PER_THREAD_DEFAULT_STREAM): the same call.
pub const CUDA_SYMBOLS: &[(&str, u32)] = &[
    ("cuLaunchKernel", abi::CU_LAUNCH_KERNEL),
    (
        "cuLaunchKernel_ptsz",
        abi::CU_LAUNCH_KERNEL | abi::CU_PER_THREAD,
    ),
    ("cuLaunchKernelEx", abi::CU_LAUNCH_KERNEL_EX),
    (
        "cuLaunchKernelEx_ptsz",
        abi::CU_LAUNCH_KERNEL_EX | abi::CU_PER_THREAD,
    ),
    ("cuGraphLaunch", abi::CU_GRAPH_LAUNCH),
    (
        "cuGraphLaunch_ptsz",
        abi::CU_GRAPH_LAUNCH | abi::CU_PER_THREAD,
    ),
    ("cuMemcpyDtoHAsync_v2", abi::CU_MEMCPY_DTOH_ASYNC),
    (
        "cuMemcpyDtoHAsync_v2_ptsz",
        abi::CU_MEMCPY_DTOH_ASYNC | abi::CU_PER_THREAD,
    ),
    ("cuMemcpyDtoH_v2", abi::CU_MEMCPY_DTOH),
    (
        "cuMemcpyDtoH_v2_ptds",
        abi::CU_MEMCPY_DTOH | abi::CU_PER_THREAD,
    ),
    ("cuStreamSynchronize", abi::CU_STREAM_SYNCHRONIZE),
    (
        "cuStreamSynchronize_ptsz",
        abi::CU_STREAM_SYNCHRONIZE | abi::CU_PER_THREAD,
    ),
    ("cuCtxSynchronize", abi::CU_CTX_SYNCHRONIZE),
    // CUDA 13's runtime calls this form for cudaDeviceSynchronize (torch.cuda.synchronize()):
    // cuGetProcAddress hands it out for version 13000 (seen on an H200, driver 580.159).
    ("cuCtxSynchronize_v2", abi::CU_CTX_SYNCHRONIZE),
    ("cuEventSynchronize", abi::CU_EVENT_SYNCHRONIZE),
];

/// The uprobe programs for OpenSSL's plaintext calls; the attach cookie is the call
/// (`abi::SSL_*`).
pub const UPROBE_SSL_ENTRY: &str = "up_ssl_entry";
pub const UPROBE_SSL_RETURN: &str = "up_ssl_return";

/// OpenSSL symbols probed, with the cookie each attachment carries. Shutdown and
/// free only end a session (entry probe alone).
pub const SSL_SYMBOLS: &[(&str, u32)] = &[
    ("SSL_write", abi::SSL_WRITE),
    ("SSL_write_ex", abi::SSL_WRITE_EX),
    ("SSL_read", abi::SSL_READ),
    ("SSL_read_ex", abi::SSL_READ_EX),
    ("SSL_shutdown", abi::SSL_SHUTDOWN),
    ("SSL_free", abi::SSL_FREE),
    // The handshake's own socket I/O ties the SSL* to its socket: the first SSL_read
    // after it is often served from the record OpenSSL read with the client's Finished.
    ("SSL_do_handshake", abi::SSL_DO_HANDSHAKE),
];

#[repr(C, align(8))]
struct Aligned<B: ?Sized>(B);

// ELF parsing wants the object 8-byte aligned.
static OBJECT: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(
    env!("OUT_DIR"),
    "/tokenscope.bpf.o"
)));

/// The compiled eBPF object, or `None` when this binary was built without clang.
pub fn object() -> Option<&'static [u8]> {
    let bytes = &OBJECT.0;
    (!bytes.is_empty()).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tracepoint_program_is_in_the_object() {
        let Some(obj) = object() else {
            // Only the stub build (no clang) may have an empty object.
            assert_eq!(
                STUB_BUILD, 1,
                "the probes object is empty but clang built it"
            );
            return;
        };
        for t in TRACEPOINTS {
            let needle = t.program.as_bytes();
            assert!(
                obj.windows(needle.len()).any(|w| w == needle),
                "program {} missing from the object",
                t.program
            );
            let section = format!("tracepoint/{}/{}", t.category, t.name);
            assert!(
                obj.windows(section.len()).any(|w| w == section.as_bytes()),
                "section {section} missing"
            );
        }
    }
}
