//! Rust mirror of `bpf/tokenscope.h`, the kernel/user event ABI. Sizes are
//! asserted at compile time on both sides, so a change to one side that the
//! other lacks fails the build.

use std::mem::{offset_of, size_of};

pub const COMM_LEN: usize = 16;
pub const PAYLOAD_MAX: usize = 16384;
pub const MAX_FILTER_PORTS: usize = 8;

pub const EV_STATE: u32 = 1;
pub const EV_IO: u32 = 2;
pub const EV_ACCEPT: u32 = 3;
pub const EV_RETRANSMIT: u32 = 4;
pub const EV_CUDA: u32 = 5;

pub const CU_LAUNCH_KERNEL: u32 = 1;
pub const CU_LAUNCH_KERNEL_EX: u32 = 2;
pub const CU_GRAPH_LAUNCH: u32 = 3;
pub const CU_MEMCPY_DTOH_ASYNC: u32 = 4;
pub const CU_MEMCPY_DTOH: u32 = 5;
pub const CU_STREAM_SYNCHRONIZE: u32 = 6;
pub const CU_CTX_SYNCHRONIZE: u32 = 7;
pub const CU_EVENT_SYNCHRONIZE: u32 = 8;
/// Or'ed into a cookie: the per-thread default stream entry point (`_ptsz` / `_ptds`).
pub const CU_PER_THREAD: u32 = 0x100;
pub const CUDA_ENTRY: u32 = 1;
pub const CUDA_RETURN: u32 = 2;

pub const DIR_SEND: u32 = 1;
pub const DIR_RECV: u32 = 2;

pub const SYS_NONE: u32 = 0;
pub const SYS_WRITE: u32 = 1;
pub const SYS_WRITEV: u32 = 2;
pub const SYS_SENDTO: u32 = 3;
pub const SYS_SENDMSG: u32 = 4;
pub const SYS_READ: u32 = 5;
pub const SYS_READV: u32 = 6;
pub const SYS_RECVFROM: u32 = 7;
pub const SYS_RECVMSG: u32 = 8;
pub const SYS_SSL_WRITE: u32 = 9;
pub const SYS_SSL_READ: u32 = 10;

pub const IO_SRC_SOCK: u32 = 1;
pub const IO_SRC_KPROBE: u32 = 2;
pub const IO_SRC_SYSCALL: u32 = 3;

pub const SSL_WRITE: u32 = 1;
pub const SSL_WRITE_EX: u32 = 2;
pub const SSL_READ: u32 = 3;
pub const SSL_READ_EX: u32 = 4;
pub const SSL_SHUTDOWN: u32 = 5;
pub const SSL_FREE: u32 = 6;
pub const SSL_DO_HANDSHAKE: u32 = 7;

pub const IO_F_PAYLOAD_FAULT: u32 = 0x1;

pub const CNT_SUBMITTED: u32 = 0;
pub const CNT_DROPPED: u32 = 1;
pub const CNT_TLS_UNTIED: u32 = 2;
pub const CNT_MAX: u32 = 3;

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsHeader {
    pub ts_ns: u64,
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u32,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsSock {
    pub skaddr: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub family: u16,
    pub sport: u16,
    pub dport: u16,
    pub _pad: u16,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsStateEvent {
    pub hdr: TsHeader,
    pub sock: TsSock,
    pub oldstate: i32,
    pub newstate: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsAcceptEvent {
    pub hdr: TsHeader,
    pub sock: TsSock,
    pub fd: i32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsRetransmitEvent {
    pub hdr: TsHeader,
    pub sock: TsSock,
    pub state: i32,
    pub _pad: u32,
}

/// The fixed part of `struct ts_io_event`; `payload_len` bytes of payload follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsIoEventHead {
    pub hdr: TsHeader,
    pub sock: TsSock,
    pub dir: u32,
    pub syscall: u32,
    pub fd: i32,
    pub flags: u32,
    pub bytes: i64,
    pub payload_len: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TsCudaEvent {
    pub hdr: TsHeader,
    pub call: u32,
    pub phase: u32,
    pub stream: u64,
    pub bytes: u64,
    pub result: i64,
}

pub const HEADER_SIZE: usize = 40;
pub const CUDA_EVENT_SIZE: usize = 72;
pub const SOCK_SIZE: usize = 48;
pub const STATE_EVENT_SIZE: usize = 96;
pub const IO_EVENT_HEAD_SIZE: usize = 120;
pub const IO_EVENT_SIZE: usize = IO_EVENT_HEAD_SIZE + PAYLOAD_MAX;
/// `struct tls_held` (tls.bpf.h): an I/O record, its SSL* and when it was held.
pub const TLS_HELD_SIZE: usize = IO_EVENT_SIZE + 16;

const _: () = assert!(size_of::<TsHeader>() == HEADER_SIZE);
const _: () = assert!(size_of::<TsSock>() == SOCK_SIZE);
const _: () = assert!(size_of::<TsStateEvent>() == STATE_EVENT_SIZE);
const _: () = assert!(size_of::<TsAcceptEvent>() == STATE_EVENT_SIZE);
const _: () = assert!(size_of::<TsRetransmitEvent>() == STATE_EVENT_SIZE);
const _: () = assert!(size_of::<TsIoEventHead>() == IO_EVENT_HEAD_SIZE);
const _: () = assert!(offset_of!(TsIoEventHead, bytes) == 104);
const _: () = assert!(offset_of!(TsStateEvent, sock) == HEADER_SIZE);
const _: () = assert!(PAYLOAD_MAX.is_power_of_two());
const _: () = assert!(size_of::<TsCudaEvent>() == CUDA_EVENT_SIZE);

/// Types that may be read from any byte pattern of their size (plain integers and arrays).
///
/// # Safety
/// Implementors must be `repr(C)`, contain only integer fields, and have no padding
/// the C side leaves uninitialised (every pad is an explicit field).
pub unsafe trait Plain: Copy {}
// SAFETY: repr(C), integer fields and explicit pads only.
unsafe impl Plain for TsHeader {}
// SAFETY: repr(C), integer fields and explicit pads only.
unsafe impl Plain for TsStateEvent {}
// SAFETY: repr(C), integer fields and explicit pads only.
unsafe impl Plain for TsAcceptEvent {}
// SAFETY: repr(C), integer fields and explicit pads only.
unsafe impl Plain for TsRetransmitEvent {}
// SAFETY: repr(C), integer fields and explicit pads only.
unsafe impl Plain for TsIoEventHead {}
// SAFETY: repr(C), integer fields and explicit pads only.
unsafe impl Plain for TsCudaEvent {}

/// Reads a `T` from the front of `bytes`, or `None` when there are too few.
pub fn read_prefix<T: Plain>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: length checked above; T is Plain (any bit pattern is valid); unaligned read.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The `kind` field of a record's header, when the record is long enough to have one.
pub fn record_kind(bytes: &[u8]) -> Option<u32> {
    read_prefix::<TsHeader>(bytes).map(|h| h.kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_prefix_rejects_short_input() {
        assert_eq!(
            read_prefix::<TsHeader>(&[0u8; HEADER_SIZE - 1]),
            None,
            "a 39-byte buffer holds no header"
        );
        let mut b = [0u8; HEADER_SIZE];
        b[8] = EV_IO as u8;
        assert_eq!(record_kind(&b), Some(EV_IO), "kind sits at offset 8");
    }
}
