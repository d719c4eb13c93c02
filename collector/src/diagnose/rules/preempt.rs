//! Rule 12, read from an engine's token writes and GPU steps: KV-cache preemption. When
//! the running requests outgrow the KV cache, vLLM V1 (and SGLang's retraction) evicts
//! the newest and later recomputes its prompt and the tokens it had generated: its
//! stream stops while the others keep decoding, then prefill work runs again before its
//! next token.

use std::collections::{BTreeMap, HashMap};

use super::{fig, fix, median, ms, Draft, MIN_EVIDENCE};
use crate::analyze::percentile_in_place;
use crate::diagnose::{Finding, Input};
use crate::gpu::{GpuStep, StepKind};
use crate::stitch::PointKind;

/// A stalled gap is this many halves of the engine's typical token gap long, at least.
const STALL_HALVES: u64 = 3;

/// One request's stall: its engine-side gap `k` (between tokens k and k+1).
struct Stall {
    request: usize,
    gap: usize,
    gap_ns: u64,
    /// Steps with prefill work that ran inside the stall (the recompute, and maybe others').
    prefill_ns: u64,
}

/// Rule 12: a request whose tokens stop for >= 1.5 typical gaps while its engine ran
/// steps that decoded the others (a running stream gets a token from every one), and
/// whose next token comes from a step with prefill work (the recompute), in >= 3 requests.
pub(super) fn kv_preemption(input: &Input) -> Option<Finding> {
    let mut steps: HashMap<u32, Vec<&GpuStep>> = HashMap::new();
    for s in input.steps {
        steps.entry(s.pid).or_default().push(s);
    }
    // Each engine's token gaps, for its typical one.
    let mut gaps: HashMap<u32, Vec<u64>> = HashMap::new();
    for r in &input.requests {
        let Some(p) = r.point(PointKind::EngineWrite) else {
            continue;
        };
        gaps.entry(p.pid)
            .or_default()
            .extend(p.token_ns.windows(2).map(|w| w[1] - w[0]));
    }
    // Once per engine, not per request: a selection over all of its gaps, where they
    // lie (a copy of every gap of a 60 s window was 2 MB of top's peak).
    let typical: HashMap<u32, u64> = gaps
        .into_iter()
        .map(|(pid, mut g)| (pid, percentile_in_place(&mut g, 500)))
        .collect();
    let mut stalls = Vec::new();
    for (i, r) in input.requests.iter().enumerate() {
        let Some(p) = r.point(PointKind::EngineWrite) else {
            continue;
        };
        let Some(mine) = steps.get(&p.pid) else {
            continue;
        };
        let typical = typical.get(&p.pid).copied().unwrap_or(0);
        if typical == 0 {
            continue;
        }
        for (k, w) in p.token_ns.windows(2).enumerate() {
            let (a, b) = (w[0], w[1]);
            if 2 * (b - a) < STALL_HALVES * typical {
                continue;
            }
            // The steps that ended in the gap: one (the step of token k+1) for a running
            // stream; more when it sat out steps the others decoded in, and the last one
            // carried prefill work when it was recomputed.
            let (from, to) = (
                mine.partition_point(|s| s.end_ns <= a),
                mine.partition_point(|s| s.end_ns <= b),
            );
            let inner = &mine[from..to];
            let Some((last, missed)) = inner.split_last() else {
                continue;
            };
            if last.kind == StepKind::Decode || missed.iter().all(|s| s.kind == StepKind::Prefill) {
                continue; // not recomputed, or everyone waited for a prefill (rule 5)
            }
            let prefill_ns = inner
                .iter()
                .filter(|s| s.kind != StepKind::Decode)
                .map(|s| s.end_ns - s.start_ns)
                .sum();
            stalls.push(Stall {
                request: i,
                gap: k,
                gap_ns: b - a,
                prefill_ns,
            });
        }
    }
    let mut weights: BTreeMap<usize, u64> = BTreeMap::new();
    for s in &stalls {
        *weights.entry(s.request).or_default() += s.gap_ns;
    }
    if weights.len() < MIN_EVIDENCE {
        return None;
    }
    let itl = gap_cuts(input, &stalls, &typical);
    let stalled: Vec<u64> = stalls.iter().map(|s| s.gap_ns).collect();
    let recompute: Vec<u64> = stalls.iter().map(|s| s.prefill_ns).collect();
    let d = Draft {
        rule: 12,
        requests: &input.requests,
        weights: &weights,
        finding: format!(
            "{} requests stopped mid-stream {} times ({} ms p50) while the engine kept \
             decoding the others, then had prefill work again before their next token: \
             preempted when the KV cache filled, and recomputed",
            weights.len(),
            stalls.len(),
            ms(median(&stalled))
        ),
        figures: vec![
            fig("preempted requests", weights.len() as f64, "requests"),
            fig("stalls", stalls.len() as f64, "stalls"),
            fig("stall p50", ms(median(&stalled)), "ms"),
            fig(
                "prefill steps inside a stall p50",
                ms(median(&recompute)),
                "ms",
            ),
        ],
        basis: "each stalled token gap falls to the engine's typical gap (no preemption)",
        fix: vec![
            fix(
                "vLLM",
                &[
                    "--gpu-memory-utilization 0.95  # more KV cache blocks",
                    "--max-num-seqs N  # fewer sequences sharing the cache",
                    "--kv-cache-dtype fp8  # twice the tokens in the same memory",
                ],
            ),
            fix(
                "SGLang",
                &["--mem-fraction-static 0.9; --max-running-requests N"],
            ),
        ],
    }
    .diagnosis();
    Some(Finding::itl_only(d, itl))
}

