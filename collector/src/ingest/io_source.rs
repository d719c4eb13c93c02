//! Where socket I/O events come from. Three sources in the probes yield the same
//! events; the recording's header names the one that ran, so the report can say what
//! it could not see.

use probe_ebpf::abi;

/// A source of socket I/O events, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoSource {
    /// `sock:sock_send_length` / `sock:sock_recv_length` (Linux 6.3+).
    Sock,
    /// kprobes on `tcp_sendmsg` (entry and return) and `tcp_cleanup_rbuf`.
    Kprobe,
    /// The syscall tracepoints alone; the socket found from the fd.
    Syscall,
}

/// What `--io-source` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoSourceChoice {
    /// The best source the kernel has.
    #[default]
    Auto,
    Only(IoSource),
}

impl IoSource {
    pub const ALL: [IoSource; 3] = [IoSource::Sock, IoSource::Kprobe, IoSource::Syscall];

    /// The name `--io-source` takes.
    pub fn name(self) -> &'static str {
        match self {
            IoSource::Sock => "sock",
            IoSource::Kprobe => "kprobe",
            IoSource::Syscall => "syscall",
        }
    }

    pub fn from_name(name: &str) -> Option<IoSource> {
        IoSource::ALL.into_iter().find(|s| s.name() == name)
    }

    /// How the recording header and the report name it.
    pub fn describe(self) -> &'static str {
        match self {
            IoSource::Sock => "tracepoints sock:sock_send_length/sock_recv_length",
            IoSource::Kprobe => "kprobes tcp_sendmsg/tcp_cleanup_rbuf",
            IoSource::Syscall => "syscall tracepoints (fd -> socket)",
        }
    }

    /// What this source cannot see, said once in the report.
    pub fn blind_spot(self) -> Option<&'static str> {
        match self {
            IoSource::Sock => None,
            // Before 6.5 sendfile/splice reach TCP through tcp_sendpage, not tcp_sendmsg.
            IoSource::Kprobe => Some(
                "sendfile and splice sends are not seen on kernels before 6.5 (they go \
                 through tcp_sendpage)",
            ),
            IoSource::Syscall => Some(
                "sendfile, splice and io_uring I/O is not seen (it carries no buffer through \
                 read/write/send/recv syscalls)",
            ),
        }
    }

    /// The value the probes' `cfg_io_source` takes.
    pub fn abi(self) -> u32 {
        match self {
            IoSource::Sock => abi::IO_SRC_SOCK,
            IoSource::Kprobe => abi::IO_SRC_KPROBE,
            IoSource::Syscall => abi::IO_SRC_SYSCALL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in IoSource::ALL {
            assert_eq!(IoSource::from_name(s.name()), Some(s));
        }
        assert_eq!(IoSource::from_name("ebpf"), None);
    }
}
