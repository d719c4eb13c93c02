//! Continuous batching, as vLLM schedules it: which sequences prefill and decode in the
//! next step, what the step costs, and the prefix cache. Pure logic: no clock, no GPU.
use std::collections::{HashSet, VecDeque};

use super::config::EngineConfig;
use super::steplog::{StepKind, StepRequest};

/// A prompt as the scheduler sees it: its length and the chained hashes of its full blocks.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub tokens: usize,
    pub block_hashes: Vec<u64>,
}

impl Prompt {
    /// Tokenises by whitespace (one word = one token) and hashes each full block of
    /// `block_size` words chained to the previous block, so equal hashes mean equal prefixes.
    pub fn from_text(text: &str, block_size: usize) -> Prompt {
        let block_size = block_size.max(1);
        let mut tokens = 0;
        let mut block_hashes = Vec::new();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for word in text.split_whitespace() {
            for b in word.as_bytes().iter().chain(std::iter::once(&b' ')) {
                h ^= *b as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            tokens += 1;
            if tokens % block_size == 0 {
                block_hashes.push(h);
            }
        }
        // An empty prompt still has the start-of-sequence token to prefill.
        Prompt {
            tokens: tokens.max(1),
            block_hashes,
        }
    }
}

/// A request inside the scheduler.
#[derive(Debug)]
pub struct Sequence {
    pub id: u64,
    pub prompt: Prompt,
    pub max_tokens: usize,
    /// Prompt tokens done, prefix-cache hits included.
    pub computed: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached: usize,
    pub generated: usize,
    /// Tokens generated before the last preemption: recomputed with the prompt when the
    /// sequence runs again (vLLM V1 preempts by recomputation).
    pub resumed: usize,
    admitted: bool,
}

impl Sequence {
    pub fn new(id: u64, prompt: Prompt, max_tokens: usize) -> Sequence {
        Sequence {
            id,
            prompt,
            max_tokens: max_tokens.max(1),
            computed: 0,
            cached: 0,
            generated: 0,
            resumed: 0,
            admitted: false,
        }
    }

    /// Tokens to prefill: the prompt, and after a preemption what it had generated.
    fn prefill_target(&self) -> usize {
        self.prompt.tokens + self.resumed
    }

    fn prefill_left(&self) -> usize {
        self.prefill_target().saturating_sub(self.computed)
    }

    /// KV-cache tokens it holds: what was prefilled, and each token decoded since.
    fn kv_tokens(&self) -> usize {
        self.computed + self.generated.saturating_sub(self.resumed)
    }

    fn prefilling(&self) -> bool {
        self.prefill_left() > 0
    }
}

/// What the next step will compute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// (request id, prompt tokens computed this step, prefill finishes this step)
    pub prefill: Vec<(u64, usize, bool)>,
    /// Requests that decode one token this step.
    pub decode: Vec<u64>,
}

impl StepPlan {
    pub fn kind(&self) -> StepKind {
        match (self.prefill.is_empty(), self.decode.is_empty()) {
            (false, true) => StepKind::Prefill,
            (true, _) => StepKind::Decode,
            (false, false) => StepKind::Mixed,
        }
    }

    pub fn prefill_tokens(&self) -> usize {
        self.prefill.iter().map(|p| p.1).sum()
    }

    /// Simulated GPU time: fixed overhead + per prompt token + per decoding sequence.
    pub fn cost_ns(&self, cfg: &EngineConfig) -> u64 {
        cfg.step_overhead_ns
            + cfg.prefill_token_ns * self.prefill_tokens() as u64
            + cfg.decode_seq_ns * self.decode.len() as u64
    }

    /// Tokens sampled at the end of the step: every decode plus every finished prefill.
    pub fn sampled(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.prefill.iter().filter(|p| p.2).map(|p| p.0).collect();
        ids.extend(&self.decode);
        ids
    }

    pub fn step_requests(&self) -> Vec<StepRequest> {
        let mut out: Vec<StepRequest> = self
            .prefill
            .iter()
            .map(|&(id, tokens, done)| StepRequest {
                request_id: id,
                prefill_tokens: tokens as u32,
                sampled: done,
            })
            .collect();
        out.extend(self.decode.iter().map(|&id| StepRequest {
            request_id: id,
            prefill_tokens: 0,
            sampled: true,
        }));
        out
    }
}

