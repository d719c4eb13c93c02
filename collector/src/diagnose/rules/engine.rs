//! Rules read from prompts and the engine's GPU steps: no prefix cache (4), prefill
//! stalling decodes (5), queueing (6).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::{fig, fix, median, ms, Draft, MIN_EVIDENCE};
use crate::diagnose::{Figure, Finding, Input, Instead};
use crate::gpu::StepKind;
use crate::stitch::{PointKind, Request};

/// A prefill step stalls decodes when it runs this many decode steps long.
const STALL_FACTOR: u64 = 4;
/// Requests that waited this long for their first step, on a busy engine, queued.
const QUEUE_NS: u64 = 50_000_000;

/// A request's prompt: how much of it an earlier request already sent (whole KiB of
/// shared prefix over its body length).
pub(in crate::diagnose) fn shared_fractions(reqs: &[&Request]) -> Vec<Option<f64>> {
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by_key(|&i| reqs[i].first_byte_ns);
    let mut seen: HashSet<u64> = HashSet::new();
    let mut out = vec![None; reqs.len()];
    for i in order {
        let r = &reqs[i];
        let Some(bytes) = r.body_bytes.filter(|b| *b > 0) else {
            continue;
        };
        if r.prefix_prints.is_empty() {
            continue;
        }
        let shared = r
            .prefix_prints
            .iter()
            .take_while(|h| seen.contains(h))
            .count();
        out[i] = Some(((shared * 1024) as f64 / bytes as f64).min(1.0));
        seen.extend(r.prefix_prints.iter().copied());
    }
    out
}

/// The engine time before a request's first token: prefill steps when the GPU was
/// probed, else the engine's wait (read the request -> wrote the first token).
fn prefill_cost(input: &Input, i: usize) -> Option<u64> {
    let r = input.requests[i];
    match input.gpu(i) {
        Some(g) if g.prefill_steps > 0 => Some(g.prefill_ns),
        _ => r.stages.upstream_wait_ns,
    }
}

/// The share (per mille) of a request's wait at the engine (arrival -> first token) that
/// steps with prefill work covered, when its engine's steps were probed.
fn prefill_share_permille(input: &Input, r: &Request) -> Option<u64> {
    let engine = r.point(PointKind::EngineWrite)?;
    let (from, to) = (r.engine_received_ns?, *engine.token_ns.first()?);
    if to <= from {
        return None;
    }
    let mut any = false;
    let covered: u64 = input
        .steps
        .iter()
        .filter(|s| s.pid == engine.pid)
        .inspect(|_| any = true)
        .filter(|s| s.kind != StepKind::Decode)
        .map(|s| s.end_ns.min(to).saturating_sub(s.start_ns.max(from)))
        .sum();
    any.then(|| covered * 1000 / (to - from))
}

/// Rule 4: prompts repeat a prefix an earlier request sent, yet cost as much to prefill
/// per KiB as new ones (or, with no new ones to compare, over 50 ms): no prefix cache.
pub(super) fn no_prefix_cache(input: &Input) -> Option<(Finding, BTreeMap<usize, u64>)> {
    let e = Repeats::gather(input)?;
    let reqs = &input.requests[..];
    let weights: BTreeMap<usize, u64> = e
        .sharing
        .iter()
        .map(|&i| {
            let wait = reqs[i]
                .stages
                .upstream_wait_ns
                .or(prefill_cost(input, i))
                .unwrap_or(0);
            (i, (wait as f64 * e.fractions[i].unwrap_or(0.0)) as u64)
        })
        .collect();
    let ttft = with_held_stalls(input, &e, &weights);
    let diagnosis = Draft {
        rule: 4,
        requests: reqs,
        weights: &weights,
        finding: e.finding(),
        figures: e.figures(),
        basis: "the shared share of each repeating request's engine wait (queue + prefill) goes",
        fix: vec![
            fix(
                "vLLM",
                &["--enable-prefix-caching  # on by default in the V1 engine"],
            ),
            fix(
                "SGLang",
                &["radix cache is on by default: drop --disable-radix-cache"],
            ),
            fix(
                "client",
                &["keep the shared system prompt first and byte-identical (no timestamps in it)"],
            ),
        ],
    }
    .diagnosis();
    // With rule 2's fix too, no response is held: only the own share goes.
    let finding = Finding {
        diagnosis,
        ttft,
        ttft_added: BTreeMap::new(),
        itl: BTreeMap::new(),
        instead: Some(Instead {
            rule: 2,
            ttft: weights.clone(),
            itl: None,
        }),
    };
    Some((finding, weights))
}

