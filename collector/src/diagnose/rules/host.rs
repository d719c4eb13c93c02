//! Rule 11, read from an engine's GPU steps while it streams: the device waits for the
//! host between decode steps (output processing, detokenising, scheduling the next
//! batch in a Python loop). GPU-timed steps measure the idle from the device's own end
//! and start (CUPTI); CPU-timed ones from a step's synchronisation return to the next
//! step's first launch, which is all the GPU can be busy with in a synchronous loop.

use std::collections::{BTreeMap, HashMap};

use super::{fig, fix, median, ms, Draft};
use crate::diagnose::{Finding, Input};
use crate::gpu::{GpuStep, StepKind};
use crate::stitch::PointKind;

/// The idle share of decode wall time that makes a loop host-bound (vLLM reports its
/// synchronous scheduler costs 5-10% on fast GPUs; at a fifth the host is the bottleneck).
const IDLE_SHARE: f64 = 0.20;
/// Decode step pairs the share is measured over, at least.
const MIN_PAIRS: usize = 20;

/// One gap between two consecutive steps of an engine while requests streamed.
struct Gap {
    pid: u32,
    /// The device idle: previous step's end -> next step's start.
    from: u64,
    to: u64,
    /// What overlapping the host work with the next step can hide: the idle, up to the
    /// next step's own length (async scheduling runs the host work during it).
    hidden: u64,
}

/// Rule 11: between decode steps the GPU idles >= 20% of the wall time while requests
/// stream from that engine.
pub(super) fn host_bound_decode(input: &Input) -> Option<Finding> {
    let streaming = Streaming::of(input);
    let mut by_pid: BTreeMap<u32, Vec<&GpuStep>> = BTreeMap::new();
    for s in input.steps {
        by_pid.entry(s.pid).or_default().push(s);
    }
    let (mut gaps, mut idle, mut wall, mut gpu_timed) = (Vec::new(), 0u64, 0u64, 0usize);
    for (pid, steps) in &by_pid {
        for pair in steps.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.kind == StepKind::Prefill {
                continue; // decode only: a prompt's prefill is rule 5's
            }
            let ((a_start, a_end), (b_start, b_end), device) = match (a.device, b.device) {
                (Some(x), Some(y)) => ((x.start_ns, x.end_ns), (y.start_ns, y.end_ns), true),
                _ => ((a.start_ns, a.end_ns), (b.start_ns, b.end_ns), false),
            };
            if b_start <= a_start || !streaming.across(*pid, a_end, b_start) {
                continue;
            }
            let gap = b_start.saturating_sub(a_end);
            idle += gap;
            wall += b_start - a_start;
            gpu_timed += usize::from(device);
            gaps.push(Gap {
                pid: *pid,
                from: a_end,
                to: b_start,
                hidden: gap.min(b_end.saturating_sub(b_start)),
            });
        }
    }
    if gaps.len() < MIN_PAIRS || wall == 0 {
        return None;
    }
    let share = idle as f64 / wall as f64;
    if share < IDLE_SHARE {
        return None;
    }
    let (itl, weights) = gap_cuts(input, &gaps);
    let idles: Vec<u64> = gaps.iter().map(|g| g.to - g.from).collect();
    let timing = if gpu_timed == gaps.len() {
        "GPU-timed by CUPTI"
    } else {
        "CPU-timed: a step's synchronisation return to the next step's first launch"
    };
    let pids: Vec<u32> = by_pid.keys().copied().collect();
    let comm = input
        .steps
        .iter()
        .find(|s| gaps.first().is_some_and(|g| g.pid == s.pid))
        .map_or("engine", |s| s.comm.as_str());
    let mut d = Draft {
        rule: 11,
        requests: &input.requests,
        weights: &weights,
        finding: format!(
            "between decode steps the GPU waits for the host {:.0}% of the time ({} ms p50 per \
             gap over {} gaps, {timing}) while requests stream: the engine's loop processes \
             outputs and schedules the next batch with the GPU idle",
            share * 100.0,
            ms(median(&idles)),
            gaps.len()
        ),
        figures: vec![
            fig(
                "GPU idle share between decode steps",
                (share * 1000.0).round() / 10.0,
                "%",
            ),
            fig("idle per gap p50", ms(median(&idles)), "ms"),
            fig("decode step pairs", gaps.len() as f64, "pairs"),
        ],
        basis: "each token gap loses the host time overlapping would hide: the idle before \
                the step that made the token, up to that step's own length",
        fix: vec![
            fix(
                "vLLM",
                &["--async-scheduling  # schedules step N+1 while step N runs on the GPU"],
            ),
            fix(
                "SGLang",
                &["leave the overlap scheduler on: remove --disable-overlap-schedule"],
            ),
            fix(
                "engine",
                &["fewer host-side stop strings/logprobs per token; detokenise off the loop"],
            ),
        ],
    }
    .diagnosis();
    d.scope = match pids.as_slice() {
        [pid] => format!("{comm}/{pid}: {}", d.scope),
        _ => d.scope,
    };
    Some(Finding::itl_only(d, itl))
}