/// Keeps a long-lived engine's prefix cache bounded (about 16M prompt tokens at 16 per block).
const MAX_CACHED_BLOCKS: usize = 1 << 20;

/// Waiting and running sequences plus the prefix cache.
#[derive(Debug)]
pub struct Scheduler {
    cfg: EngineConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    cached_blocks: HashSet<u64>,
    /// Sequences preempted since `take_preempted`.
    preempted: Vec<u64>,
}

impl Scheduler {
    pub fn new(mut cfg: EngineConfig) -> Scheduler {
        // Zero limits would leave work that can never be scheduled (a busy loop).
        cfg.max_running_seqs = cfg.max_running_seqs.max(1);
        cfg.max_batched_tokens = cfg.max_batched_tokens.max(1);
        cfg.block_size = cfg.block_size.max(1);
        Scheduler {
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            cached_blocks: HashSet::new(),
            preempted: Vec::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Drops a request wherever it is (its client went away).
    pub fn abort(&mut self, id: u64) {
        self.waiting.retain(|s| s.id != id);
        self.running.retain(|s| s.id != id);
    }

    /// Looks up the prefix cache when a sequence is first scheduled; at least one prompt
    /// token is always computed, as the last position's logits are needed to sample.
    fn admit(&mut self, seq: &mut Sequence) {
        if seq.admitted {
            return;
        }
        seq.admitted = true;
        if self.cfg.prefix_cache {
            let hits = seq
                .prompt
                .block_hashes
                .iter()
                .take_while(|h| self.cached_blocks.contains(h))
                .count();
            seq.cached = (hits * self.cfg.block_size).min(seq.prompt.tokens.saturating_sub(1));
            seq.computed = seq.cached;
        }
    }

    /// Requests preempted while planning the steps since the last call.
    pub fn take_preempted(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.preempted)
    }

    fn kv_used(&self) -> usize {
        self.running.iter().map(Sequence::kv_tokens).sum()
    }

    /// Room in the KV cache for `tokens` more (always, without a KV budget).
    fn kv_fits(&self, tokens: usize) -> bool {
        self.cfg
            .kv_cache_tokens
            .is_none_or(|budget| self.kv_used() + tokens <= budget)
    }

    /// vLLM V1 when a step's decodes need more KV blocks than are free: the newest
    /// running sequence is preempted (its blocks freed), goes back to the head of the
    /// queue, and later prefills its prompt and generated tokens again.
    fn preempt_over_budget(&mut self) {
        while self.running.len() > 1 && !self.kv_fits(self.running.len()) {
            let mut seq = self.running.pop().expect("more than one running");
            seq.resumed = seq.generated;
            seq.computed = 0;
            seq.cached = 0;
            seq.admitted = false;
            self.preempted.push(seq.id);
            self.waiting.push_front(seq);
        }
    }

    /// Chooses the next step, or None when there is nothing to do.
    pub fn plan_step(&mut self) -> Option<StepPlan> {
        self.preempt_over_budget();
        let plan = if self.cfg.chunked_prefill {
            self.plan_chunked()
        } else {
            self.plan_prefill_first()
        };
        (!plan.prefill.is_empty() || !plan.decode.is_empty()).then_some(plan)
    }

    /// Chunked prefill off (vLLM V0 default): waiting prompts prefill whole in a step of
    /// their own, ahead of decodes, so every running stream stalls for the prefill.
    fn plan_prefill_first(&mut self) -> StepPlan {
        let mut plan = StepPlan {
            prefill: Vec::new(),
            decode: Vec::new(),
        };
        let mut budget = self.cfg.max_batched_tokens;
        while self.running.len() < self.cfg.max_running_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            self.admit(&mut seq);
            let need = seq.prefill_left();
            if (!plan.prefill.is_empty() && need > budget)
                || (!self.running.is_empty() && !self.kv_fits(need + self.running.len()))
            {
                self.waiting.push_front(seq);
                break;
            }
            budget = budget.saturating_sub(need);
            plan.prefill.push((seq.id, need, true));
            self.running.push(seq);
        }
        if plan.prefill.is_empty() {
            plan.decode = self
                .running
                .iter()
                .filter(|s| !s.prefilling())
                .map(|s| s.id)
                .collect();
        }
        plan
    }

