//! GPU steps joined to requests, by time and engine process: libcuda calls
//! carry no request ids, so a request's steps are those its engine ran while
//! the request was waiting for its first token (prefill) or streaming (decode).
//! A decode gap that spans a step with prefill work is blamed on the requests
//! whose prefill was running then.

use std::collections::HashMap;

use serde::Serialize;

use super::{GpuStep, StepKind};
use crate::stitch::{PointKind, Request};

#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuShare {
    /// Arrival at the engine -> the first step that prefilled it.
    pub queue_ns: Option<u64>,
    /// Steps that prefilled it (see `attribute`), and their time.
    pub prefill_steps: u32,
    pub prefill_ns: u64,
    /// Steps between its first and last token.
    pub decode_steps: u32,
    /// Its inter-token gaps at the engine that a step with prefill work stalled.
    pub stalled_by: Vec<Stall>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stall {
    /// The gap between two of its tokens at the engine: it ends at this token (index).
    pub token: usize,
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
    let waiting = |pid: u32, s: &GpuStep| -> Vec<usize> {
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
    // Which requests each step with prefill work served. A request's prefill ended in
    // the engine's last step that ended before its first token was written (the write
    // lags the step's end, and may land after the next step started); when no waiting
    // request's prefill ended in a step, the oldest waiting request was being chunked
    // (first come, first served). A step that also starts another prompt credits
    // only the first: a known limit without request ids in the GPU calls.
    let mut by_pid: HashMap<u32, Vec<usize>> = HashMap::new();
    for (k, s) in steps.iter().enumerate() {
        by_pid.entry(s.pid).or_default().push(k);
    }
    // An engine's steps do not overlap, so their ends rise with their starts.
    let last_step_before = |pid: u32, t: u64| -> Option<usize> {
        let ks = by_pid.get(&pid)?;
        let n = ks.partition_point(|&k| steps[k].end_ns <= t);
        n.checked_sub(1).map(|n| ks[n])
    };
    let ended_in: Vec<Option<usize>> = windows
        .iter()
        .map(|w| w.as_ref().and_then(|w| last_step_before(w.pid, w.first)))
        .collect();
    let mut served: Vec<Vec<&GpuStep>> = vec![Vec::new(); requests.len()];
    for (k, s) in steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind != StepKind::Decode)
    {
        let candidates = waiting(s.pid, s);
        let finishing: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| ended_in[i] == Some(k))
            .collect();
        let chosen = if finishing.is_empty() {
            candidates
                .iter()
                .copied()
                .min_by_key(|&i| windows[i].as_ref().map_or(u64::MAX, |w| w.arrived))
                .into_iter()
                .collect()
        } else {
            finishing
        };
        for i in chosen {
            served[i].push(s);
        }
    }
    for (i, w) in windows.iter().enumerate() {
        let Some(w) = w else { continue };
        // Its engine's steps, in start order (steps are sorted by start).
        let mine: Vec<&GpuStep> = by_pid
            .get(&w.pid)
            .map(|ks| ks.iter().map(|&k| &steps[k]).collect())
            .unwrap_or_default();
        let from = |t: u64| mine.partition_point(|s| s.start_ns < t);
        let mut share = GpuShare {
            queue_ns: served[i]
                .first()
                .map(|s| s.start_ns.saturating_sub(w.arrived)),
            prefill_steps: served[i].len() as u32,
            prefill_ns: served[i].iter().map(|s| s.end_ns - s.start_ns).sum(),
            ..Default::default()
        };
        let last = *w.tokens.last().unwrap_or(&w.first);
        share.decode_steps = mine[from(w.first)..]
            .iter()
            .take_while(|s| s.start_ns <= last)
            .filter(|s| s.end_ns <= last)
            .count() as u32;
        for (k, pair) in w.tokens.windows(2).enumerate() {
            let (a, b) = (pair[0], pair[1]);
            let Some(s) = mine[from(a)..]
                .iter()
                .take_while(|s| s.start_ns <= b)
                .find(|s| s.kind != StepKind::Decode && s.end_ns <= b)
            else {
                continue;
            };
            let culprits: Vec<usize> = waiting(w.pid, s).into_iter().filter(|&j| j != i).collect();
            if !culprits.is_empty() {
                share.stalled_by.push(Stall {
                    token: k + 1,
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