/// Per (request, gap at its TTFT point): the hidden host time of the engine gaps whose
/// middle falls between the two tokens as its engine wrote them (the host work runs
/// between one token's step and the write of the next).
fn gap_cuts(input: &Input, gaps: &[Gap]) -> (BTreeMap<(usize, usize), i64>, BTreeMap<usize, u64>) {
    let mut by_pid: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for g in gaps {
        by_pid
            .entry(g.pid)
            .or_default()
            .push((g.from / 2 + g.to / 2, g.hidden));
    }
    let (mut itl, mut weights) = (BTreeMap::new(), BTreeMap::new());
    for (i, r) in input.requests.iter().enumerate() {
        let Some(engine) = r.point(PointKind::EngineWrite) else {
            continue;
        };
        let Some(mids) = by_pid.get(&engine.pid) else {
            continue;
        };
        for (k, w) in engine.token_ns.windows(2).enumerate() {
            let lo = mids.partition_point(|m| m.0 <= w[0]);
            let hi = mids.partition_point(|m| m.0 <= w[1]);
            let cut: u64 = mids[lo..hi]
                .iter()
                .map(|m| m.1)
                .sum::<u64>()
                .min(w[1] - w[0]);
            if cut > 0 {
                itl.insert((i, k), cut as i64);
                *weights.entry(i).or_insert(0u64) += cut;
            }
        }
    }
    (itl, weights)
}

/// When each engine process had a stream open: its requests' first and last token there.
struct Streaming {
    /// Per engine pid: first-token times sorted, last-token times sorted.
    by_pid: HashMap<u32, (Vec<u64>, Vec<u64>)>,
}

impl Streaming {
    fn of(input: &Input) -> Streaming {
        let mut by_pid: HashMap<u32, (Vec<u64>, Vec<u64>)> = HashMap::new();
        for r in &input.requests {
            let Some(p) = r.point(PointKind::EngineWrite) else {
                continue;
            };
            if let (Some(&first), Some(&last)) = (p.token_ns.first(), p.token_ns.last()) {
                let e = by_pid.entry(p.pid).or_default();
                e.0.push(first);
                e.1.push(last);
            }
        }
        for (firsts, lasts) in by_pid.values_mut() {
            firsts.sort_unstable();
            lasts.sort_unstable();
        }
        Streaming { by_pid }
    }

    /// Some stream of `pid` had its first token by `from` and its last at `to` or later:
    /// a request was waiting for the next step through the gap.
    fn across(&self, pid: u32, from: u64, to: u64) -> bool {
        let Some((firsts, lasts)) = self.by_pid.get(&pid) else {
            return false;
        };
        let started = firsts.partition_point(|&t| t <= from);
        let ended = lasts.partition_point(|&t| t < to);
        started > ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::DeviceTime;
    use crate::stitch::Request;

    const MS: u64 = 1_000_000;

    fn step(start: u64, end: u64, device: Option<(u64, u64)>) -> GpuStep {
        GpuStep {
            pid: 5,
            tid: 5,
            comm: "engine".into(),
            start_ns: start,
            end_ns: end,
            kind: StepKind::Decode,
            kernel_launches: 0,
            graph_launches: 1,
            copied_bytes: 4,
            device: device.map(|(s, e)| DeviceTime {
                start_ns: s,
                end_ns: e,
                busy_ns: e - s,
                records: 2,
                device: 0,
                stream: 7,
            }),
        }
    }

    /// 40 decode steps of 16 ms, `host` ms apart; one stream writing a token after each.
    fn engine(host: u64, device: bool) -> (Vec<GpuStep>, Vec<Request>) {
        let period = (16 + host) * MS;
        let steps: Vec<GpuStep> = (0..40u64)
            .map(|k| {
                let s = 1_000 * MS + k * period;
                step(
                    s,
                    s + 16 * MS,
                    device.then_some((s + MS / 10, s + 16 * MS - MS / 10)),
                )
            })
            .collect();
        let tokens: Vec<u64> = steps
            .iter()
            .map(|s| s.end_ns + host * MS - MS / 20)
            .collect();
        let r = Request::at_point(0, PointKind::EngineWrite, 5, "engine", tokens);
        (steps, vec![r])
    }

    fn run(steps: &[GpuStep], requests: &[Request]) -> Option<Finding> {
        host_bound_decode(&Input {
            requests: requests.iter().collect(),
            steps,
            nvml: &[],
            shares: &[],
        })
    }

    #[test]
    fn an_idle_gpu_between_decode_steps_is_host_bound_gpu_or_cpu_timed() {
        for device in [false, true] {
            let (steps, requests) = engine(8, device);
            let f = run(&steps, &requests).expect("8 ms idle per 24 ms: a third");
            let share = f.diagnosis.evidence.figures[0].value;
            assert!((30.0..=35.0).contains(&share), "idle share {share}%");
            // The engine's 39 gaps but the first (before the stream's first token was
            // out): each ends in the token gap after it, every one but the last.
            let cuts: Vec<i64> = f.itl.values().copied().collect();
            assert_eq!(cuts.len(), 38, "one cut per token gap");
            assert!(
                cuts.iter()
                    .all(|&c| (7 * MS as i64..=9 * MS as i64).contains(&c)),
                "{cuts:?}"
            );
        }
    }

    #[test]
    fn a_busy_gpu_or_an_engine_with_nothing_to_stream_is_not() {
        let (steps, requests) = engine(1, false);
        assert!(run(&steps, &requests).is_none(), "1 ms per 17 ms is 6%");
        let (steps, _) = engine(8, false);
        assert!(
            run(&steps, &[]).is_none(),
            "no stream waited through the gaps"
        );
    }
}
