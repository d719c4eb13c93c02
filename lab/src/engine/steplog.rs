//! The engine's step log: one entry per scheduler step, for tests and the profiler's checks.
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// What a step computed: prompt tokens, one token per running sequence, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    Prefill,
    Decode,
    Mixed,
}

/// One request's share of a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequest {
    pub request_id: u64,
    /// Prompt tokens of this request computed in the step (0 for a decode).
    pub prefill_tokens: u32,
    /// True when the step sampled a token for this request (decode, or last prefill chunk).
    pub sampled: bool,
}

/// One scheduler step, timed on CLOCK_MONOTONIC around its GPU work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub index: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The simulated device's span of the step's work (first work's start, last one's
    /// end), what a GPU trace of the stand-in driver shows; None on another driver.
    pub gpu_start_ns: Option<u64>,
    pub gpu_end_ns: Option<u64>,
    pub kind: StepKind,
    pub requests: Vec<StepRequest>,
    pub prefill_tokens: u32,
    /// Sequences that decoded one token in this step.
    pub decode_seqs: u32,
    /// Simulated GPU time the step was charged, before scheduling jitter.
    pub cost_ns: u64,
    pub kernel_launches: u32,
    pub graph_launches: u32,
    /// Requests preempted (KV cache full) when the step was planned.
    #[serde(default)]
    pub preempted: Vec<u64>,
}

impl Step {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// Shared, append-only log of steps (the scheduler thread writes, anyone reads).
#[derive(Debug, Clone)]
pub struct StepLog {
    steps: Arc<Mutex<Vec<Step>>>,
    // Steps logged so far, so tests can await progress instead of sleeping.
    logged: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for StepLog {
    fn default() -> Self {
        StepLog {
            steps: Arc::default(),
            logged: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

/// Keeps a long-running engine from growing without bound; tests stay far below it.
const MAX_STEPS_KEPT: usize = 1_000_000;

impl StepLog {
    pub fn push(&self, step: Step) {
        let mut steps = self.steps.lock().unwrap_or_else(|e| e.into_inner());
        if steps.len() >= MAX_STEPS_KEPT {
            steps.drain(..MAX_STEPS_KEPT / 2);
        }
        steps.push(step);
        drop(steps);
        self.logged.send_modify(|n| *n += 1);
    }

    /// Waits until a logged step satisfies `pred` and returns a copy of it.
    pub async fn wait_for(&self, mut pred: impl FnMut(&Step) -> bool) -> Step {
        let mut rx = self.logged.subscribe();
        loop {
            rx.borrow_and_update();
            if let Some(s) = self.snapshot().into_iter().find(|s| pred(s)) {
                return s;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// A copy of every step so far.
    pub fn snapshot(&self) -> Vec<Step> {
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn len(&self) -> usize {
        self.steps.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
