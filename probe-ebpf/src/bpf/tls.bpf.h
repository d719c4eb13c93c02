/* SPDX-License-Identifier: GPL-2.0 */
/*
 * TLS plaintext: uprobes on OpenSSL's SSL_write(_ex) / SSL_read(_ex). The entry
 * stashes the call's arguments by thread; the socket I/O that runs inside the
 * call (io.bpf.h) names the socket, and is remembered per SSL* for reads that
 * OpenSSL serves from its own buffer; the return emits the plaintext as an I/O
 * record on that socket (syscall TS_SYS_SSL_*), so it lands on the same
 * connection as the TLS records, in order. SSL_do_handshake ties the SSL* to its
 * socket before any data call (SSL_connect and SSL_accept run through it);
 * SSL_shutdown / SSL_free forget the SSL*.
 *
 * TLS over memory BIOs (Python's asyncio, node) runs no socket I/O inside the calls:
 * the event loop reads the socket, then feeds the bytes to the SSL object on the same
 * thread. An SSL* not yet tied is tied, on a handshake or a read, to the socket the
 * thread last received on, if that was just before (TLS_RECENT_NS). A write on such an
 * SSL* (a session older than the recording, writing before it reads) is held by thread
 * (TLS_HELD) and goes out on the socket the thread sends on next, if that comes just
 * after: the event loop hands the bytes the write produced to the socket at once.
 */

#define TLS_RECENT_NS 50000000ULL

struct ssl_args {
	__u64 ssl;
	__u64 buf;
	__u64 done_ptr; /* _ex forms: where the byte count goes */
	__u64 entry_ns;
	__u32 call;     /* enum ts_ssl_call */
	__u32 has_sock; /* a socket I/O ran inside the call */
	struct ts_sock sock;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct ssl_args);
} SSL_ARGS SEC(".maps");

struct last_recv {
	__u64 ts_ns;
	struct ts_sock sock;
};

/* tid -> the TCP socket the thread last received on. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct last_recv);
} TLS_LAST_RECV SEC(".maps");

/* SSL* -> the last socket a call on it touched. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct ts_sock);
} SSL_SOCK SEC(".maps");

/* A plaintext record and, while it waits for its socket, the SSL* and when it was made. */
struct tls_held {
	struct ts_io_event ev;
	__u64 ssl;
	__u64 held_ns;
};

/* The plaintext record is built here: a uprobe may be preempted (it runs with
 * migration, not preemption, disabled), so it does not share IO_SCRATCH. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tls_held);
} TLS_SCRATCH SEC(".maps");

/* tid -> a write on an SSL* with no known socket, until the thread's next send. Only
 * sessions older than the recording land here, each once: a few slots; one left when
 * the recording ends is counted untied by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct tls_held);
} TLS_HELD SEC(".maps");

/* Writes held now (at most: an LRU eviction is not subtracted), so every other send
 * of the host skips the lookup. */
__u64 tls_held_now = 0;

/* Called by the socket layer's probe for every TCP receive of a traced process,
 * before port filters (a tie to an unwanted socket must not fall back to a wanted one),
 * with the socket as the probe read it. */
static __always_inline void tls_note_recv(__u32 tid, const struct ts_sock *sock, __u64 ts_ns)
{
	struct last_recv r = {};
	r.ts_ns = ts_ns;
	r.sock = *sock;
	bpf_map_update_elem(&TLS_LAST_RECV, &tid, &r, BPF_ANY);
}

/* Called by the socket layer's probe for every TCP send of a traced process, before
 * port filters, with the socket as the probe read it: a write held on this thread
 * (TLS_HELD) ties its SSL* to that socket and goes out first, if the socket is wanted. */
static __always_inline void tls_release_held(__u32 tid, const struct ts_sock *sock, struct sock *sk)
{
	if (!tls_held_now)
		return;
	struct tls_held *h = bpf_map_lookup_elem(&TLS_HELD, &tid);
	if (!h)
		return;
	if (bpf_ktime_get_ns() - h->held_ns < TLS_RECENT_NS) {
		bpf_map_update_elem(&SSL_SOCK, &h->ssl, sock, BPF_ANY);
		if (port_wanted(sock->sport, sock->dport) && sock_netns_wanted(sk)) {
			h->ev.sock = *sock;
			__u64 size = TS_IO_EVENT_HEAD_SIZE + (__u64)h->ev.payload_len;
			if (size > TS_IO_EVENT_SIZE)
				size = TS_IO_EVENT_SIZE;
			submit(&h->ev, size);
		}
	} else {
		count(TS_CNT_TLS_UNTIED);
	}
	if (!bpf_map_delete_elem(&TLS_HELD, &tid))
		__sync_fetch_and_add(&tls_held_now, -1);
}

/* Called by the socket layer's probe for every traced I/O: ties a TLS call in
 * flight on this thread to the socket. */
static __always_inline void tls_note_socket(__u32 tid, const struct ts_sock *sock)
{
	if (!cfg_tls)
		return;
	struct ssl_args *a = bpf_map_lookup_elem(&SSL_ARGS, &tid);
	if (!a)
		return;
	a->sock = *sock;
	a->has_sock = 1;
	bpf_map_update_elem(&SSL_SOCK, &a->ssl, sock, BPF_ANY);
}

