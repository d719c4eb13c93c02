/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/*
 * The kernel/user event ABI of tokenscope. This header is the source of truth;
 * probe-ebpf/src/abi.rs mirrors it and asserts the same sizes, so both sides
 * break together. Every record starts with struct ts_header; `kind` says which
 * struct follows. All times are CLOCK_MONOTONIC ns (bpf_ktime_get_ns).
 */
#ifndef TOKENSCOPE_H
#define TOKENSCOPE_H

#define TS_COMM_LEN 16
/* Most payload bytes one socket I/O record can carry (the loader picks the cap
 * in use, cfg_payload_cap, up to this): enough for HTTP heads, a proxy's
 * coalesced SSE writes and TLS record headers. A power of two (the verifier
 * masks offsets with it). */
#define TS_PAYLOAD_MAX 16384
/* iovec entries walked per writev/readv/sendmsg/recvmsg when copying payload
 * (nginx and hyper flush a backlog of chunks in one writev of many iovecs). */
#define TS_IOV_MAX 64
#define TS_MAX_FILTER_PORTS 8

enum ts_event_kind {
	TS_EV_STATE = 1,      /* struct ts_state_event: sock:inet_sock_set_state */
	TS_EV_IO = 2,         /* struct ts_io_event: one send or receive on a TCP socket */
	TS_EV_ACCEPT = 3,     /* struct ts_accept_event: accept()/accept4() returned a TCP socket */
	TS_EV_RETRANSMIT = 4, /* struct ts_retransmit_event: tcp:tcp_retransmit_skb */
	TS_EV_CUDA = 5,       /* struct ts_cuda_event: a libcuda call's entry or return (uprobes) */
};

/* The libcuda entry points probed; the uprobe's attach cookie says which one fired. */
enum ts_cuda_call {
	TS_CU_LAUNCH_KERNEL = 1,
	TS_CU_LAUNCH_KERNEL_EX = 2,
	TS_CU_GRAPH_LAUNCH = 3,
	TS_CU_MEMCPY_DTOH_ASYNC = 4,
	TS_CU_MEMCPY_DTOH = 5,
	TS_CU_STREAM_SYNCHRONIZE = 6,
	TS_CU_CTX_SYNCHRONIZE = 7,
	TS_CU_EVENT_SYNCHRONIZE = 8,
};
/* Or'ed into the cookie of a per-thread default stream entry point (_ptsz / _ptds). */
#define TS_CU_PER_THREAD 0x100

#define TS_CUDA_ENTRY 1
#define TS_CUDA_RETURN 2

enum ts_io_dir {
	TS_DIR_SEND = 1,
	TS_DIR_RECV = 2,
};

/* The syscall that carried the I/O; TS_SYS_NONE when the socket layer fired
 * without one of ours in flight (sendfile/splice, io_uring, kernel sockets). */
enum ts_syscall {
	TS_SYS_NONE = 0,
	TS_SYS_WRITE = 1,
	TS_SYS_WRITEV = 2,
	TS_SYS_SENDTO = 3,
	TS_SYS_SENDMSG = 4,
	TS_SYS_READ = 5,
	TS_SYS_READV = 6,
	TS_SYS_RECVFROM = 7,
	TS_SYS_RECVMSG = 8,
	/* Not syscalls: TLS plaintext from OpenSSL uprobes (tls.bpf.h), on the socket of
	 * the syscall that ran inside the call. */
	TS_SYS_SSL_WRITE = 9,
	TS_SYS_SSL_READ = 10,
};

/* Where socket I/O events come from (cfg_io_source); chosen by the loader by feature
 * probing, best first. Every source emits the same ts_io_event. */
enum ts_io_source {
	TS_IO_SRC_SOCK = 1,    /* sock:sock_send_length / sock_recv_length (Linux 6.3+) */
	TS_IO_SRC_KPROBE = 2,  /* kprobes on tcp_sendmsg (entry+return) and tcp_cleanup_rbuf */
	TS_IO_SRC_SYSCALL = 3, /* syscall tracepoints alone, fd -> socket via the task's file table */
};

