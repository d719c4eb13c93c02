/* SPDX-License-Identifier: GPL-2.0 */
/* Maps, read-only config and emit helpers shared by every probe. */
#ifndef TOKENSCOPE_COMMON_BPF_H
#define TOKENSCOPE_COMMON_BPF_H

#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "tokenscope.h"

/* Read-only config, set by the loader before load (see collector/src/probes). */
const volatile __u32 cfg_self_tgid = 0;
const volatile __u32 cfg_filter_pids = 0; /* 1: only pids in PID_FILTER */
const volatile __u32 cfg_n_ports = 0;     /* 0: every port */
const volatile __u16 cfg_ports[TS_MAX_FILTER_PORTS] = {};
/* Payload bytes copied per I/O (<= TS_PAYLOAD_MAX). */
const volatile __u32 cfg_payload_cap = 16384;
/* Wake the consumer only once this much is pending; it also drains on a timer. */
const volatile __u64 cfg_wakeup_bytes = 65536;
/* Only this network namespace (its inode, as in /proc/PID/ns/net); 0: every one. */
const volatile __u32 cfg_netns = 0;
/* 1 when the TLS plaintext uprobes are attached: only they read what the socket
 * layer notes for them (TLS_LAST_RECV, SSL_SOCK), so without them every traced
 * receive skips a hash update and two reads of the socket. */
const volatile __u32 cfg_tls = 1;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} EVENTS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TS_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} COUNTERS SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u8);
} PID_FILTER SEC(".maps");

static __always_inline int pid_wanted(__u32 tgid)
{
	if (tgid == cfg_self_tgid)
		return 0;
	if (!cfg_filter_pids)
		return 1;
	return bpf_map_lookup_elem(&PID_FILTER, &tgid) != 0;
}

static __always_inline int port_wanted(__u16 sport, __u16 dport)
{
	if (!cfg_n_ports)
		return 1;
	for (int i = 0; i < TS_MAX_FILTER_PORTS; i++) {
		if (i >= cfg_n_ports)
			break;
		if (cfg_ports[i] == sport || cfg_ports[i] == dport)
			return 1;
	}
	return 0;
}

/* A socket's own namespace: the one to test where no process runs (softirq) or where a
 * process may hold sockets of another namespace. */
static __always_inline int sock_netns_wanted(struct sock *sk)
{
	if (!cfg_netns)
		return 1;
	return BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum) == cfg_netns;
}

/* The current task's namespace, for probes that know no socket (uprobes). */
static __always_inline int task_netns_wanted(void)
{
	if (!cfg_netns)
		return 1;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	return BPF_CORE_READ(task, nsproxy, net_ns, ns.inum) == cfg_netns;
}

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&COUNTERS, &idx);
	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

static __always_inline __u64 wakeup_flags(void)
{
	return bpf_ringbuf_query(&EVENTS, BPF_RB_AVAIL_DATA) >= cfg_wakeup_bytes ? BPF_RB_FORCE_WAKEUP
										 : BPF_RB_NO_WAKEUP;
}

static __always_inline void submit(void *data, __u64 size)
{
	count(TS_CNT_SUBMITTED);
	if (bpf_ringbuf_output(&EVENTS, data, size, wakeup_flags()))
		count(TS_CNT_DROPPED);
}

/* A socket's ports, in one read of the pair (host order). */
struct ts_ports {
	__u16 sport;
	__u16 dport;
};

static __always_inline struct ts_ports read_ports(struct sock *sk)
{
	/* skc_portpair: skc_dport (network order) in its first two bytes, skc_num after. */
	struct {
		__be16 dport;
		__u16 num;
	} pair = {};
	bpf_core_read(&pair, sizeof(pair), &sk->__sk_common.skc_portpair);
	struct ts_ports p = { .sport = pair.num, .dport = bpf_ntohs(pair.dport) };
	return p;
}

/* The header of an event made in the owning task, from what the caller already has:
 * its pid/tid, CPU and time (each helper call saved counts on every I/O). */
static __always_inline void fill_header_task(struct ts_header *h, __u32 kind, __u64 id, __u32 cpu,
					     __u64 ts_ns)
{
	h->ts_ns = ts_ns;
	h->kind = kind;
	h->cpu = cpu;
	h->pid = id >> 32;
	h->tid = (__u32)id;
	bpf_get_current_comm(h->comm, sizeof(h->comm));
}