/// Per (request, gap at its TTFT point): the stall less the engine's typical gap. The
/// engine's gap k is the same token pair at the client-most point.
fn gap_cuts(
    input: &Input,
    stalls: &[Stall],
    typical: &HashMap<u32, u64>,
) -> BTreeMap<(usize, usize), i64> {
    let mut itl = BTreeMap::new();
    for s in stalls {
        let r = &input.requests[s.request];
        let Some(pid) = r.point(PointKind::EngineWrite).map(|p| p.pid) else {
            continue;
        };
        let typical = typical.get(&pid).copied().unwrap_or(0);
        itl.insert((s.request, s.gap), s.gap_ns.saturating_sub(typical) as i64);
    }
    itl
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stitch::Request;

    const MS: u64 = 1_000_000;

    fn step(start: u64, kind: StepKind) -> GpuStep {
        GpuStep {
            pid: 5,
            tid: 5,
            comm: "engine".into(),
            start_ns: start,
            end_ns: start + 15 * MS,
            kind,
            kernel_launches: u32::from(kind != StepKind::Decode),
            graph_launches: 1,
            copied_bytes: 4,
            device: None,
        }
    }

    /// Steps every 16 ms, mixed at `mixed`; request `i` writes a token after each step
    /// except those in `stopped` (its stall).
    fn engine(
        stalled: &[(usize, std::ops::Range<u64>)],
        mixed: &[u64],
    ) -> (Vec<GpuStep>, Vec<Request>) {
        let steps: Vec<GpuStep> = (0..60u64)
            .map(|k| {
                let kind = if mixed.contains(&k) {
                    StepKind::Mixed
                } else {
                    StepKind::Decode
                };
                step(1_000 * MS + k * 16 * MS, kind)
            })
            .collect();
        let requests = (0..4usize)
            .map(|i| {
                let tokens = steps
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| {
                        !stalled
                            .iter()
                            .any(|(r, range)| *r == i && range.contains(&(*k as u64)))
                    })
                    .map(|(_, s)| s.end_ns + MS / 10)
                    .collect();
                Request::at_point(i, PointKind::EngineWrite, 5, "engine", tokens)
            })
            .collect();
        (steps, requests)
    }

    fn run(steps: &[GpuStep], requests: &[Request]) -> Option<Finding> {
        kv_preemption(&Input {
            requests: requests.iter().collect(),
            steps,
            nvml: &[],
            shares: &[],
        })
    }

    #[test]
    fn streams_that_stop_while_others_decode_and_prefill_again_are_preempted() {
        // Requests 1-3 each miss 9 steps' tokens; the step that gives their next token has
        // prefill work (the recompute's last chunk).
        let stalled = [(1, 10..19), (2, 25..34), (3, 40..49)];
        let (steps, requests) = engine(&stalled, &[19, 34, 49]);
        let f = run(&steps, &requests).expect("three preempted requests");
        assert_eq!(f.diagnosis.evidence.requests, 3);
        let cuts: Vec<i64> = f.itl.values().copied().collect();
        assert_eq!(
            cuts,
            vec![144 * MS as i64; 3],
            "each stall of 10 gaps less one"
        );
    }

    #[test]
    fn stalls_without_a_recompute_or_while_all_stall_are_not() {
        let stalled = [(1, 10..19), (2, 25..34), (3, 40..49)];
        let (steps, requests) = engine(&stalled, &[]);
        assert!(
            run(&steps, &requests).is_none(),
            "no prefill work before the token"
        );
        // Everyone waits for one long prefill step (rule 5's, not preemption): a gap spans
        // the prefill step and the step after it.
        let (mut steps, requests) = engine(&[], &[]);
        for k in [10, 30, 50] {
            steps[k].kind = StepKind::Prefill;
        }
        let requests: Vec<Request> = requests
            .into_iter()
            .map(|mut r| {
                let drop: Vec<u64> = [10usize, 30, 50]
                    .iter()
                    .map(|&k| steps[k].end_ns + MS / 10)
                    .collect();
                r.points[0].token_ns.retain(|t| !drop.contains(t));
                r
            })
            .collect();
        for k in [11, 31, 51] {
            steps[k].kind = StepKind::Mixed;
        }
        assert!(
            run(&steps, &requests).is_none(),
            "the others did not decode meanwhile"
        );
    }
}
