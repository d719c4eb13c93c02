//! GPU steps joined to requests, by time and engine process: libcuda calls
//! carry no request ids, so a request's steps are those its engine ran while
//! the request was waiting for its first token (prefill) or streaming (decode).
//! A decode gap that spans a step with prefill work is blamed on the requests
//! whose prefill was running then.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::rc::Rc;

use serde::Serialize;

use super::{PointKind, Request};
use crate::gpu::{GpuStep, StepKind};
use crate::ingest::fast_hash::{FastMap, FastSet};

#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuShare {
    /// Arrival at the engine -> the first step that prefilled it.
    pub queue_ns: Option<u64>,
    /// Steps that prefilled it (see `attribute`), and their time.
    pub prefill_steps: u32,
    pub prefill_ns: u64,
    /// Steps between its first and last token.
    pub decode_steps: u32,
    /// GPU-timed (the steps have CUPTI device time): from the device start of its first
    /// prefill step to the device end of its last, as `prefill_ns` is on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_gpu_ns: Option<u64>,
    /// GPU-timed: the device's busy time in its decode steps (shared with the batch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_gpu_ns: Option<u64>,
    /// Its inter-token gaps at the engine that a step with prefill work stalled.
    pub stalled_by: Vec<Stall>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stall {
    /// The gap between two of its tokens at the engine: it ends at this token (index).
    pub token: usize,
    pub gap_ns: u64,
    /// The kind of the longest step with prefill work inside the gap.
    pub step_kind: StepKind,
    /// The time of the steps with prefill work inside the gap (most gaps hold one).
    pub step_ns: u64,
    /// Requests (report ids) whose prefill ran in those steps.
    pub requests: Vec<usize>,
}

/// One engine's view of a request: arrival, first and last token written.
struct Window<'r> {
    pid: u32,
    arrived: u64,
    first: u64,
    tokens: &'r [u64],
}

fn window(r: &Request) -> Option<Window<'_>> {
    let engine = r.point(PointKind::EngineWrite)?;
    Some(Window {
        pid: engine.pid,
        arrived: r.engine_received_ns?,
        first: *engine.token_ns.first()?,
        tokens: &engine.token_ns,
    })
}

