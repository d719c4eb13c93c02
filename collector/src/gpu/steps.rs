//! libcuda calls -> GPU steps. An engine step launches kernels (eager prefill) or
//! CUDA graphs (decode), copies the sampled tokens to the host and waits for
//! the stream: a step runs from its first launch to the return of the
//! synchronisation that follows a device-to-host copy.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ingest::model::{event::Body, CudaApi, GpuActivityKind};
use crate::ingest::Event;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Kernel launches only: eager prefill.
    Prefill,
    /// Graph launches only: decode under CUDA graphs.
    Decode,
    /// Both.
    Mixed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GpuStep {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub kind: StepKind,
    pub kernel_launches: u32,
    pub graph_launches: u32,
    /// Bytes copied device-to-host in the step: the sampled token ids, one row per request
    /// in the batch for engines that sample every scheduled request (vLLM V1 does, and
    /// drops the rows of prompts still in prefill on the host).
    pub copied_bytes: u64,
    /// The step's work on the device, from the engine's CUPTI records (GPU-timed); None
    /// without them (CPU-timed: first launch -> synchronisation's return).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<super::DeviceTime>,
}

#[derive(Debug, Default)]
struct Open {
    start_ns: u64,
    kernels: u32,
    graphs: u32,
    copied: bool,
    bytes: u64,
}

/// Steps per engine thread, ordered by start; GPU-timed where CUPTI records came along.
pub fn steps(events: &[Event]) -> Vec<GpuStep> {
    let mut calls: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.body, Some(Body::Cuda(_) | Body::Gpu(_))))
        .collect();
    calls.sort_by_key(|e| e.ts_ns);
    let mut tracker = StepTracker::default();
    let mut timer = super::StepTimer::default();
    let mut out: Vec<GpuStep> = Vec::new();
    for e in calls {
        match &e.body {
            Some(Body::Gpu(g)) if device_work(g.kind()) => timer.record(
                e.pid,
                (g.device, g.stream),
                (g.start_ns, g.end_ns),
                &mut out,
            ),
            _ => out.extend(tracker.push(e).map(|mut s| {
                timer.time(&mut s);
                s
            })),
        }
    }
    out.sort_by_key(|s| s.start_ns);
    out
}

/// CUPTI records that are a step's device work (NVTX ranges are the host's).
pub fn device_work(kind: GpuActivityKind) -> bool {
    matches!(
        kind,
        GpuActivityKind::Kernel | GpuActivityKind::Memcpy | GpuActivityKind::Graph
    )
}

/// Steps built one libcuda call at a time (calls in time order): a step comes out
/// when the synchronisation that ends it returns.
#[derive(Debug, Default)]
pub struct StepTracker {
    open: BTreeMap<(u32, u32), Open>,
}

impl StepTracker {
    pub fn push(&mut self, ev: &Event) -> Option<GpuStep> {
        let Some(Body::Cuda(call)) = &ev.body else {
            return None;
        };
        let open = &mut self.open;
        let key = (ev.pid, ev.tid);
        match (call.api(), call.entry) {
            (CudaApi::LaunchKernel | CudaApi::LaunchKernelEx, true) => {
                open.entry(key)
                    .or_insert_with(|| Open {
                        start_ns: ev.ts_ns,
                        ..Default::default()
                    })
                    .kernels += 1;
            }
            (CudaApi::GraphLaunch, true) => {
                open.entry(key)
                    .or_insert_with(|| Open {
                        start_ns: ev.ts_ns,
                        ..Default::default()
                    })
                    .graphs += 1;
            }
            (CudaApi::MemcpyDtoHAsync | CudaApi::MemcpyDtoH, true) => {
                if let Some(o) = open.get_mut(&key) {
                    o.copied = true;
                    o.bytes += call.bytes;
                }
            }
            (
                CudaApi::StreamSynchronize
                | CudaApi::CtxSynchronize
                | CudaApi::EventSynchronize
                | CudaApi::MemcpyDtoH,
                false,
            ) if open.get(&key).is_some_and(|o| o.copied) => {
                let o = open.remove(&key).expect("checked");
                let kind = match (o.kernels > 0, o.graphs > 0) {
                    (true, false) => StepKind::Prefill,
                    (false, true) => StepKind::Decode,
                    _ => StepKind::Mixed,
                };
                return Some(GpuStep {
                    pid: ev.pid,
                    tid: ev.tid,
                    comm: ev.comm.to_string(),
                    start_ns: o.start_ns,
                    end_ns: ev.ts_ns,
                    kind,
                    kernel_launches: o.kernels,
                    graph_launches: o.graphs,
                    copied_bytes: o.bytes,
                    device: None,
                });
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::model::CudaCall;

    fn call(ts: u64, api: CudaApi, entry: bool) -> Event {
        let c = CudaCall {
            api: api as i32,
            entry,
            ..Default::default()
        };
        Event {
            ts_ns: ts,
            pid: 1,
            tid: 2,
            cpu: 0,
            comm: "engine".into(),
            body: Some(Body::Cuda(c)),
        }
    }

    #[test]
    fn launches_copy_and_sync_make_steps_of_each_kind() {
        use CudaApi::*;
        let mut ev = Vec::new();
        let mut t = 0;
        let mut step = |launches: &[CudaApi]| {
            for l in launches {
                ev.push(call(t, *l, true));
                ev.push(call(t + 1, *l, false));
                t += 10;
            }
            ev.push(call(t, MemcpyDtoHAsync, true));
            ev.push(call(t + 1, MemcpyDtoHAsync, false));
            ev.push(call(t + 2, StreamSynchronize, true));
            ev.push(call(t + 100, StreamSynchronize, false));
            t += 1000;
        };
        step(&[LaunchKernel, LaunchKernel]);
        step(&[GraphLaunch]);
        step(&[GraphLaunch, LaunchKernel]);
        let s = steps(&ev);
        let kinds: Vec<StepKind> = s.iter().map(|x| x.kind).collect();
        assert_eq!(
            kinds,
            vec![StepKind::Prefill, StepKind::Decode, StepKind::Mixed]
        );
        assert_eq!(
            (s[0].start_ns, s[0].end_ns),
            (0, 120),
            "first launch -> sync return"
        );
        assert_eq!((s[2].kernel_launches, s[2].graph_launches), (1, 1));
    }

    #[test]
    fn a_sync_without_a_copy_does_not_end_a_step() {
        use CudaApi::*;
        let ev = vec![
            call(0, LaunchKernel, true),
            call(5, StreamSynchronize, false),
            call(10, MemcpyDtoH, true),
            call(20, MemcpyDtoH, false),
        ];
        let s = steps(&ev);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].end_ns, 20, "a synchronous copy's return ends the step");
    }
}
