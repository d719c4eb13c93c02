/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Socket I/O, from one of three sources (cfg_io_source, chosen by the loader):
 *   sock     the syscall entry stashes where the user buffer is (by tid); the socket
 *            layer (sock:sock_send_length / sock_recv_length, Linux 6.3+, which every
 *            TCP send/receive path reaches) says which socket and how many bytes and
 *            emits the event with a bounded copy of the payload; the syscall exit drops
 *            the stash so a later sendfile/splice on the same thread cannot pick it up.
 *   kprobe   the same, with tcp_sendmsg's return and tcp_cleanup_rbuf's entry (given
 *            the bytes copied) in place of the socket-layer tracepoints. Receives are
 *            not kretprobes: a thread blocked in recv would hold one of the few
 *            return instances the kernel keeps per probe, and returns would be lost.
 *   syscall  syscall tracepoints alone: the entry finds the TCP socket from the fd
 *            through the task's file table, the exit emits. Blind to sendfile/splice
 *            and io_uring, which carry no buffer through these syscalls.
 * Every source emits the same ts_io_event, a send timed at its syscall's entry and a
 * receive at its end.
 */

const volatile __u32 cfg_io_source = TS_IO_SRC_SOCK;

#define MSG_PEEK 2

enum io_shape {
	SHAPE_BUF = 0,    /* one buffer: write, read, sendto, recvfrom */
	SHAPE_IOV = 1,    /* iovec array: writev, readv */
	SHAPE_MSGHDR = 2, /* user_msghdr: sendmsg, recvmsg */
};

struct io_args {
	__u64 buf;
	__u64 vlen;
	__u64 sk;    /* syscall source: the socket found at entry */
	__u64 ts_ns; /* syscall entry: when the application handed its bytes over */
	__u32 syscall;
	__s32 fd;
	__u32 shape;
	__u32 msg_flags; /* recvfrom/recvmsg flags (MSG_PEEK) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct io_args);
} IO_ARGS SEC(".maps");

/* The event plus spill room, so a copy at any offset below TS_PAYLOAD_MAX of up to
 * TS_PAYLOAD_MAX bytes stays inside the map value (what the verifier must see). */
struct io_scratch {
	struct ts_io_event ev;
	__u8 spill[TS_PAYLOAD_MAX];
	/* The I/O's iovec array, read whole: a user read costs ~100 ns in a VM, whatever
	 * its size, and one per iovec was half of a writev's probe. */
	struct iovec iov[TS_IOV_MAX];
};

/* One slot per CPU, indexed by CPU id. A plain array, not a per-CPU one: per-CPU
 * values are limited to 32 KiB and this one is larger. The loader sizes it to the
 * possible CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct io_scratch);
} IO_SCRATCH SEC(".maps");

/* Kernel entry of tcp_sendmsg, by tid: its return has no arguments left. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} TCP_SEND_SK SEC(".maps");

static __always_inline int stash(__u32 syscall, __u64 fd, __u64 buf, __u32 shape, __u64 vlen, __u64 msg_flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!pid_wanted(id >> 32))
		return 0;
	__u64 sk = 0;
	if (cfg_io_source == TS_IO_SRC_SYSCALL) {
		/* Only TCP sockets are stashed: files and pipes stop here. */
		struct sock *s = sock_of_fd((long)fd);
		if (!is_inet_tcp(s))
			return 0;
		sk = (__u64)s;
	}
	__u32 tid = (__u32)id;
	struct io_args a = {
		.buf = buf,
		.vlen = vlen,
		.sk = sk,
		.ts_ns = bpf_ktime_get_ns(),
		.syscall = syscall,
		.fd = (__s32)fd,
		.shape = shape,
		.msg_flags = (__u32)msg_flags,
	};
	bpf_map_update_elem(&IO_ARGS, &tid, &a, BPF_ANY);
	return 0;
}

static int on_syscall_exit(long ret);

/* The syscall source emits here; the others only drop what the entry stashed. */
static __always_inline int unstash(long ret)
{
	if (cfg_io_source == TS_IO_SRC_SYSCALL)
		return on_syscall_exit(ret);
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	bpf_map_delete_elem(&IO_ARGS, &tid);
	return 0;
}

#define TS_ARG(ctx, n) ((n) < 0 ? 0 : (ctx)->args[(n) < 0 ? 0 : (n)])

#define TS_SYSCALL_PROBES(name, sys, shape, buf_arg, vlen_arg, flags_arg)                         \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                               \
	int tp_sys_enter_##name(struct syscall_enter_ctx *ctx)                                    \
	{                                                                                         \
		return stash(sys, ctx->args[0], ctx->args[buf_arg], shape, TS_ARG(ctx, vlen_arg), \
			     TS_ARG(ctx, flags_arg));                                             \
	}                                                                                         \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                                \
	int tp_sys_exit_##name(struct syscall_exit_ctx *ctx)                                      \
	{                                                                                         \
		return unstash(ctx->ret);                                                         \
	}