    /// Chunked prefill on: decodes first, then the token budget left goes to prefill
    /// chunks (running prefills first, then newly admitted prompts).
    fn plan_chunked(&mut self) -> StepPlan {
        let mut plan = StepPlan {
            prefill: Vec::new(),
            decode: Vec::new(),
        };
        plan.decode = self
            .running
            .iter()
            .filter(|s| !s.prefilling())
            .map(|s| s.id)
            .collect();
        let mut budget = self
            .cfg
            .max_batched_tokens
            .saturating_sub(plan.decode.len());
        let long = self.cfg.long_prefill_token_threshold;
        // Short running prefills first, then new arrivals, then long running prefills.
        for seq in self
            .running
            .iter()
            .filter(|s| s.prefilling() && s.prefill_left() <= long)
        {
            if budget == 0 {
                break;
            }
            let chunk = seq.prefill_left().min(budget);
            budget -= chunk;
            plan.prefill
                .push((seq.id, chunk, chunk == seq.prefill_left()));
        }
        let was_running = self.running.len();
        while budget > 0 && self.running.len() < self.cfg.max_running_seqs {
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            self.admit(&mut seq);
            if !self.running.is_empty() && !self.kv_fits(seq.prefill_left() + self.running.len()) {
                self.waiting.push_front(seq);
                break;
            }
            let chunk = seq.prefill_left().min(budget);
            budget -= chunk;
            plan.prefill
                .push((seq.id, chunk, chunk == seq.prefill_left()));
            self.running.push(seq);
        }
        for seq in self.running[..was_running]
            .iter()
            .filter(|s| s.prefilling() && s.prefill_left() > long)
        {
            if budget == 0 {
                break;
            }
            let chunk = seq.prefill_left().min(budget);
            budget -= chunk;
            plan.prefill
                .push((seq.id, chunk, chunk == seq.prefill_left()));
        }
        plan
    }

    /// Applies a planned step once its GPU work is done. Returns the sampled tokens as
    /// (request id, token index, finished) and removes finished sequences.
    pub fn finish_step(&mut self, plan: &StepPlan) -> Vec<(u64, usize, bool)> {
        let mut newly_cached: Vec<u64> = Vec::new();
        for &(id, tokens, _) in &plan.prefill {
            if let Some(seq) = self.running.iter_mut().find(|s| s.id == id) {
                let before = seq.computed / self.cfg.block_size;
                seq.computed = (seq.computed + tokens).min(seq.prefill_target());
                // Full blocks become reusable as soon as they are computed (vLLM caches
                // per block), so a concurrent request with the same prefix hits them.
                let after = seq.computed / self.cfg.block_size;
                if self.cfg.prefix_cache {
                    let blocks = &seq.prompt.block_hashes;
                    newly_cached.extend(&blocks[before.min(blocks.len())..after.min(blocks.len())]);
                }
            }
        }
        if self.cached_blocks.len() + newly_cached.len() > MAX_CACHED_BLOCKS {
            self.cached_blocks.clear();
        }
        self.cached_blocks.extend(newly_cached);
        let mut sampled = Vec::new();
        for id in plan.sampled() {
            if let Some(seq) = self.running.iter_mut().find(|s| s.id == id) {
                let index = seq.generated;
                seq.generated += 1;
                sampled.push((id, index, seq.generated >= seq.max_tokens));
            }
        }
        self.running.retain(|s| s.generated < s.max_tokens);
        sampled
    }

