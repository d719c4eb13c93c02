/* SPDX-License-Identifier: GPL-2.0 */
/*
 * tokenscope's kernel half: one object, one ring buffer. Concerns live in
 * their own headers (they share maps, so they share one compilation unit):
 *   conn.bpf.h  TCP state changes, accepts, retransmits
 *   io.bpf.h    every TCP send/receive with a bounded payload prefix
 *   gpu.bpf.h   libcuda calls (uprobes, optional)
 */
#include "common.bpf.h"
#include "conn.bpf.h"
#include "io.bpf.h"
#include "gpu.bpf.h"

char LICENSE[] SEC("license") = "GPL";
