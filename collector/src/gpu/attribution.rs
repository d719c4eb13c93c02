//! GPU steps joined to requests, by time and engine process: libcuda calls
//! carry no request ids, so a request's steps are those its engine ran while
//! the request was waiting for its first token (prefill) or streaming (decode).
//! A decode gap that spans a step with prefill work is blamed on the requests
//! whose prefill was running then.

use serde::Serialize;

use super::{GpuStep, StepKind};
use crate::stitch::{PointKind, Request};

#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuShare {
    /// Arrival at the engine -> the first step with prefill work that started after it.
    pub queue_ns: Option<u64>,
    /// Steps with prefill work while this request waited for its first token, and their time.
    pub prefill_steps: u32,
    pub prefill_ns: u64,
    /// Steps between its first and last token.
    pub decode_steps: u32,
    /// Its inter-token gaps at the engine that a step with prefill work stalled.
    pub stalled_by: Vec<Stall>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stall {
    /// The gap between two of its tokens at the engine.
    pub gap_ns: u64,
    pub step_kind: StepKind,
    pub step_ns: u64,
    /// Requests (report ids) whose prefill ran in that step.
    pub requests: Vec<usize>,
}

/// One engine's view of a request: arrival, first and last token written.
struct Window {
    pid: u32,
    arrived: u64,
    first: u64,
    tokens: Vec<u64>,
}

fn window(r: &Request) -> Option<Window> {
    let engine = r.point(PointKind::EngineWrite)?;
    Some(Window {
        pid: engine.pid,
        arrived: r.engine_received_ns?,
        first: *engine.token_ns.first()?,
        tokens: engine.token_ns.clone(),
    })
}

pub fn attribute(requests: &mut [Request], steps: &[GpuStep]) {
    if steps.is_empty() {
        return;
    }
    let windows: Vec<Option<Window>> = requests.iter().map(window).collect();
    let prefilling = |pid: u32, s: &GpuStep| -> Vec<usize> {
        windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                w.as_ref()
                    .filter(|w| w.pid == pid && w.arrived <= s.start_ns && w.first >= s.end_ns)
                    .map(|_| i)
            })
            .collect()
    };
    for (i, w) in windows.iter().enumerate() {
        let Some(w) = w else { continue };
        let mine: Vec<&GpuStep> = steps.iter().filter(|s| s.pid == w.pid).collect();
        let with_prefill = |s: &&&GpuStep| s.kind != StepKind::Decode;
        let mut share = GpuShare {
            queue_ns: mine
                .iter()
                .filter(with_prefill)
                .find(|s| s.start_ns >= w.arrived)
                .map(|s| s.start_ns - w.arrived),
            ..Default::default()
        };
        for s in mine
            .iter()
            .filter(|s| s.start_ns >= w.arrived && s.end_ns <= w.first)
        {
            if s.kind != StepKind::Decode {
                share.prefill_steps += 1;
                share.prefill_ns += s.end_ns - s.start_ns;
            }
        }
        let last = *w.tokens.last().unwrap_or(&w.first);
        share.decode_steps = mine
            .iter()
            .filter(|s| s.start_ns >= w.first && s.end_ns <= last)
            .count() as u32;
        for pair in w.tokens.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let Some(s) = mine
                .iter()
                .filter(with_prefill)
                .find(|s| s.start_ns >= a && s.end_ns <= b)
            else {
                continue;
            };
            let culprits: Vec<usize> = prefilling(w.pid, s)
                .into_iter()
                .filter(|&j| j != i)
                .collect();
            if !culprits.is_empty() {
                share.stalled_by.push(Stall {
                    gap_ns: b - a,
                    step_kind: s.kind,
                    step_ns: s.end_ns - s.start_ns,
                    requests: culprits.iter().map(|&j| requests[j].id).collect(),
                });
            }
        }
        requests[i].gpu = Some(share);
    }
}