    /// Prompt tokens of a sequence served from the prefix cache (after it was admitted).
    pub fn cached_tokens(&self, id: u64) -> Option<usize> {
        self.running.iter().find(|s| s.id == id).map(|s| s.cached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(chunked: bool, cache: bool) -> EngineConfig {
        EngineConfig {
            chunked_prefill: chunked,
            prefix_cache: cache,
            max_batched_tokens: 64,
            max_running_seqs: 4,
            ..EngineConfig::default()
        }
    }

    fn words(n: usize, tag: &str) -> String {
        (0..n).map(|i| format!("{tag}{i} ")).collect()
    }

    #[test]
    fn unchunked_prefill_runs_alone_and_stalls_decodes() {
        let mut s = Scheduler::new(cfg(false, false));
        s.add(Sequence::new(1, Prompt::from_text(&words(10, "a"), 16), 5));
        let p = s.plan_step().expect("a step for the first prompt");
        assert_eq!(p.kind(), StepKind::Prefill);
        s.finish_step(&p);
        s.add(Sequence::new(
            2,
            Prompt::from_text(&words(1000, "b"), 16),
            5,
        ));
        let p = s.plan_step().expect("a step for the long prompt");
        assert_eq!(
            p.prefill,
            vec![(2, 1000, true)],
            "the whole long prompt prefills in one step"
        );
        assert!(
            p.decode.is_empty(),
            "no decode runs beside an unchunked prefill"
        );
    }

    #[test]
    fn chunked_prefill_interleaves_with_decodes() {
        let mut s = Scheduler::new(cfg(true, false));
        s.add(Sequence::new(1, Prompt::from_text(&words(10, "a"), 16), 50));
        let p = s.plan_step().unwrap();
        s.finish_step(&p);
        s.add(Sequence::new(
            2,
            Prompt::from_text(&words(1000, "b"), 16),
            5,
        ));
        let mut chunks = 0;
        loop {
            let p = s.plan_step().unwrap();
            assert!(
                p.decode.contains(&1),
                "the running stream decodes every step"
            );
            assert!(
                p.prefill_tokens() <= 63,
                "chunk stays within the token budget"
            );
            chunks += 1;
            let done = p.prefill.iter().any(|c| c.2);
            s.finish_step(&p);
            if done {
                break;
            }
        }
        assert_eq!(
            chunks,
            1000usize.div_ceil(63),
            "1000 tokens in 63-token chunks"
        );
    }

    #[test]
    fn prefix_cache_skips_a_seen_prefix() {
        let system = words(160, "sys");
        let mut s = Scheduler::new(cfg(false, true));
        s.add(Sequence::new(
            1,
            Prompt::from_text(&(system.clone() + "q1"), 16),
            1,
        ));
        let p = s.plan_step().unwrap();
        assert_eq!(p.prefill_tokens(), 161);
        s.finish_step(&p);
        s.add(Sequence::new(
            2,
            Prompt::from_text(&(system + "q2 q3"), 16),
            1,
        ));
        let p = s.plan_step().unwrap();
        assert_eq!(
            p.prefill_tokens(),
            2,
            "only the words after the cached 160 prefill"
        );
    }

    #[test]
    fn max_running_seqs_queues_the_rest() {
        let mut s = Scheduler::new(cfg(true, false));
        for id in 0..6 {
            s.add(Sequence::new(id, Prompt::from_text("x y", 16), 10));
        }
        let p = s.plan_step().unwrap();
        s.finish_step(&p);
        assert_eq!(s.running_len(), 4, "no more than max_running_seqs run");
        assert_eq!(s.waiting_len(), 2, "the rest wait");
    }

    #[test]
    fn a_full_kv_cache_preempts_the_newest_which_recomputes_what_it_generated() {
        let mut s = Scheduler::new(EngineConfig {
            kv_cache_tokens: Some(70),
            ..cfg(true, false)
        });
        for id in 1..=3 {
            s.add(Sequence::new(
                id,
                Prompt::from_text(&words(10, "p"), 16),
                40,
            ));
        }
        let mut tokens: std::collections::HashMap<u64, Vec<usize>> = Default::default();
        let mut preempted = Vec::new();
        let mut recompute = None;
        for _ in 0..200 {
            let Some(p) = s.plan_step() else { break };
            preempted.extend(s.take_preempted());
            if let Some(&(id, n, _)) = p.prefill.iter().find(|x| preempted.contains(&x.0)) {
                recompute.get_or_insert((id, n));
            }
            for (id, index, _) in s.finish_step(&p) {
                tokens.entry(id).or_default().push(index);
            }
        }
        assert_eq!(preempted.first(), Some(&3), "the newest goes first");
        let (id, n) = recompute.expect("the preempted sequence prefills again");
        assert!(
            n > 10,
            "request {id} recomputes its prompt and its tokens: {n}"
        );
        for id in 1..=3 {
            assert_eq!(
                tokens[&id],
                (0..40).collect::<Vec<_>>(),
                "request {id}: every token once, in order"
            );
        }
    }
}