/* process_ctx: the event runs in the owning task (not softirq), so pid/comm are its own. */
static __always_inline void fill_header(struct ts_header *h, __u32 kind, int process_ctx)
{
	if (process_ctx) {
		fill_header_task(h, kind, bpf_get_current_pid_tgid(), bpf_get_smp_processor_id(),
				 bpf_ktime_get_ns());
	} else {
		h->ts_ns = bpf_ktime_get_ns();
		h->kind = kind;
		h->cpu = bpf_get_smp_processor_id();
		h->pid = 0;
		h->tid = 0;
		__builtin_memset(h->comm, 0, sizeof(h->comm));
	}
}

/* The socket's 4-tuple, its ports already read. */
static __always_inline void read_sock_with(struct ts_sock *out, struct sock *sk, struct ts_ports ports)
{
	__builtin_memset(out, 0, sizeof(*out));
	out->skaddr = (__u64)sk;
	out->family = BPF_CORE_READ(sk, __sk_common.skc_family);
	out->sport = ports.sport;
	out->dport = ports.dport;
	if (out->family == AF_INET) {
		/* skc_addrpair: skc_daddr in its first four bytes, skc_rcv_saddr after. */
		__be32 pair[2] = {};
		bpf_core_read(pair, sizeof(pair), &sk->__sk_common.skc_addrpair);
		__builtin_memcpy(out->daddr, &pair[0], 4);
		__builtin_memcpy(out->saddr, &pair[1], 4);
	} else {
		BPF_CORE_READ_INTO(out->saddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(out->daddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	}
}

static __always_inline void read_sock(struct ts_sock *out, struct sock *sk)
{
	read_sock_with(out, sk, read_ports(sk));
}

/* fd -> struct file -> struct socket -> struct sock, through the current task's fd
 * table; 0 when the fd is not open or not a socket (its inode says which). */
static __always_inline struct sock *sock_of_fd(long fd)
{
	if (fd < 0)
		return 0;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd]) || !f)
		return 0;
	if ((BPF_CORE_READ(f, f_inode, i_mode) & S_IFMT) != S_IFSOCK)
		return 0;
	struct socket *so = BPF_CORE_READ(f, private_data);
	if (!so)
		return 0;
	return BPF_CORE_READ(so, sk);
}

/* An IPv4/IPv6 TCP socket (what every I/O source reports). */
static __always_inline int is_inet_tcp(struct sock *sk)
{
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	return family == AF_INET || family == AF_INET6;
}

/* Tracepoints that carry the 4-tuple themselves (state changes, retransmits).
 * Arrays are read with probe_read: the verifier forbids ctx pointer arithmetic. */
#define TS_SOCK_FROM_TP(out, ctx)                                                          \
	do {                                                                               \
		__builtin_memset(&(out), 0, sizeof(out));                                  \
		(out).skaddr = (__u64)(ctx)->skaddr;                                       \
		(out).family = (ctx)->family;                                              \
		(out).sport = (ctx)->sport;                                                \
		(out).dport = (ctx)->dport;                                                \
		if ((out).family == AF_INET) {                                             \
			bpf_core_read((out).saddr, 4, &(ctx)->saddr);                      \
			bpf_core_read((out).daddr, 4, &(ctx)->daddr);                      \
		} else {                                                                   \
			bpf_core_read((out).saddr, 16, &(ctx)->saddr_v6);                  \
			bpf_core_read((out).daddr, 16, &(ctx)->daddr_v6);                  \
		}                                                                          \
	} while (0)

/* Argument n (1-based) of a uprobed call at its entry, System V x86-64. Arguments past the
 * sixth are on the stack above the return address. */
static __always_inline __u64 uprobe_arg(struct pt_regs *ctx, int n)
{
#if defined(__TARGET_ARCH_x86)
	switch (n) {
	case 1:
		return ctx->di;
	case 2:
		return ctx->si;
	case 3:
		return ctx->dx;
	case 4:
		return ctx->cx;
	case 5:
		return ctx->r8;
	case 6:
		return ctx->r9;
	default: {
		__u64 v = 0;
		bpf_probe_read_user(&v, sizeof(v), (void *)(ctx->sp + 8 * (n - 6)));
		return v;
	}
	}
#else
	return 0;
#endif
}

#endif
