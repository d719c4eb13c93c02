/* SPDX-License-Identifier: GPL-2.0 */
/*
 * libcuda uprobes: host-side GPU step boundaries without restarting the engine.
 * One entry and one return program serve every probed symbol (the return only
 * where it ends a wait: synchronisations and blocking copies, not launches); the
 * loader gives each attachment a cookie (enum ts_cuda_call) that says which call
 * fired.
 * Uprobes cost tens of microseconds per hit in VMs: they are optional.
 */

/* CUlaunchConfig: gridDim[3], blockDim[3], sharedMemBytes (7 x u32), then hStream. */
#define TS_CULAUNCHCONFIG_STREAM_OFFSET 32

SEC("uprobe")
int up_cuda_entry(struct pt_regs *ctx)
{
	if (!pid_wanted(bpf_get_current_pid_tgid() >> 32) || !task_netns_wanted())
		return 0;
	struct ts_cuda_event ev = {};
	fill_header(&ev.hdr, TS_EV_CUDA, 1);
	ev.call = bpf_get_attach_cookie(ctx);
	ev.phase = TS_CUDA_ENTRY;
	switch (ev.call & ~TS_CU_PER_THREAD) {
	case TS_CU_LAUNCH_KERNEL: /* (f, grid xyz, block xyz, sharedMem, hStream, params, extra) */
		ev.stream = uprobe_arg(ctx, 9);
		break;
	case TS_CU_LAUNCH_KERNEL_EX: { /* (const CUlaunchConfig *config, f, params, extra) */
		void *config = (void *)uprobe_arg(ctx, 1);
		bpf_probe_read_user(&ev.stream, sizeof(ev.stream), config + TS_CULAUNCHCONFIG_STREAM_OFFSET);
		break;
	}
	case TS_CU_GRAPH_LAUNCH: /* (hGraphExec, hStream) */
		ev.stream = uprobe_arg(ctx, 2);
		break;
	case TS_CU_MEMCPY_DTOH_ASYNC: /* (dstHost, srcDevice, ByteCount, hStream) */
		ev.bytes = uprobe_arg(ctx, 3);
		ev.stream = uprobe_arg(ctx, 4);
		break;
	case TS_CU_MEMCPY_DTOH: /* (dstHost, srcDevice, ByteCount) */
		ev.bytes = uprobe_arg(ctx, 3);
		break;
	case TS_CU_STREAM_SYNCHRONIZE: /* (hStream) */
	case TS_CU_EVENT_SYNCHRONIZE:  /* (hEvent) */
		ev.stream = uprobe_arg(ctx, 1);
		break;
	default:
		break;
	}
	submit(&ev, sizeof(ev));
	return 0;
}

SEC("uretprobe")
int up_cuda_return(struct pt_regs *ctx)
{
	if (!pid_wanted(bpf_get_current_pid_tgid() >> 32) || !task_netns_wanted())
		return 0;
	struct ts_cuda_event ev = {};
	fill_header(&ev.hdr, TS_EV_CUDA, 1);
	ev.call = bpf_get_attach_cookie(ctx);
	ev.phase = TS_CUDA_RETURN;
#if defined(__TARGET_ARCH_x86)
	ev.result = (__s32)ctx->ax;
#endif
	submit(&ev, sizeof(ev));
	return 0;
}
