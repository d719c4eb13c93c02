/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The few kernel types tokenscope reads, as CO-RE definitions: libbpf relocates
 * each field access by name against the running kernel's BTF, so only the
 * fields listed here matter and their order does not.
 */
#ifndef TOKENSCOPE_KERNEL_H
#define TOKENSCOPE_KERNEL_H

#include <linux/types.h>
#include <linux/bpf.h>

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define S_IFMT 00170000
#define S_IFSOCK 0140000

#pragma clang attribute push(__attribute__((preserve_access_index)), apply_to = record)

struct trace_entry {
	unsigned short type;
};

struct trace_event_raw_sock_msg_length {
	struct trace_entry ent;
	void *sk;
	__u16 family;
	__u16 protocol;
	int ret;
	int flags;
};

struct trace_event_raw_inet_sock_set_state {
	struct trace_entry ent;
	const void *skaddr;
	int oldstate;
	int newstate;
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u16 protocol;
	__u8 saddr[4];
	__u8 daddr[4];
	__u8 saddr_v6[16];
	__u8 daddr_v6[16];
};

/* tcp:tcp_retransmit_skb: its own event class since 6.x ... */
struct trace_event_raw_tcp_retransmit_skb {
	struct trace_entry ent;
	const void *skbaddr;
	const void *skaddr;
	int state;
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u8 saddr[4];
	__u8 daddr[4];
	__u8 saddr_v6[16];
	__u8 daddr_v6[16];
};

/* ... and the shared class before that (same fields). */
struct trace_event_raw_tcp_event_sk_skb {
	struct trace_entry ent;
	const void *skbaddr;
	const void *skaddr;
	int state;
	__u16 sport;
	__u16 dport;
	__u16 family;
	__u8 saddr[4];
	__u8 daddr[4];
	__u8 saddr_v6[16];
	__u8 daddr_v6[16];
};

struct in6_addr {
	union {
		__u8 u6_addr8[16];
	} in6_u;
};

/* A namespace's identity: the inode of its /proc/PID/ns file. */
struct ns_common {
	unsigned int inum;
};

struct net {
	struct ns_common ns;
};

typedef struct {
	struct net *net;
} possible_net_t;

struct sock_common {
	__be32 skc_daddr;
	__be32 skc_rcv_saddr;
	/* Each pair is a union member over the two fields before it in the kernel: one
	 * read for both (a helper call costs ~60 ns in a VM). */
	__u64 skc_addrpair;
	__be16 skc_dport;
	__u16 skc_num;
	__u32 skc_portpair;
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
	possible_net_t skc_net;
};

struct sock {
	struct sock_common __sk_common;
	__u16 sk_protocol;
};

struct socket {
	struct sock *sk;
};

struct inode {
	unsigned short i_mode;
};

struct file {
	void *private_data;
	struct inode *f_inode;
};

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
};

struct files_struct {
	struct fdtable *fdt;
};

struct nsproxy {
	struct net *net_ns;
};

struct task_struct {
	struct files_struct *files;
	struct nsproxy *nsproxy;
};

/* x86-64 registers at a uprobe (kernel names). */
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};

#pragma clang attribute pop

/* Syscall tracepoints have a fixed layout: 8 bytes of common fields, the
 * syscall number, then each argument (or the return value) as 8 bytes. */
struct syscall_enter_ctx {
	__u64 common;
	__s32 nr;
	__u32 _pad;
	__u64 args[6];
};

struct syscall_exit_ctx {
	__u64 common;
	__s32 nr;
	__u32 _pad;
	__s64 ret;
};

/* UAPI layouts (stable). */
struct iovec {
	void *iov_base;
	__u64 iov_len;
};

struct user_msghdr {
	void *msg_name;
	int msg_namelen;
	struct iovec *msg_iov;
	__u64 msg_iovlen;
	void *msg_control;
	__u64 msg_controllen;
	unsigned int msg_flags;
};

#endif
