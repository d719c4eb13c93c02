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

/// Graph-only steps are decode by their launches, but engines that capture mixed batches
/// in CUDA graphs (vLLM V1's full graphs) prefill inside them too. A request whose wait
/// for its first token held no step with kernel launches had its prefill in the step it
/// `ended_in`: if that step began after the request arrived, it did prefill work (mixed
/// when another request was streaming across it, else prefill). Engines that prefill with
/// kernels are left as they are.
fn reclassify(
    windows: &[Option<Window>],
    ended_in: &[Option<usize>],
    by_pid: &HashMap<u32, Vec<usize>>,
    steps: &mut [GpuStep],
) {
    let mut changes = Vec::new();
    for (w, &last) in windows.iter().zip(ended_in) {
        let (Some(w), Some(last)) = (w, last) else {
            continue;
        };
        let ks = &by_pid[&w.pid];
        let n = ks.partition_point(|&k| k <= last);
        let mut in_wait = ks[..n]
            .iter()
            .rev()
            .take_while(|&&k| steps[k].start_ns >= w.arrived);
        if steps[last].start_ns < w.arrived || in_wait.any(|&k| steps[k].kind != StepKind::Decode) {
            continue;
        }
        let s = &steps[last];
        let streaming = windows.iter().flatten().any(|o| {
            o.pid == w.pid
                && o.first <= s.start_ns
                && o.tokens.last().is_some_and(|&t| t >= s.end_ns)
        });
        changes.push((
            last,
            if streaming {
                StepKind::Mixed
            } else {
                StepKind::Prefill
            },
        ));
    }
    for (k, kind) in changes {
        steps[k].kind = kind;
    }
}

/// Joins steps to requests (see the module doc); first refines step kinds by who was
/// waiting (see `reclassify`).
pub fn attribute(requests: &mut [Request], steps: &mut [GpuStep]) {
    if steps.is_empty() {
        return;
    }
    let windows: Vec<Option<Window>> = requests.iter().map(window).collect();
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
    reclassify(&windows, &ended_in, &by_pid, steps);
    let steps: &[GpuStep] = steps;
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A request the engine (pid 7) received at `arrived` and answered with tokens at `tokens`.
    fn request(id: usize, arrived: u64, tokens: Vec<u64>) -> Request {
        let mut r = Request::at_point(id, PointKind::EngineWrite, 7, "engine", tokens);
        r.engine_received_ns = Some(arrived);
        r.start_ns = arrived;
        r
    }

    /// Steps of 20 ms every 20 ms from t=0, all graph launches (decode by their launches).
    fn graph_steps(n: u64) -> Vec<GpuStep> {
        (0..n)
            .map(|i| GpuStep {
                pid: 7,
                tid: 7,
                comm: "engine".into(),
                start_ns: i * 20 * MS + 100_000,
                end_ns: (i + 1) * 20 * MS,
                kind: StepKind::Decode,
                kernel_launches: 0,
                graph_launches: 1,
            })
            .collect()
    }

    #[test]
    fn a_graph_step_that_ends_a_waiting_requests_prefill_did_prefill_work() {
        let mut steps = graph_steps(10);
        // Request 0 streams from 21 ms on; request 1 arrives at 45 ms and its first token
        // follows step 3 (60..80 ms): that step prefilled it beside request 0's decode.
        // Request 2 arrives at 150 ms, alone after request 0 ended: step 8 prefilled it.
        let tokens = |from: u64, n: u64| (0..n).map(|i| from + i * 20 * MS + MS).collect();
        let mut reqs = vec![
            request(0, 0, tokens(20 * MS, 6)),
            request(1, 45 * MS, tokens(80 * MS, 3)),
            request(2, 150 * MS, tokens(180 * MS, 1)),
        ];
        attribute(&mut reqs, &mut steps);
        let kinds: Vec<StepKind> = steps.iter().map(|s| s.kind).collect();
        assert_eq!(kinds[3], StepKind::Mixed, "{kinds:?}");
        assert_eq!(kinds[8], StepKind::Prefill, "{kinds:?}");
        // Request 0 arrived as step 0 began, with nothing streaming: a prefill step.
        assert_eq!(kinds[0], StepKind::Prefill, "{kinds:?}");
        assert_eq!(
            kinds.iter().filter(|k| **k == StepKind::Decode).count(),
            7,
            "the others stay decode: {kinds:?}"
        );
        let prefill = |i: usize| reqs[i].gpu.as_ref().unwrap().prefill_steps;
        assert_eq!((prefill(1), prefill(2)), (1, 1));
    }

    #[test]
    fn engines_that_prefill_with_kernels_keep_their_step_kinds() {
        let mut steps = graph_steps(6);
        steps[2].kind = StepKind::Prefill;
        steps[2].kernel_launches = 4;
        let mut reqs = vec![request(0, 30 * MS, vec![101 * MS, 121 * MS])];
        let before: Vec<StepKind> = steps.iter().map(|s| s.kind).collect();
        attribute(&mut reqs, &mut steps);
        let after: Vec<StepKind> = steps.iter().map(|s| s.kind).collect();
        assert_eq!(before, after, "a kernel step in its wait did the prefill");
    }
}