/// Per request: its own saving (`own`), and where its first token reached the client only
/// after the engine had written several (a proxy buffering the stream), the shared share
/// of the other prompts' prefill steps that stalled its stream before that: a prefix
/// cache shortens those steps, and the held response is released that much earlier.
fn with_held_stalls(
    input: &Input,
    e: &Repeats,
    own: &BTreeMap<usize, u64>,
) -> BTreeMap<usize, u64> {
    let reqs = &input.requests[..];
    let index: HashMap<usize, usize> = reqs.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
    let mut out = own.clone();
    for (j, r) in reqs.iter().enumerate() {
        let (Some(g), Some(engine), Some(client)) = (
            input.gpu(j),
            r.point(PointKind::EngineWrite),
            crate::diagnose::ttft_point(r),
        ) else {
            continue;
        };
        let Some(&first_read) = client.token_ns.first() else {
            continue;
        };
        if client.kind == PointKind::EngineWrite {
            continue; // read at the engine: stalls are gaps, not TTFT
        }
        // Engine tokens written before the client read its first: the held ones.
        let held = engine.token_ns.partition_point(|&t| t < first_read);
        let freed: f64 = g
            .stalled_by
            .iter()
            .filter(|s| s.token < held)
            .map(|s| {
                let share = s
                    .requests
                    .iter()
                    .filter_map(|id| index.get(id))
                    .filter(|&&i| e.sharing.contains(&i))
                    .filter_map(|&i| e.fractions[i])
                    .fold(0.0, f64::max);
                s.step_ns as f64 * share
            })
            .sum();
        if freed >= 1.0 {
            *out.entry(j).or_default() += freed as u64;
        }
    }
    out
}

/// Requests repeating an earlier prompt prefix whose prefill costs as if it did not.
struct Repeats {
    /// Per request: the share of its prompt an earlier request sent (None: not printed).
    fractions: Vec<Option<f64>>,
    /// Requests repeating at least a quarter of their prompt, with a prefill cost.
    sharing: Vec<usize>,
    /// Their prefill cost, and per prompt KiB; the same per KiB for new prompts.
    cost: Vec<u64>,
    sharing_kib: Vec<u64>,
    fresh_kib: Vec<u64>,
    /// Each sharing request's shared share, in permille.
    shared: Vec<u64>,
}