TS_SYSCALL_PROBES(write, TS_SYS_WRITE, SHAPE_BUF, 1, -1, -1)
TS_SYSCALL_PROBES(writev, TS_SYS_WRITEV, SHAPE_IOV, 1, 2, -1)
TS_SYSCALL_PROBES(sendto, TS_SYS_SENDTO, SHAPE_BUF, 1, -1, -1)
TS_SYSCALL_PROBES(sendmsg, TS_SYS_SENDMSG, SHAPE_MSGHDR, 1, -1, -1)
TS_SYSCALL_PROBES(read, TS_SYS_READ, SHAPE_BUF, 1, -1, -1)
TS_SYSCALL_PROBES(readv, TS_SYS_READV, SHAPE_IOV, 1, 2, -1)
TS_SYSCALL_PROBES(recvfrom, TS_SYS_RECVFROM, SHAPE_BUF, 1, -1, 3)
TS_SYSCALL_PROBES(recvmsg, TS_SYS_RECVMSG, SHAPE_MSGHDR, 1, -1, 2)

static __always_inline int is_send_syscall(__u32 sys)
{
	return sys >= TS_SYS_WRITE && sys <= TS_SYS_SENDMSG;
}

/* Copies up to `want` bytes of the user buffer(s) into ev->payload (s->ev). */
static __always_inline void copy_payload(struct io_scratch *s, const struct io_args *a, __u32 want)
{
	struct ts_io_event *ev = &s->ev;
	if (a->shape == SHAPE_BUF) {
		__u32 len = want;
		if (len > TS_PAYLOAD_MAX)
			len = TS_PAYLOAD_MAX;
		if (bpf_probe_read_user(ev->payload, len, (void *)a->buf))
			ev->flags |= TS_IO_F_PAYLOAD_FAULT;
		else
			ev->payload_len = len;
		return;
	}
	struct iovec *iov = (struct iovec *)a->buf;
	__u64 vlen = a->vlen;
	if (a->shape == SHAPE_MSGHDR) {
		struct user_msghdr m;
		if (bpf_probe_read_user(&m, sizeof(m), (void *)a->buf)) {
			ev->flags |= TS_IO_F_PAYLOAD_FAULT;
			return;
		}
		iov = m.msg_iov;
		vlen = m.msg_iovlen;
	}
	__u64 n = vlen < TS_IOV_MAX ? vlen : TS_IOV_MAX;
	__u32 iov_bytes = (__u32)n * sizeof(struct iovec);
	if (iov_bytes > sizeof(s->iov))
		iov_bytes = sizeof(s->iov);
	if (iov_bytes == 0)
		return;
	if (bpf_probe_read_user(s->iov, iov_bytes, iov)) {
		ev->flags |= TS_IO_F_PAYLOAD_FAULT;
		return;
	}
	__u32 off = 0;
	for (int i = 0; i < TS_IOV_MAX; i++) {
		if (i >= n || off >= want)
			break;
		struct iovec v = s->iov[i];
		__u64 len = v.iov_len;
		if (len > want - off)
			len = want - off;
		if (len > TS_PAYLOAD_MAX)
			len = TS_PAYLOAD_MAX;
		__u32 at = off & (TS_PAYLOAD_MAX - 1);
		if (bpf_probe_read_user(ev->payload + at, len, v.iov_base)) {
			ev->flags |= TS_IO_F_PAYLOAD_FAULT;
			break;
		}
		off += len;
	}
	ev->payload_len = off;
}

/* Emits one I/O event of `ret` bytes on `sk`, its payload copied from the syscall's
 * buffer when `a` (the syscall's stash) is given. */
static __always_inline int emit_io(struct sock *sk, __u32 dir, int ret, __u64 id, const struct io_args *a)
{
	__u32 tid = (__u32)id;
	__u32 cpu = bpf_get_smp_processor_id();
	struct io_scratch *s = bpf_map_lookup_elem(&IO_SCRATCH, &cpu);
	if (!s)
		return 0;
	struct ts_io_event *ev = &s->ev;
	/* Each helper call below runs for every TCP I/O of the host (~60 ns each in a VM):
	 * the ports in one read, the rest only for wanted sockets, the clock read once. */
	struct ts_ports ports = read_ports(sk);
	__u64 now = 0;
	if (cfg_tls) {
		/* The TLS note wants every receive's socket, wanted or not. */
		read_sock_with(&ev->sock, sk, ports);
		if (dir == TS_DIR_RECV) {
			now = bpf_ktime_get_ns();
			tls_note_recv(tid, &ev->sock, now);
		} else {
			tls_release_held(tid, &ev->sock, sk);
		}
	}
	if (!port_wanted(ports.sport, ports.dport))
		return 0;
	if (!cfg_tls)
		read_sock_with(&ev->sock, sk, ports);
	if (!sock_netns_wanted(sk))
		return 0;
	/* A send is timed when the application made it (its syscall's entry): by the time
	 * the socket layer returns, loopback has already delivered it to the receiver. A
	 * receive is timed when its bytes reached the application (now). */
	__u64 ts_ns = dir == TS_DIR_SEND && a ? a->ts_ns : now ? now : bpf_ktime_get_ns();
	fill_header_task(&ev->hdr, TS_EV_IO, id, cpu, ts_ns);
	ev->dir = dir;
	ev->syscall = TS_SYS_NONE;
	ev->fd = -1;
	ev->flags = 0;
	ev->bytes = ret;
	ev->payload_len = 0;
	ev->_pad = 0;

	tls_note_socket(tid, &ev->sock);
	if (a) {
		ev->syscall = a->syscall;
		ev->fd = a->fd;
		__u32 cap = cfg_payload_cap < TS_PAYLOAD_MAX ? cfg_payload_cap : TS_PAYLOAD_MAX;
		copy_payload(s, a, (__u32)ret < cap ? (__u32)ret : cap);
	}
	__u64 size = TS_IO_EVENT_HEAD_SIZE + (__u64)ev->payload_len;
	if (size > TS_IO_EVENT_SIZE)
		size = TS_IO_EVENT_SIZE;
	submit(ev, size);
	return 0;
}