/// Graph-only steps are decode by their launches, but engines that capture mixed batches
/// in CUDA graphs (vLLM V1's full graphs) prefill inside them too. A request whose wait
/// for its first token held no step with kernel launches had its prefill in the step it
/// `ended_in`: if that step began after the request arrived, it did prefill work (mixed
/// when another request was streaming across it, else prefill). Engines that prefill with
/// kernels are left as they are.
fn reclassify(
    windows: &[Option<Window<'_>>],
    ended_in: &[Option<usize>],
    by_pid: &FastMap<u32, Vec<usize>>,
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

/// Greatest common divisor, for the size of one row of the token copy.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// What the steps tell of each engine: the size of one copied row (the gcd of all
/// copies), whether it mixes prefill and decode in a step (chunked prefill), and
/// whether its copies count every scheduled request.
#[derive(Default)]
struct Habits {
    row: FastMap<u32, u64>,
    chunking: FastSet<u32>,
    /// Engines whose copies count every scheduled request: some step copied more rows
    /// than it sampled tokens (its decodes and the prompts whose prefill ended in it);
    /// engines that copy just the sampled tokens (vLLM V0) say nothing about prompts in
    /// prefill.
    counted: FastSet<u32>,
}

impl Habits {
    fn learn(steps: &[GpuStep], decoders: &[u64], ending: &FastMap<usize, Vec<usize>>) -> Habits {
        let mut h = Habits::default();
        for s in steps {
            let r = h.row.entry(s.pid).or_default();
            *r = gcd(*r, s.copied_bytes);
            if s.kind == StepKind::Mixed {
                h.chunking.insert(s.pid);
            }
        }
        for (k, s) in steps.iter().enumerate() {
            let r = h.row.get(&s.pid).copied().unwrap_or(0);
            let sampled = decoders[k] + ending.get(&k).map_or(0, |v| v.len() as u64);
            if r > 0 && s.copied_bytes / r > sampled {
                h.counted.insert(s.pid);
            }
        }
        h
    }

    /// Rows step `s` copied, when its engine's copies count every scheduled request.
    fn rows(&self, s: &GpuStep) -> Option<u64> {
        self.row
            .get(&s.pid)
            .filter(|&&r| r > 0 && self.counted.contains(&s.pid))
            .map(|r| s.copied_bytes / r)
    }
}

/// Per step, how many requests of its engine were decoding in it (from each request's
/// prefill end to its last token, summed as a difference array per engine).
fn decoders_per_step(
    windows: &[Option<Window<'_>>],
    ended_in: &[Option<usize>],
    last_in: &[Option<usize>],
    steps: &[GpuStep],
) -> Vec<u64> {
    let n = steps.len();
    let mut decoding: FastMap<u32, Vec<i64>> = FastMap::default();
    for (i, w) in windows.iter().enumerate() {
        let (Some(w), Some(e)) = (w, ended_in[i]) else {
            continue;
        };
        if let Some(l) = last_in[i].filter(|&l| l > e) {
            let d = decoding.entry(w.pid).or_insert_with(|| vec![0; n + 1]);
            d[e + 1] += 1;
            d[l + 1] -= 1;
        }
    }
    let mut level: FastMap<u32, i64> = FastMap::default();
    steps
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let l = level.entry(s.pid).or_default();
            *l += decoding.get(&s.pid).map_or(0, |d| d[k]);
            (*l).max(0) as u64
        })
        .collect()
}

/// The step each request's prefill began in. Its prefill ended in the engine's last step
/// that ended before its first token was written (the write lags the step's end, and may
/// land after the next step started); `last_in` is the step that sampled its last token.
/// Where a prefill began is the engine's choice and the GPU calls carry no request ids, so
/// prompts are taken to start in the order their prefills end (first come, first served;
/// each no earlier than its arrival), and a step
/// starts the prompts whose prefill ended in it. Beyond that:
/// - Engines that copy one sampled token per scheduled request (vLLM V1; the row size is
///   the greatest common divisor of the engine's copies; seen as a step that copied more
///   rows than it sampled tokens) say how many requests each step ran. Less those decoding (first token sampled earlier, last not yet) and those already
///   in prefill, the rest are prompts that started in it. This assumes prompts already in
///   prefill get a chunk in every step, as vLLM V1 and SGLang schedule running requests
///   first; an engine that lets new prompts overtake long ones (the lab's long-prefill
///   threshold) makes their start late, and their queue time grows by what prefill loses.
/// - Without such copies: an engine that prefills whole prompts (none of its steps mixes
///   prefill with decode) starts the oldest waiting prompt in each step with prefill work;
///   a chunking engine starts one in a step in which every prompt already in prefill ends.
fn prefill_starts(
    windows: &[Option<Window<'_>>],
    ended_in: &[Option<usize>],
    last_in: &[Option<usize>],
    steps: &[GpuStep],
) -> Vec<Option<usize>> {
    let mut started: Vec<Option<usize>> = vec![None; windows.len()];
    // The requests whose prefill ended in each step, and per engine the requests yet to
    // start in the order their prefills end (first come, first served: arrivals
    // microseconds apart may reach the scheduler in either order).
    let mut ending: FastMap<usize, Vec<usize>> = FastMap::default();
    let mut in_order: Vec<(usize, u64, usize)> = Vec::new();
    for (i, w) in windows.iter().enumerate() {
        let (Some(w), Some(e)) = (w, ended_in[i]) else {
            continue;
        };
        ending.entry(e).or_default().push(i);
        in_order.push((e, w.arrived, i));
    }
    in_order.sort_unstable();
    let mut queues: FastMap<u32, VecDeque<usize>> = FastMap::default();
    for (_, _, i) in in_order {
        let pid = windows[i].as_ref().map_or(0, |w| w.pid);
        queues.entry(pid).or_default().push_back(i);
    }
    let decoders = decoders_per_step(windows, ended_in, last_in, steps);
    let habits = Habits::learn(steps, &decoders, &ending);
    // Per engine, the steps in which the prompts in prefill end.
    let mut active: FastMap<u32, BinaryHeap<Reverse<usize>>> = FastMap::default();
    for (k, s) in steps.iter().enumerate() {
        let active = active.entry(s.pid).or_default();
        while active.peek().is_some_and(|Reverse(e)| *e < k) {
            active.pop();
        }
        let rows = habits.rows(s);
        let mut any = false;
        for &i in ending.get(&k).into_iter().flatten() {
            if started[i].is_none() && (rows.is_some() || s.kind != StepKind::Decode) {
                started[i] = Some(k);
                active.push(Reverse(k));
                any = true;
            }
        }
        let Some(queue) = queues.get_mut(&s.pid) else {
            continue;
        };
        // Drop those that started, or whose prefill ended in a step without prefill work.
        // The queue is in the order prefills end: those are at its front, but for ones
        // started in this step behind one that was not (then the whole queue is looked
        // at; a pass over it per step was O(steps x requests) over top's window).
        let gone = |i: usize| started[i].is_some() || ended_in[i].is_none_or(|e| e < k);
        while queue.front().is_some_and(|&i| gone(i)) {
            queue.pop_front();
        }
        if queue
            .iter()
            .take_while(|&&i| ended_in[i] == Some(k))
            .any(|&i| gone(i))
        {
            queue.retain(|&i| !gone(i));
        }
        let starts = match rows {
            Some(rows) => rows.saturating_sub(decoders[k] + active.len() as u64),
            None if s.kind == StepKind::Decode => 0,
            None if habits.chunking.contains(&s.pid) => {
                u64::from(active.iter().all(|Reverse(e)| *e <= k))
            }
            None => u64::from(!any),
        };
        for _ in 0..starts {
            let Some(at) = queue
                .iter()
                .position(|&i| windows[i].as_ref().is_some_and(|w| w.arrived <= s.start_ns))
            else {
                break;
            };
            let i = queue.remove(at).expect("found");
            started[i] = Some(k);
            if let Some(e) = ended_in[i] {
                active.push(Reverse(e));
            }
        }
    }
    started
}

/// Joins steps to requests (see the module doc), setting each request's `gpu`; first
/// refines step kinds by who was waiting (see `reclassify`).
pub fn attribute(requests: &mut [Request], steps: &mut [GpuStep]) {
    let shares = shares(&requests.iter().collect::<Vec<_>>(), steps);
    for (r, share) in requests.iter_mut().zip(shares) {
        if share.is_some() {
            r.gpu = share;
        }
    }
}

/// `attribute`'s shares, by request index, for requests held where they cannot be
/// changed (`top` shares its window's with its screen; `diagnose::Input::shares`).
pub fn shares(requests: &[&Request], steps: &mut [GpuStep]) -> Vec<Option<GpuShare>> {
    if steps.is_empty() {
        return vec![None; requests.len()];
    }
    let windows: Vec<Option<Window>> = requests.iter().map(|r| window(r)).collect();
    let mut by_pid: FastMap<u32, Vec<usize>> = FastMap::default();
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
    let last_in: Vec<Option<usize>> = windows
        .iter()
        .map(|w| {
            w.as_ref()
                .and_then(|w| last_step_before(w.pid, *w.tokens.last()?))
        })
        .collect();
    reclassify(&windows, &ended_in, &by_pid, steps);
    let steps: &[GpuStep] = steps;
    let started = prefill_starts(&windows, &ended_in, &last_in, steps);
    let ids: Vec<usize> = requests.iter().map(|r| r.id).collect();
    // Each engine's steps, listed once (not once per request: 1.7 M pointers for the
    // 1,280 requests and 1,304 steps of a 20 s bench, far more over top's window).
    let engine_steps: FastMap<u32, Vec<&GpuStep>> = by_pid
        .iter()
        .map(|(&pid, ks)| (pid, ks.iter().map(|&k| &steps[k]).collect()))
        .collect();
    let joined = Joined {
        windows: &windows,
        engine_steps: &engine_steps,
        steps,
        started: &started,
        ended_in: &ended_in,
        waiting: Default::default(),
    };
    windows
        .iter()
        .enumerate()
        .map(|(i, w)| Some(joined.share(i, w.as_ref()?, &ids)))
        .collect()
}

/// Requests' windows and the engine steps, with each request's first and last prefill
/// step found: what one request's share is read from.
struct Joined<'a> {
    windows: &'a [Option<Window<'a>>],
    /// Each engine's steps in start order.
    engine_steps: &'a FastMap<u32, Vec<&'a GpuStep>>,
    steps: &'a [GpuStep],
    started: &'a [Option<usize>],
    ended_in: &'a [Option<usize>],
    /// `waiting` per (engine, step start, step end), what it depends on: a prefill step
    /// falls in the gaps of every request decoding beside it, each of which asked.
    waiting: RefCell<FastMap<StepKey, Rc<[usize]>>>,
}