impl Repeats {
    /// None unless enough requests repeat a prefix, their prefill is no cheaper per KiB
    /// than new prompts' (or long outright), and prefill matters to their TTFT.
    fn gather(input: &Input) -> Option<Repeats> {
        let reqs = &input.requests[..];
        let fractions = shared_fractions(reqs);
        let printed = fractions.iter().filter(|f| f.is_some()).count();
        let per_kib = |i: usize| -> Option<u64> {
            let kib = reqs[i].body_bytes? as f64 / 1024.0;
            Some((prefill_cost(input, i)? as f64 / kib.max(1.0)) as u64)
        };
        let (mut sharing, mut fresh) = (Vec::new(), Vec::new());
        for (i, f) in fractions.iter().enumerate() {
            match f {
                Some(f) if *f >= 0.25 && prefill_cost(input, i).is_some() => sharing.push(i),
                Some(_) if prefill_cost(input, i).is_some() => fresh.push(i),
                _ => {}
            }
        }
        if sharing.len() < MIN_EVIDENCE || sharing.len() * 10 < printed * 3 {
            return None;
        }
        let cost: Vec<u64> = sharing
            .iter()
            .filter_map(|&i| prefill_cost(input, i))
            .collect();
        let sharing_kib: Vec<u64> = sharing.iter().filter_map(|&i| per_kib(i)).collect();
        let fresh_kib: Vec<u64> = fresh.iter().filter_map(|&i| per_kib(i)).collect();
        let uncached = if fresh_kib.is_empty() {
            median(&cost) >= 50_000_000
        } else {
            median(&sharing_kib) * 2 >= median(&fresh_kib)
        };
        // Prefill must matter: 20 ms, and a third of the engine's wait for the first token
        // (its own prefill and the others' it queued behind, when GPU steps were probed; the
        // rest of TTFT, such as a proxy's hold, is other rules' business).
        let prefill_share: Vec<u64> = sharing
            .iter()
            .filter_map(|&i| prefill_share_permille(input, reqs[i]))
            .collect();
        let matters = if prefill_share.is_empty() {
            let waits: Vec<u64> = sharing
                .iter()
                .filter_map(|&i| reqs[i].stages.upstream_wait_ns)
                .collect();
            median(&cost) * 3 >= median(&waits)
        } else {
            median(&prefill_share) * 3 >= 1000
        };
        if !uncached || median(&cost) < 20_000_000 || !matters {
            return None;
        }
        let shared = sharing
            .iter()
            .map(|&i| (fractions[i].unwrap_or(0.0) * 1000.0) as u64)
            .collect();
        Some(Repeats {
            fractions,
            sharing,
            cost,
            sharing_kib,
            fresh_kib,
            shared,
        })
    }

    fn figures(&self) -> Vec<Figure> {
        let mut figures = vec![
            fig(
                "requests repeating an earlier prompt prefix",
                self.sharing.len() as f64,
                "requests",
            ),
            fig(
                "shared share of the prompt p50",
                median(&self.shared) as f64 / 10.0,
                "%",
            ),
            fig("prefill p50", ms(median(&self.cost)), "ms"),
            fig(
                "prefill per prompt KiB p50",
                ms(median(&self.sharing_kib)),
                "ms",
            ),
        ];
        if !self.fresh_kib.is_empty() {
            figures.push(fig(
                "prefill per KiB of new prompts p50",
                ms(median(&self.fresh_kib)),
                "ms",
            ));
        }
        figures
    }

    fn finding(&self) -> String {
        format!(
            "{} requests start with a prompt prefix an earlier request sent ({:.0}% of the prompt, \
             p50), yet prefill takes {} ms (p50){}: the engine recomputes the shared prefix",
            self.sharing.len(),
            median(&self.shared) as f64 / 10.0,
            ms(median(&self.cost)),
            if self.fresh_kib.is_empty() {
                String::new()
            } else {
                format!(
                    ", {} ms per KiB vs {} ms for new prompts",
                    ms(median(&self.sharing_kib)),
                    ms(median(&self.fresh_kib))
                )
            }
        )
    }
}

/// The median decode step per engine process.
fn decode_step_medians(input: &Input) -> HashMap<u32, u64> {
    let mut by_pid: HashMap<u32, Vec<u64>> = HashMap::new();
    for s in input.steps.iter().filter(|s| s.kind == StepKind::Decode) {
        by_pid.entry(s.pid).or_default().push(s.end_ns - s.start_ns);
    }
    by_pid.into_iter().map(|(p, v)| (p, median(&v))).collect()
}

