/* SPDX-License-Identifier: GPL-2.0 */
/* Connection life cycle: TCP state changes (keyed by skaddr), accepts, retransmits. */

#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_FIN_WAIT1 4
#define TCP_CLOSE_WAIT 8
#define TCP_LAST_ACK 9

/* These transitions only happen inside connect()/close()/shutdown() of the
 * owning task; every other one may run in softirq, where pid is not the owner's. */
static __always_inline int state_in_process_ctx(int oldstate, int newstate)
{
	return newstate == TCP_SYN_SENT || (oldstate == TCP_ESTABLISHED && newstate == TCP_FIN_WAIT1) ||
	       (oldstate == TCP_CLOSE_WAIT && newstate == TCP_LAST_ACK);
}

SEC("tracepoint/sock/inet_sock_set_state")
int tp_sock_inet_sock_set_state(struct trace_event_raw_inet_sock_set_state *ctx)
{
	if (ctx->protocol != IPPROTO_TCP)
		return 0;
	if (!port_wanted(ctx->sport, ctx->dport))
		return 0;
	if (!sock_netns_wanted((struct sock *)ctx->skaddr))
		return 0;
	struct ts_state_event ev;
	int old = ctx->oldstate, new = ctx->newstate;
	fill_header(&ev.hdr, TS_EV_STATE, state_in_process_ctx(old, new));
	if (ev.hdr.pid == cfg_self_tgid && ev.hdr.pid)
		return 0;
	TS_SOCK_FROM_TP(ev.sock, ctx);
	ev.oldstate = old;
	ev.newstate = new;
	submit(&ev, sizeof(ev));
	return 0;
}

#define on_retransmit(ctx)                                                                         \
	({                                                                                         \
		struct ts_retransmit_event ev;                                                     \
		if (port_wanted((ctx)->sport, (ctx)->dport) &&                                     \
		    sock_netns_wanted((struct sock *)(ctx)->skaddr)) {                             \
			fill_header(&ev.hdr, TS_EV_RETRANSMIT, 0);                                 \
			TS_SOCK_FROM_TP(ev.sock, ctx);                                             \
			ev.state = (ctx)->state;                                                   \
			ev._pad = 0;                                                               \
			submit(&ev, sizeof(ev));                                                   \
		}                                                                                  \
		0;                                                                                 \
	})

SEC("tracepoint/tcp/tcp_retransmit_skb")
int tp_tcp_tcp_retransmit_skb(void *raw)
{
	if (bpf_core_type_exists(struct trace_event_raw_tcp_retransmit_skb))
		return on_retransmit((struct trace_event_raw_tcp_retransmit_skb *)raw);
	return on_retransmit((struct trace_event_raw_tcp_event_sk_skb *)raw);
}

static __always_inline int on_accept_exit(struct syscall_exit_ctx *ctx)
{
	long fd = ctx->ret;
	if (fd < 0)
		return 0;
	if (!pid_wanted(bpf_get_current_pid_tgid() >> 32))
		return 0;
	struct sock *sk = sock_of_fd(fd);
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP || !sock_netns_wanted(sk))
		return 0;
	struct ts_accept_event ev;
	read_sock(&ev.sock, sk);
	if (ev.sock.family != AF_INET && ev.sock.family != AF_INET6)
		return 0;
	if (!port_wanted(ev.sock.sport, ev.sock.dport))
		return 0;
	fill_header(&ev.hdr, TS_EV_ACCEPT, 1);
	ev.fd = fd;
	ev._pad = 0;
	submit(&ev, sizeof(ev));
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_accept4")
int tp_sys_exit_accept4(struct syscall_exit_ctx *ctx)
{
	return on_accept_exit(ctx);
}

SEC("tracepoint/syscalls/sys_exit_accept")
int tp_sys_exit_accept(struct syscall_exit_ctx *ctx)
{
	return on_accept_exit(ctx);
}