/* The sock and kprobe sources: the kernel's TCP send/receive finished with `ret`
 * bytes on `sk`; the syscall in flight on this thread (if any) has the buffer. */
static __always_inline int on_kernel_io(struct sock *sk, __u32 dir, int ret)
{
	if (ret <= 0)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if (!pid_wanted(id >> 32))
		return 0;
	__u32 tid = (__u32)id;
	struct io_args *stashed = bpf_map_lookup_elem(&IO_ARGS, &tid);
	if (stashed && is_send_syscall(stashed->syscall) == (dir == TS_DIR_SEND)) {
		struct io_args a = *stashed;
		bpf_map_delete_elem(&IO_ARGS, &tid);
		if (dir == TS_DIR_RECV && (a.msg_flags & MSG_PEEK))
			return 0; /* the same bytes are read again without MSG_PEEK */
		return emit_io(sk, dir, ret, id, &a);
	}
	return emit_io(sk, dir, ret, id, 0);
}

static __noinline int on_syscall_exit(long ret)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct io_args *stashed = bpf_map_lookup_elem(&IO_ARGS, &tid);
	if (!stashed)
		return 0;
	struct io_args a = *stashed;
	bpf_map_delete_elem(&IO_ARGS, &tid);
	if (ret <= 0)
		return 0;
	__u32 dir = is_send_syscall(a.syscall) ? TS_DIR_SEND : TS_DIR_RECV;
	if (dir == TS_DIR_RECV && (a.msg_flags & MSG_PEEK))
		return 0;
	return emit_io((struct sock *)a.sk, dir, (int)ret, id, &a);
}

SEC("tracepoint/sock/sock_send_length")
int tp_sock_sock_send_length(struct trace_event_raw_sock_msg_length *ctx)
{
	if (ctx->protocol != IPPROTO_TCP || (ctx->family != AF_INET && ctx->family != AF_INET6))
		return 0;
	return on_kernel_io(ctx->sk, TS_DIR_SEND, ctx->ret);
}

SEC("tracepoint/sock/sock_recv_length")
int tp_sock_sock_recv_length(struct trace_event_raw_sock_msg_length *ctx)
{
	if (ctx->protocol != IPPROTO_TCP || (ctx->family != AF_INET && ctx->family != AF_INET6))
		return 0;
	if (ctx->flags & MSG_PEEK)
		return 0; /* the same bytes are read again without MSG_PEEK */
	return on_kernel_io(ctx->sk, TS_DIR_RECV, ctx->ret);
}

/* int tcp_sendmsg(struct sock *sk, struct msghdr *msg, size_t size): the same in every
 * kernel since 4.1. */
SEC("kprobe/tcp_sendmsg")
int kp_tcp_sendmsg(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!pid_wanted(id >> 32))
		return 0;
	__u32 tid = (__u32)id;
	__u64 sk = uprobe_arg(ctx, 1);
	bpf_map_update_elem(&TCP_SEND_SK, &tid, &sk, BPF_ANY);
	return 0;
}

SEC("kretprobe/tcp_sendmsg")
int krp_tcp_sendmsg(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u64 *sk = bpf_map_lookup_elem(&TCP_SEND_SK, &tid);
	if (!sk)
		return 0;
	struct sock *s = (struct sock *)*sk;
	bpf_map_delete_elem(&TCP_SEND_SK, &tid);
	if (!is_inet_tcp(s))
		return 0;
	return on_kernel_io(s, TS_DIR_SEND, (int)ctx->ax);
}

/* void tcp_cleanup_rbuf(struct sock *sk, int copied): called once at the end of every
 * tcp_recvmsg with the bytes copied to user space. */
SEC("kprobe/tcp_cleanup_rbuf")
int kp_tcp_cleanup_rbuf(struct pt_regs *ctx)
{
	int copied = (int)uprobe_arg(ctx, 2);
	struct sock *sk = (struct sock *)uprobe_arg(ctx, 1);
	if (copied <= 0 || !is_inet_tcp(sk))
		return 0;
	return on_kernel_io(sk, TS_DIR_RECV, copied);
}