/// A step as `Joined::waiting` sees it: engine pid, start, end.
type StepKey = (u32, u64, u64);

impl Joined<'_> {
    /// Request `i`'s queue, prefill and decode steps, and the gaps other prompts stalled.
    fn share(&self, i: usize, w: &Window<'_>, ids: &[usize]) -> GpuShare {
        let steps = self.steps;
        // Its engine's steps, in start order (steps are sorted by start).
        let mine: &[&GpuStep] = self.engine_steps.get(&w.pid).map_or(&[], Vec::as_slice);
        let from = |t: u64| mine.partition_point(|s| s.start_ns < t);
        let mut share = GpuShare::default();
        if let (Some(first), Some(last)) = (self.started[i], self.ended_in[i]) {
            let (a, b) = (&steps[first], &steps[last]);
            share.queue_ns = Some(a.start_ns.saturating_sub(w.arrived));
            share.prefill_ns = b.end_ns.saturating_sub(a.start_ns);
            if let (Some(da), Some(db)) = (a.device, b.device) {
                share.prefill_gpu_ns = Some(db.end_ns.saturating_sub(da.start_ns));
            }
            share.prefill_steps = mine[from(a.start_ns)..]
                .iter()
                .take_while(|s| s.start_ns <= b.start_ns)
                .count() as u32;
        }
        let last = *w.tokens.last().unwrap_or(&w.first);
        // Counted and summed in one walk, not gathered (a vector per request of `top`'s
        // window at every making).
        let (mut decode_steps, mut timed, mut busy_ns) = (0u32, true, 0u64);
        for s in mine[from(w.first)..]
            .iter()
            .take_while(|s| s.start_ns <= last)
            .filter(|s| s.end_ns <= last)
        {
            decode_steps += 1;
            match s.device {
                Some(d) => busy_ns += d.busy_ns,
                None => timed = false,
            }
        }
        share.decode_steps = decode_steps;
        if decode_steps > 0 && timed {
            share.decode_gpu_ns = Some(busy_ns);
        }
        share.stalled_by = self.stalls(i, w, mine, ids);
        share
    }

    /// The token gaps of request `i` that prefill work of requests waiting for their
    /// first token ended in.
    fn stalls(&self, i: usize, w: &Window<'_>, mine: &[&GpuStep], ids: &[usize]) -> Vec<Stall> {
        let mut stalls = Vec::new();
        // The first step that ends after the gap's start: an engine's steps end in the
        // order they start and a stream's tokens come in order, so it only moves on (a
        // token out of order looks it up again).
        let first = w.tokens.first().copied().unwrap_or(0);
        let (mut after_a, mut last_a) = (mine.partition_point(|s| s.end_ns <= first), first);
        for (k, pair) in w.tokens.windows(2).enumerate() {
            let (a, b) = (pair[0], pair[1]);
            // Every step with prefill work that ended inside the gap: a long prompt's step
            // may follow a short one's in the same gap, and both stalled it. By its end, not
            // its start: the engine may start the next step before token `a` is written.
            if a < last_a {
                after_a = mine.partition_point(|s| s.end_ns <= a);
            }
            last_a = a;
            while mine.get(after_a).is_some_and(|s| s.end_ns <= a) {
                after_a += 1;
            }
            let ended = &mine[after_a..];
            let inside = ended.iter().take_while(|s| s.end_ns <= b).count();
            let ended = &ended[..inside];
            let within = || ended.iter().filter(|s| s.kind != StepKind::Decode);
            let Some(longest) = within().max_by_key(|s| s.end_ns - s.start_ns) else {
                continue;
            };
            let mut culprits: Vec<usize> = Vec::new();
            for s in within() {
                culprits.extend(self.waiting(w.pid, s).iter().filter(|&&j| j != i));
            }
            culprits.sort_unstable();
            culprits.dedup();
            if !culprits.is_empty() {
                stalls.push(Stall {
                    token: k + 1,
                    gap_ns: b - a,
                    step_kind: longest.kind,
                    step_ns: within().map(|s| s.end_ns - s.start_ns).sum(),
                    requests: culprits.iter().map(|&j| ids[j]).collect(),
                });
            }
        }
        stalls
    }

    /// Requests of engine `pid` that had arrived by step `s` and got their first token
    /// after it.
    fn waiting(&self, pid: u32, s: &GpuStep) -> Rc<[usize]> {
        let key = (pid, s.start_ns, s.end_ns);
        if let Some(known) = self.waiting.borrow().get(&key) {
            return known.clone();
        }
        let found: Rc<[usize]> = self
            .windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                w.as_ref()
                    .filter(|w| w.pid == pid && w.arrived <= s.start_ns && w.first >= s.end_ns)
                    .map(|_| i)
            })
            .collect();
        self.waiting.borrow_mut().insert(key, found.clone());
        found
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
                copied_bytes: 0,
                device: None,
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
    fn token_copies_tell_when_a_chunked_prompt_started() {
        // A chunking engine that copies one token row (4 bytes) per scheduled request.
        // A and B arrive together; A's prompt fills steps 0-2 and B's first chunk waits
        // for step 3 (A's last chunk used the whole budget), then B ends in step 4.
        let rows = [1, 1, 1, 2, 2, 2];
        let mut steps = graph_steps(6);
        for (s, n) in steps.iter_mut().zip(rows) {
            s.kind = if n == 1 {
                StepKind::Prefill
            } else {
                StepKind::Mixed
            };
            s.kernel_launches = 1;
            s.copied_bytes = 4 * n;
        }
        let after = |k: u64| (k + 1) * 20 * MS + MS;
        let mut reqs = vec![
            request(0, 0, (2..6).map(after).collect()),
            request(1, 10_000, (4..6).map(after).collect()),
        ];
        attribute(&mut reqs, &mut steps.clone());
        let g = |i: usize| reqs[i].gpu.clone().unwrap();
        assert_eq!((g(0).queue_ns, g(0).prefill_steps), (Some(100_000), 3));
        assert_eq!(g(0).prefill_ns, 60 * MS - 100_000, "steps 0-2");
        assert_eq!(g(1).prefill_steps, 2, "steps 3-4");
        assert_eq!(g(1).queue_ns, Some(60 * MS + 100_000 - 10_000));
        // Copies of only the sampled tokens (vLLM V0: none while A is in prefill, then A's
        // and B's) say nothing of prompts in prefill: B is taken to start as soon as A's
        // prefill ends, as without copies at all.
        for (s, n) in steps.iter_mut().zip([0, 0, 1, 1, 2, 2]) {
            s.copied_bytes = 4 * n;
        }
        attribute(&mut reqs, &mut steps.clone());
        assert_eq!(reqs[1].gpu.as_ref().unwrap().prefill_steps, 3, "steps 2-4");
        for s in &mut steps {
            s.copied_bytes = 0;
        }
        attribute(&mut reqs, &mut steps);
        let b = reqs[1].gpu.as_ref().unwrap();
        assert_eq!(b.prefill_steps, 3, "steps 2-4");
    }

    #[test]
    fn a_gap_over_two_prefill_steps_names_both_prompts() {
        // Steps 2 and 3 prefill B and then L (L arrived after step 2 began); request 0's
        // token gap spans both. Tokens are written 50 us after their step ends.
        let mut steps = graph_steps(6);
        for k in [2, 3] {
            steps[k].kind = StepKind::Prefill;
            steps[k].kernel_launches = 1;
            steps[k].graph_launches = 0;
        }
        let after = |k: u64| (k + 1) * 20 * MS + 50_000;
        let mut reqs = vec![
            request(0, 0, [0, 1, 3, 4].into_iter().map(after).collect()),
            request(1, 30 * MS, vec![after(2), after(4)]),
            request(2, 50 * MS, vec![after(3), after(4)]),
        ];
        attribute(&mut reqs, &mut steps);
        let stalls = &reqs[0].gpu.as_ref().unwrap().stalled_by;
        assert_eq!(stalls.len(), 1, "{stalls:?}");
        assert_eq!(
            stalls[0].requests,
            vec![1, 2],
            "both prompts stalled the gap"
        );
        assert_eq!(
            stalls[0].step_ns,
            2 * (20 * MS - 100_000),
            "both steps' time"
        );
        assert!(stalls[0].gap_ns >= stalls[0].step_ns);
    }

    #[test]
    fn a_prefill_step_that_began_before_the_gaps_first_token_was_written_still_stalls_it() {
        // The engine starts L's prefill step (2) at 40.1 ms, before request 0's token from
        // step 1 is written at 40.15 ms; request 0's next token follows step 3.
        let mut steps = graph_steps(5);
        steps[2].kind = StepKind::Prefill;
        steps[2].kernel_launches = 1;
        steps[2].graph_launches = 0;
        let mut reqs = vec![
            request(
                0,
                0,
                vec![20 * MS + 150_000, 40 * MS + 150_000, 80 * MS + 150_000],
            ),
            request(1, 30 * MS, vec![60 * MS + 150_000, 80 * MS + 150_000]),
        ];
        attribute(&mut reqs, &mut steps);
        let stalls = &reqs[0].gpu.as_ref().unwrap().stalled_by;
        assert_eq!(stalls.len(), 1, "{stalls:?}");
        assert_eq!((stalls[0].token, stalls[0].requests.clone()), (2, vec![1]));
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
