/* SPDX-License-Identifier: GPL-2.0 */
/*
 * Socket I/O. The syscall entry stashes where the user buffer is (by tid); the
 * socket layer (sock:sock_send_length / sock_recv_length, which every TCP
 * send/receive path reaches) says which socket and how many bytes, and emits
 * the event with a bounded copy of the payload; the syscall exit drops the
 * stash so a later sendfile/splice on the same thread cannot pick it up.
 */

#define MSG_PEEK 2

enum io_shape {
	SHAPE_BUF = 0,    /* one buffer: write, read, sendto, recvfrom */
	SHAPE_IOV = 1,    /* iovec array: writev, readv */
	SHAPE_MSGHDR = 2, /* user_msghdr: sendmsg, recvmsg */
};

struct io_args {
	__u64 buf;
	__u64 vlen;
	__u32 syscall;
	__s32 fd;
	__u32 shape;
	__u32 _pad;
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

static __always_inline int stash(__u32 syscall, __u64 fd, __u64 buf, __u32 shape, __u64 vlen)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!pid_wanted(id >> 32))
		return 0;
	__u32 tid = (__u32)id;
	struct io_args a = {
		.buf = buf, .vlen = vlen, .syscall = syscall, .fd = (__s32)fd, .shape = shape, ._pad = 0,
	};
	bpf_map_update_elem(&IO_ARGS, &tid, &a, BPF_ANY);
	return 0;
}

static __always_inline int unstash(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	bpf_map_delete_elem(&IO_ARGS, &tid);
	return 0;
}

#define TS_SYSCALL_PROBES(name, sys, shape, buf_arg, vlen_arg)                                    \
	SEC("tracepoint/syscalls/sys_enter_" #name)                                               \
	int tp_sys_enter_##name(struct syscall_enter_ctx *ctx)                                    \
	{                                                                                         \
		return stash(sys, ctx->args[0], ctx->args[buf_arg], shape,                        \
			     vlen_arg < 0 ? 0 : ctx->args[vlen_arg < 0 ? 0 : vlen_arg]);          \
	}                                                                                         \
	SEC("tracepoint/syscalls/sys_exit_" #name)                                                \
	int tp_sys_exit_##name(struct syscall_exit_ctx *ctx)                                      \
	{                                                                                         \
		return unstash();                                                                 \
	}

TS_SYSCALL_PROBES(write, TS_SYS_WRITE, SHAPE_BUF, 1, -1)
TS_SYSCALL_PROBES(writev, TS_SYS_WRITEV, SHAPE_IOV, 1, 2)
TS_SYSCALL_PROBES(sendto, TS_SYS_SENDTO, SHAPE_BUF, 1, -1)
TS_SYSCALL_PROBES(sendmsg, TS_SYS_SENDMSG, SHAPE_MSGHDR, 1, -1)
TS_SYSCALL_PROBES(read, TS_SYS_READ, SHAPE_BUF, 1, -1)
TS_SYSCALL_PROBES(readv, TS_SYS_READV, SHAPE_IOV, 1, 2)
TS_SYSCALL_PROBES(recvfrom, TS_SYS_RECVFROM, SHAPE_BUF, 1, -1)
TS_SYSCALL_PROBES(recvmsg, TS_SYS_RECVMSG, SHAPE_MSGHDR, 1, -1)

static __always_inline int is_send_syscall(__u32 sys)
{
	return sys >= TS_SYS_WRITE && sys <= TS_SYS_SENDMSG;
}

/* Copies up to `want` bytes of the user buffer(s) into ev->payload. */
static __always_inline void copy_payload(struct ts_io_event *ev, const struct io_args *a, __u32 want)
{
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
	__u32 off = 0;
	for (int i = 0; i < TS_IOV_MAX; i++) {
		if (i >= vlen || off >= want)
			break;
		struct iovec v;
		if (bpf_probe_read_user(&v, sizeof(v), &iov[i])) {
			ev->flags |= TS_IO_F_PAYLOAD_FAULT;
			break;
		}
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

static __always_inline int on_sock_io(struct trace_event_raw_sock_msg_length *ctx, __u32 dir)
{
	int ret = ctx->ret;
	if (ret <= 0 || ctx->protocol != IPPROTO_TCP)
		return 0;
	if (ctx->family != AF_INET && ctx->family != AF_INET6)
		return 0;
	if (dir == TS_DIR_RECV && (ctx->flags & MSG_PEEK))
		return 0; /* the same bytes are read again without MSG_PEEK */
	__u64 id = bpf_get_current_pid_tgid();
	if (!pid_wanted(id >> 32))
		return 0;
	struct sock *sk = ctx->sk;
	if (dir == TS_DIR_RECV)
		tls_note_recv((__u32)id, sk);
	__u16 sport = BPF_CORE_READ(sk, __sk_common.skc_num);
	__u16 dport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	if (!port_wanted(sport, dport))
		return 0;

	__u32 cpu = bpf_get_smp_processor_id();
	struct io_scratch *s = bpf_map_lookup_elem(&IO_SCRATCH, &cpu);
	if (!s)
		return 0;
	struct ts_io_event *ev = &s->ev;
	fill_header(&ev->hdr, TS_EV_IO, 1);
	read_sock(&ev->sock, sk);
	ev->dir = dir;
	ev->syscall = TS_SYS_NONE;
	ev->fd = -1;
	ev->flags = 0;
	ev->bytes = ret;
	ev->payload_len = 0;
	ev->_pad = 0;

	__u32 tid = (__u32)id;
	tls_note_socket(tid, &ev->sock);
	struct io_args *stashed = bpf_map_lookup_elem(&IO_ARGS, &tid);
	if (stashed && is_send_syscall(stashed->syscall) == (dir == TS_DIR_SEND)) {
		struct io_args a = *stashed;
		bpf_map_delete_elem(&IO_ARGS, &tid);
		ev->syscall = a.syscall;
		ev->fd = a.fd;
		__u32 cap = cfg_payload_cap < TS_PAYLOAD_MAX ? cfg_payload_cap : TS_PAYLOAD_MAX;
		copy_payload(ev, &a, (__u32)ret < cap ? (__u32)ret : cap);
	}
	__u64 size = TS_IO_EVENT_HEAD_SIZE + (__u64)ev->payload_len;
	if (size > TS_IO_EVENT_SIZE)
		size = TS_IO_EVENT_SIZE;
	submit(ev, size);
	return 0;
}

SEC("tracepoint/sock/sock_send_length")
int tp_sock_sock_send_length(struct trace_event_raw_sock_msg_length *ctx)
{
	return on_sock_io(ctx, TS_DIR_SEND);
}

SEC("tracepoint/sock/sock_recv_length")
int tp_sock_sock_recv_length(struct trace_event_raw_sock_msg_length *ctx)
{
	return on_sock_io(ctx, TS_DIR_RECV);
}
