/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tokenscope's kernel half: one object, one ring buffer. Concerns live in
 * their own headers (they share maps, so they share one compilation unit):
 *   conn.bpf.h  TCP state changes, accepts, retransmits
 *   io.bpf.h    every TCP send/receive with a bounded payload prefix
 *   tls.bpf.h   OpenSSL plaintext (uprobes, optional), tied to io.bpf.h's sockets
 *   gpu.bpf.h   libcuda calls (uprobes, optional)
 */
#include "common.bpf.h"
#include "conn.bpf.h"
#include "tls.bpf.h"
#include "io.bpf.h"
#include "gpu.bpf.h"

char LICENSE[] SEC("license") = "GPL";