SEC("uprobe")
int up_ssl_entry(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!pid_wanted(id >> 32) || !task_netns_wanted())
		return 0;
	__u32 call = bpf_get_attach_cookie(ctx);
	__u64 ssl = uprobe_arg(ctx, 1);
	if (call == TS_SSL_SHUTDOWN || call == TS_SSL_FREE) {
		bpf_map_delete_elem(&SSL_SOCK, &ssl);
		return 0;
	}
	struct ssl_args a = {};
	a.ssl = ssl;
	a.buf = uprobe_arg(ctx, 2);
	a.done_ptr = (call == TS_SSL_WRITE_EX || call == TS_SSL_READ_EX) ? uprobe_arg(ctx, 4) : 0;
	a.entry_ns = bpf_ktime_get_ns();
	a.call = call;
	__u32 tid = (__u32)id;
	bpf_map_update_elem(&SSL_ARGS, &tid, &a, BPF_ANY);
	return 0;
}

SEC("uretprobe")
int up_ssl_return(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct ssl_args *stashed = bpf_map_lookup_elem(&SSL_ARGS, &tid);
	if (!stashed)
		return 0;
	if (bpf_get_attach_cookie(ctx) != stashed->call)
		return 0; /* the return of a call nested inside ours: keep waiting */
	struct ssl_args a = *stashed;
	bpf_map_delete_elem(&SSL_ARGS, &tid);
	int write = a.call == TS_SSL_WRITE || a.call == TS_SSL_WRITE_EX;
	if (!a.has_sock && !write && !bpf_map_lookup_elem(&SSL_SOCK, &a.ssl)) {
		/* A memory-BIO session: the bytes came from the thread's last receive. */
		struct last_recv *r = bpf_map_lookup_elem(&TLS_LAST_RECV, &tid);
		if (r && a.entry_ns - r->ts_ns < TLS_RECENT_NS)
			bpf_map_update_elem(&SSL_SOCK, &a.ssl, &r->sock, BPF_ANY);
	}
	if (a.call == TS_SSL_DO_HANDSHAKE)
		return 0; /* it only ties the SSL* to its socket */

	__s64 n = 0;
#if defined(__TARGET_ARCH_x86)
	__s64 ret = (__s32)ctx->ax;
#else
	__s64 ret = 0;
#endif
	if (a.done_ptr) {
		__u64 done = 0;
		if (ret != 1 || bpf_probe_read_user(&done, sizeof(done), (void *)a.done_ptr))
			return 0;
		n = done;
	} else {
		n = ret;
	}
	if (n <= 0)
		return 0;

	int held = 0;
	if (!a.has_sock) {
		struct ts_sock *known = bpf_map_lookup_elem(&SSL_SOCK, &a.ssl);
		if (known)
			a.sock = *known;
		else if (write)
			held = 1; /* its socket is the one the thread sends on next */
		else {
			count(TS_CNT_TLS_UNTIED);
			return 0;
		}
	}
	if (!held && !port_wanted(a.sock.sport, a.sock.dport))
		return 0;

	__u32 zero = 0;
	struct tls_held *scratch = bpf_map_lookup_elem(&TLS_SCRATCH, &zero);
	if (!scratch)
		return 0;
	struct ts_io_event *ev = &scratch->ev;
	fill_header(&ev->hdr, TS_EV_IO, 1);
	if (write)
		ev->hdr.ts_ns = a.entry_ns; /* when the application handed the bytes over */
	ev->sock = a.sock;
	ev->dir = write ? TS_DIR_SEND : TS_DIR_RECV;
	ev->syscall = write ? TS_SYS_SSL_WRITE : TS_SYS_SSL_READ;
	ev->fd = -1;
	ev->flags = 0;
	ev->bytes = n;
	ev->payload_len = 0;
	ev->_pad = 0;
	__u32 cap = cfg_payload_cap < TS_PAYLOAD_MAX ? cfg_payload_cap : TS_PAYLOAD_MAX;
	__u32 len = (__u64)n < cap ? (__u32)n : cap;
	if (len > TS_PAYLOAD_MAX)
		len = TS_PAYLOAD_MAX;
	if (bpf_probe_read_user(ev->payload, len, (void *)a.buf))
		ev->flags |= TS_IO_F_PAYLOAD_FAULT;
	else
		ev->payload_len = len;
	if (held) {
		scratch->ssl = a.ssl;
		scratch->held_ns = bpf_ktime_get_ns();
		/* A thread holds one write: an older one never found its socket. */
		int older = bpf_map_lookup_elem(&TLS_HELD, &tid) != 0;
		if (older)
			count(TS_CNT_TLS_UNTIED);
		if (bpf_map_update_elem(&TLS_HELD, &tid, scratch, BPF_ANY))
			count(TS_CNT_TLS_UNTIED);
		else if (!older)
			__sync_fetch_and_add(&tls_held_now, 1);
		return 0;
	}
	__u64 size = TS_IO_EVENT_HEAD_SIZE + (__u64)ev->payload_len;
	if (size > TS_IO_EVENT_SIZE)
		size = TS_IO_EVENT_SIZE;
	submit(ev, size);
	return 0;
}