/// Rule 5: decode gaps that span another request's whole-prompt prefill step (one many
/// decode steps long). Removes each such gap down to one decode step.
pub(super) fn prefill_stalls_decode(input: &Input, prefix_cache_fixed: bool) -> Option<Finding> {
    let reqs = &input.requests[..];
    let decode = decode_step_medians(input);
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    let (mut gaps, mut steps, mut culprits) = (Vec::new(), Vec::new(), BTreeSet::new());
    for (i, r) in reqs.iter().enumerate() {
        let (Some(g), Some(engine)) = (input.gpu(i), r.point(PointKind::EngineWrite)) else {
            continue;
        };
        let step = decode.get(&engine.pid).copied().unwrap_or(0);
        for s in &g.stalled_by {
            if s.step_kind != StepKind::Prefill || step == 0 || s.step_ns < STALL_FACTOR * step {
                continue;
            }
            // The same token's gap where the request's TTFT is read (the client, if seen)
            // loses the stall. Not capped by that gap as seen now: a proxy that batches
            // tokens hides the stall in its bursts until it is fixed too (rule 2), and the
            // joint saving applies both.
            let removed = s.gap_ns.saturating_sub(step);
            itl.insert((i, s.token - 1), removed as i64);
            *weights.entry(i).or_insert(0) += s.gap_ns;
            gaps.push(s.gap_ns);
            steps.push(s.step_ns);
            culprits.extend(s.requests.iter().copied());
        }
    }
    if gaps.len() < MIN_EVIDENCE {
        return None;
    }
    // The fix's cost: a prompt prefilled in chunks of about a decode step's work takes
    // a step per chunk, each carrying the decodes too, so every long prompt's own TTFT
    // (whether or not others were decoding) grows by about its prefill time, less the
    // one step it had anyway.
    // When rule 4 fires, the prompt's shared prefix would be cached too (as rule 6).
    let shared = if prefix_cache_fixed {
        shared_fractions(reqs)
    } else {
        vec![None; reqs.len()]
    };
    let mut ttft_added = BTreeMap::new();
    for (i, r) in reqs.iter().enumerate() {
        let (Some(g), Some(engine)) = (input.gpu(i), r.point(PointKind::EngineWrite)) else {
            continue;
        };
        let step = decode.get(&engine.pid).copied().unwrap_or(0);
        let prefill = (g.prefill_ns as f64 * (1.0 - shared[i].unwrap_or(0.0))) as u64;
        if step > 0 && prefill >= STALL_FACTOR * step {
            ttft_added.insert(i, prefill - step);
        }
    }
    let step = median(&decode.values().copied().collect::<Vec<_>>());
    let finding = format!(
        "{} decode gaps in {} streams span another request's prefill step ({} ms p50, \
         {:.0} decode steps of {} ms): {} prompts stalled every running stream while they prefilled",
        gaps.len(),
        weights.len(),
        ms(median(&steps)),
        median(&steps) as f64 / step.max(1) as f64,
        ms(step),
        culprits.len()
    );
    let mut d = Draft {
        rule: 5,
        requests: reqs,
        weights: &weights,
        finding,
        figures: vec![
            fig("stalled decode gaps", gaps.len() as f64, "gaps"),
            fig("stalled gap p50", ms(median(&gaps)), "ms"),
            fig("stalling prefill step p50", ms(median(&steps)), "ms"),
            fig("decode step p50", ms(step), "ms"),
            fig(
                "prompts that stalled others",
                culprits.len() as f64,
                "requests",
            ),
        ],
        basis: "each stalled gap would last one decode step (the prefill runs in chunks beside \
                decodes); each long prompt's own TTFT grows by its prefill time (one decode step \
                per chunk: a step budget whose chunk costs about what the step's decodes do)",
        fix: vec![
            fix(
                "vLLM",
                &[
                    "--enable-chunked-prefill --max-num-batched-tokens 2048",
                    "# size the budget so a step's prefill chunk costs about what its decodes do:",
                    "# smaller stretches each long prompt over many steps, larger stalls decodes again",
                ],
            ),
            fix("SGLang", &["--chunked-prefill-size 2048"]),
        ],
    }
    .diagnosis();
    let listed = d.evidence.request_ids.clone();
    d.evidence.request_ids.extend(
        culprits
            .iter()
            .copied()
            .filter(|c| !listed.contains(c))
            .take(5),
    );
    Some(Finding {
        diagnosis: d,
        ttft: BTreeMap::new(),
        ttft_added,
        itl,
        instead: None,
    })
}