/* The OpenSSL entry points probed; the uprobe's attach cookie says which one fired. */
enum ts_ssl_call {
	TS_SSL_WRITE = 1,
	TS_SSL_WRITE_EX = 2,
	TS_SSL_READ = 3,
	TS_SSL_READ_EX = 4,
	TS_SSL_SHUTDOWN = 5,
	TS_SSL_FREE = 6,
	TS_SSL_DO_HANDSHAKE = 7, /* ties the SSL* to its socket before any data call */
};

/* ts_io_event.flags */
#define TS_IO_F_PAYLOAD_FAULT 0x1 /* a user-memory read failed: payload_len is what was copied */

/* Indexes of the per-CPU counters map. */
enum ts_counter {
	TS_CNT_SUBMITTED = 0, /* records the probes tried to put in the ring buffer */
	TS_CNT_DROPPED = 1,   /* ... of which the ring buffer had no room for */
	TS_CNT_TLS_UNTIED = 2, /* TLS plaintext calls with no socket known for their SSL* */
	TS_CNT_MAX = 3,
};

struct ts_header {
	__u64 ts_ns;
	__u32 kind;
	__u32 pid; /* tgid; 0 when the event ran outside the owning process (softirq) */
	__u32 tid;
	__u32 cpu;
	char comm[TS_COMM_LEN];
};

/* A TCP socket: kernel address (stable for its lifetime) and 4-tuple.
 * Addresses in network order, ports in host order. IPv4 uses the first 4 bytes. */
struct ts_sock {
	__u64 skaddr;
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 family;
	__u16 sport;
	__u16 dport;
	__u16 _pad;
};

struct ts_state_event {
	struct ts_header hdr;
	struct ts_sock sock;
	__s32 oldstate;
	__s32 newstate;
};

struct ts_accept_event {
	struct ts_header hdr;
	struct ts_sock sock;
	__s32 fd;
	__u32 _pad;
};

struct ts_retransmit_event {
	struct ts_header hdr;
	struct ts_sock sock;
	__s32 state;
	__u32 _pad;
};

struct ts_io_event {
	struct ts_header hdr;
	struct ts_sock sock;
	__u32 dir;         /* enum ts_io_dir */
	__u32 syscall;     /* enum ts_syscall */
	__s32 fd;          /* -1 when unknown */
	__u32 flags;       /* TS_IO_F_* */
	__s64 bytes;       /* bytes the socket layer sent or received */
	__u32 payload_len; /* bytes of payload[] that follow (the record is cut there) */
	__u32 _pad;
	__u8 payload[TS_PAYLOAD_MAX];
};

struct ts_cuda_event {
	struct ts_header hdr;
	__u32 call;   /* enum ts_cuda_call */
	__u32 phase;  /* TS_CUDA_ENTRY or TS_CUDA_RETURN */
	__u64 stream; /* CUstream (or CUevent for cuEventSynchronize); 0 when none */
	__u64 bytes;  /* device-to-host copies: ByteCount */
	__s64 result; /* returns: the CUresult */
};

#define TS_HEADER_SIZE 40
#define TS_CUDA_EVENT_SIZE 72
#define TS_SOCK_SIZE 48
#define TS_STATE_EVENT_SIZE 96
#define TS_IO_EVENT_HEAD_SIZE 120
#define TS_IO_EVENT_SIZE (TS_IO_EVENT_HEAD_SIZE + TS_PAYLOAD_MAX)

_Static_assert(sizeof(struct ts_header) == TS_HEADER_SIZE, "ts_header layout");
_Static_assert(sizeof(struct ts_sock) == TS_SOCK_SIZE, "ts_sock layout");
_Static_assert(sizeof(struct ts_state_event) == TS_STATE_EVENT_SIZE, "ts_state_event layout");
_Static_assert(sizeof(struct ts_accept_event) == TS_STATE_EVENT_SIZE, "ts_accept_event layout");
_Static_assert(sizeof(struct ts_retransmit_event) == TS_STATE_EVENT_SIZE, "ts_retransmit_event layout");
_Static_assert(sizeof(struct ts_io_event) == TS_IO_EVENT_SIZE, "ts_io_event layout");
_Static_assert(sizeof(struct ts_cuda_event) == TS_CUDA_EVENT_SIZE, "ts_cuda_event layout");
_Static_assert(__builtin_offsetof(struct ts_io_event, payload) == TS_IO_EVENT_HEAD_SIZE, "payload offset");

#endif
