//! Requests and GPU steps the pipeline handed over, cut into consecutive windows of
//! start time as a replay goes: a window's requests are numbered in the order their
//! chains start (continuing the windows before) and joined to the GPU steps around
//! them, and steps no later request can join are let go. The export writes a trace
//! window per cut; the report sums each cut up and lets its requests go.

use crate::gpu::GpuStep;
use crate::stitch::{attribution, Request};

use super::{renumber, Pipeline};

/// How far event time runs past a window's end before it is cut: a step, a
/// connection's release (a settle after its close, at the next advance) and a CUPTI
/// buffer come this much after what they show.
pub const LATENESS_NS: u64 = 5_000_000_000;
/// A request held longer than this past its window's end no longer holds the window:
/// it goes with a later one (a runaway stream, or an exchange that never joins a
/// chain, must not make a replay hold the recording).
pub const MAX_HOLD_NS: u64 = 300_000_000_000;
/// Steps this long before a request's start are kept for its attribution (the step
/// its engine was in when it arrived).
const STEP_SLACK_NS: u64 = 1_000_000_000;

#[derive(Debug, Default)]
pub struct Cutter {
    /// Handed over, not yet cut.
    requests: Vec<Request>,
    /// In start order; those before `steps_cut` were cut and stay for the attribution
    /// of requests not yet cut.
    steps: Vec<GpuStep>,
    steps_cut: usize,
    next_id: usize,
}

/// One window's requests (numbered, joined to the steps, in id order) and the steps
/// that start in it.
pub struct Cut {
    pub requests: Vec<Request>,
    pub steps: Vec<GpuStep>,
}

impl Cutter {
    pub fn add(&mut self, requests: Vec<Request>, steps: Vec<GpuStep>) {
        self.requests.extend(requests);
        if !steps.is_empty() {
            self.steps.extend(steps);
            // Stable, and cheap: the new steps are nearly in order, after the old.
            self.steps[self.steps_cut..].sort_by_key(|s| s.start_ns);
        }
    }

    /// Requests handed over and not yet cut.
    pub fn held(&self) -> usize {
        self.requests.len()
    }

    /// The earliest start of a request or step not yet cut.
    pub fn first_pending_ns(&self) -> Option<u64> {
        let request = self.requests.iter().map(|r| r.start_ns).min();
        let step = self.steps.get(self.steps_cut).map(|s| s.start_ns);
        request.into_iter().chain(step).min()
    }

    /// Whether a window ending at `end_ns` can be cut now: event time is far enough past
    /// it, and no request the stitcher holds can still start in it (or one has held it
    /// too long).
    pub fn ready(p: &Pipeline, end_ns: u64) -> bool {
        let released = p.released_ns();
        if released < end_ns.saturating_add(LATENESS_NS) {
            return false;
        }
        let held = p.oldest_held_ns().unwrap_or(u64::MAX);
        held >= end_ns || released >= end_ns.saturating_add(MAX_HOLD_NS)
    }

    /// What starts before `end_ns`, requests joined to every step held (those around
    /// them, cut or not: all of the recording's in one window, as a whole-recording
    /// join has them).
    pub fn cut(&mut self, end_ns: u64) -> Cut {
        let from = self.steps_cut;
        let requests = self.cut_requests(end_ns);
        Cut {
            requests,
            steps: self.steps[from..self.steps_cut].to_vec(),
        }
    }

    /// `cut` without a copy of the window's steps (for views that do not draw them).
    pub fn cut_requests(&mut self, end_ns: u64) -> Vec<Request> {
        let (mut requests, later): (Vec<Request>, Vec<Request>) =
            std::mem::take(&mut self.requests)
                .into_iter()
                .partition(|r| r.start_ns < end_ns);
        self.requests = later;
        renumber(&mut requests);
        for r in &mut requests {
            r.id += self.next_id;
        }
        self.next_id += requests.len();
        attribution::attribute(&mut requests, &mut self.steps);
        self.steps_cut += self.steps[self.steps_cut..].partition_point(|s| s.start_ns < end_ns);
        requests
    }

    /// Every step held, cut or not, in start order (what a window's diagnoses read).
    pub fn steps(&self) -> &[GpuStep] {
        &self.steps
    }

    /// Lets go of cut steps that no request still to be cut can be joined to, and
    /// returns them (they will not change again).
    pub fn forget_steps(&mut self, end_ns: u64) -> Vec<GpuStep> {
        let keep_from = self
            .requests
            .iter()
            .map(|r| r.start_ns)
            .fold(end_ns, u64::min)
            .saturating_sub(STEP_SLACK_NS);
        let n = self.steps[..self.steps_cut]
            .iter()
            .take_while(|s| s.end_ns < keep_from)
            .count();
        self.steps_cut -= n;
        self.steps.drain(..n).collect()
    }

    /// The input ended: every step still held.
    pub fn into_steps(self) -> Vec<GpuStep> {
        self.steps
    }
}