/// Rule 6: requests wait for their first step while the engine's steps run back to
/// back. Queueing a prefix cache would remove (rule 4) is not counted here.
pub(super) fn queueing(input: &Input, prefix_removed: &BTreeMap<usize, u64>) -> Option<Finding> {
    let reqs = &input.requests[..];
    // Each engine's steps by start, with the latest end so far: a request's wait reads
    // only the steps that can overlap it (was every step of its engine, per request:
    // 15 M step reads a making of top's findings over a full window).
    let mut by_pid: HashMap<u32, Vec<(u64, u64, u64)>> = HashMap::new();
    for s in input.steps {
        by_pid
            .entry(s.pid)
            .or_default()
            .push((s.start_ns, s.end_ns, 0));
    }
    for spans in by_pid.values_mut() {
        spans.sort_unstable();
        let mut latest = 0;
        for span in spans.iter_mut() {
            latest = latest.max(span.1);
            span.2 = latest;
        }
    }
    let busy = |pid: u32, from: u64, to: u64| -> f64 {
        let Some(spans) = by_pid.get(&pid) else {
            return 0.0;
        };
        // Steps before `first` end by `from` (so do all before them); from `last` on
        // they start at `to` or later: neither covers any of the wait.
        let first = spans.partition_point(|s| s.2 <= from);
        let last = spans.partition_point(|s| s.0 < to);
        let covered: u64 = spans[first..last.max(first)]
            .iter()
            .map(|&(a, b, _)| b.min(to).saturating_sub(a.max(from)))
            .sum();
        covered as f64 / (to - from).max(1) as f64
    };
    let mut ttft = BTreeMap::new();
    let mut queues = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let (Some(q), Some(arrived), Some(engine)) = (
            input.gpu(i).and_then(|g| g.queue_ns),
            r.engine_received_ns,
            r.point(PointKind::EngineWrite),
        ) else {
            continue;
        };
        let left = q.saturating_sub(prefix_removed.get(&i).copied().unwrap_or(0));
        if left >= QUEUE_NS && busy(engine.pid, arrived, arrived + q) >= 0.9 {
            ttft.insert(i, left);
            queues.push(q);
        }
    }
    // A quarter of the requests: fewer is a burst of arrivals (clients that start
    // together), which more capacity would not shorten by much (the queued-fixed
    // scenario: 8 prompts arriving at once on an engine with room for all of them).
    if ttft.len() < MIN_EVIDENCE || ttft.len() * 4 < reqs.len() {
        return None;
    }
    let finding = format!(
        "{} requests waited {} ms (p50) for their first GPU step while the engine ran steps \
         back to back",
        ttft.len(),
        ms(median(&queues))
    );
    let d = Draft {
        rule: 6,
        requests: reqs,
        weights: &ttft,
        finding,
        figures: vec![
            fig("requests queued", ttft.len() as f64, "requests"),
            fig("queue p50", ms(median(&queues)), "ms"),
        ],
        basis:
            "each queued request would start at once (enough capacity); queueing behind prefills \
         a prefix cache would shorten is left to that rule",
        fix: vec![
            fix(
                "vLLM",
                &[
                    "--max-num-seqs (more sequences per step, if memory allows)",
                    "more replicas behind the proxy",
                ],
            ),
            fix(
                "SGLang",
                &[
                    "--max-running-requests",
                    "--dp-size (data-parallel replicas)",
                ],
            ),
        ],
    }
    .diagnosis();
    Some(Finding {
        diagnosis: d,
        ttft,
        ttft_added: BTreeMap::new(),
        itl: BTreeMap::new(),
        instead: None,
    })
}
