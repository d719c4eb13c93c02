//! Diagnoses: rules over a stitched timeline that name a fix, show the evidence
//! (requests and figures) and estimate the time the fix saves. Pure: the same
//! timeline gives the same diagnoses, live or replayed.
//!
//! Savings. Each rule says, per request, how much of its TTFT the fix removes
//! (and, per inter-token gap, how much of the gap). The causes overlap (a token
//! held by both proxy buffering and gzip is freed only when both go), so the
//! rules' removals are applied together: the joint saving is p95(TTFT) minus
//! p95(TTFT with every removal), and each rule gets the share of it that its
//! removals make up in the slowest tenth of requests. The shares add up to the
//! joint saving; each rule also carries what it would save alone.

mod rules;
pub mod slo;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::analyze::summarize;
use crate::gpu::GpuStep;
use crate::ingest::model::NvmlSample;
use crate::stitch::{Connection, Request, Timeline};

pub use rules::RULES;
pub use slo::{Slo, SloResult};

/// What the rules read.
pub struct Input<'a> {
    pub requests: &'a [Request],
    pub connections: &'a [Connection],
    pub steps: &'a [GpuStep],
    /// NVML samples with their time (CLOCK_MONOTONIC ns).
    pub nvml: &'a [(u64, NvmlSample)],
}

impl<'a> Input<'a> {
    pub fn new(timeline: &'a Timeline, nvml: &'a [(u64, NvmlSample)]) -> Self {
        Input {
            requests: &timeline.requests,
            connections: &timeline.connections,
            steps: &timeline.steps,
            nvml,
        }
    }
}

/// The NVML samples of a recording with their time, in time order.
pub fn nvml_samples(events: &[crate::ingest::Event]) -> Vec<(u64, NvmlSample)> {
    let mut v: Vec<(u64, NvmlSample)> = events
        .iter()
        .filter_map(|e| match &e.body {
            Some(crate::ingest::model::event::Body::Nvml(s)) => Some((e.ts_ns, s.clone())),
            _ => None,
        })
        .collect();
    v.sort_by_key(|(t, _)| *t);
    v
}

/// One named problem with its fix.
#[derive(Clone, Debug, Serialize)]
pub struct Diagnosis {
    /// The rule's number (1-10) and key, stable across versions.
    pub rule: u8,
    pub key: &'static str,
    /// The fix, in a few words ("turn proxy buffering off").
    pub title: &'static str,
    /// What was seen, with figures.
    pub finding: String,
    /// Where: the process, port or route the evidence comes from.
    pub scope: String,
    pub evidence: Evidence,
    pub saving: Saving,
    /// Configuration that applies the fix, per component.
    pub fix: Vec<Fix>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Evidence {
    /// Requests that show it, and the report ids of the worst of them (at most 20).
    pub requests: usize,
    pub request_ids: Vec<usize>,
    /// Named figures (ms, counts, shares), in the order they explain the finding.
    pub figures: Vec<Figure>,
    /// The span of time the evidence covers (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Saving {
    /// This rule's share of the joint TTFT p95 saving (see the module doc).
    pub ttft_p95_ns: Option<u64>,
    /// Its share of the joint ITL p99 saving.
    pub itl_p99_ns: Option<u64>,
    /// What fixing this alone would save.
    pub ttft_p95_alone_ns: Option<u64>,
    pub itl_p99_alone_ns: Option<u64>,
    /// How the figure was estimated.
    pub basis: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Fix {
    /// nginx, vLLM, SGLang, client, server, host.
    pub target: &'static str,
    pub lines: Vec<&'static str>,
}

/// A rule's raw result, before savings are shared out.
pub(crate) struct Finding {
    pub diagnosis: Diagnosis,
    /// Per request index: TTFT the fix removes.
    pub ttft: BTreeMap<usize, u64>,
    /// Per (request index, gap index at the request's TTFT point): gap time removed.
    pub itl: BTreeMap<(usize, usize), u64>,
}

/// All diagnoses for a timeline, the largest saving first.
pub fn diagnose(input: &Input) -> Vec<Diagnosis> {
    let findings = rules::run(input);
    let mut out = share_savings(input.requests, findings);
    out.sort_by_key(|d| {
        (
            std::cmp::Reverse(d.saving.ttft_p95_ns.unwrap_or(0) + d.saving.itl_p99_ns.unwrap_or(0)),
            d.rule,
        )
    });
    out
}

/// The point a request's TTFT and ITL are read at: the client-most one with tokens.
pub fn ttft_point(r: &Request) -> Option<&crate::stitch::Point> {
    r.points
        .iter()
        .find(|p| p.ttft_ns.is_some() && !p.token_ns.is_empty())
}

pub fn request_ttft(r: &Request) -> Option<u64> {
    ttft_point(r)?.ttft_ns
}

fn p95(v: &[u64]) -> u64 {
    summarize(v).map_or(0, |s| s.p95_ns)
}

fn p99(v: &[u64]) -> u64 {
    summarize(v).map_or(0, |s| s.p99_ns)
}

fn share_savings(requests: &[Request], findings: Vec<Finding>) -> Vec<Diagnosis> {
    // TTFT: one sample per request that has one.
    let base: Vec<(usize, u64)> = requests
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, request_ttft(r)?)))
        .collect();
    let base_v: Vec<u64> = base.iter().map(|b| b.1).collect();
    let after = |removals: &[&BTreeMap<usize, u64>]| -> Vec<u64> {
        base.iter()
            .map(|&(i, t)| {
                let removed: u64 = removals.iter().filter_map(|m| m.get(&i)).sum();
                t.saturating_sub(removed)
            })
            .collect()
    };
    let all_ttft: Vec<&BTreeMap<usize, u64>> = findings.iter().map(|f| &f.ttft).collect();
    let joint_ttft = p95(&base_v).saturating_sub(p95(&after(&all_ttft)));
    let tail_ttft = summarize(&base_v).map_or(0, |s| s.p90_ns);
    let ttft_weight = |m: &BTreeMap<usize, u64>| -> u128 {
        base.iter()
            .filter(|&&(_, t)| t >= tail_ttft)
            .filter_map(|(i, _)| m.get(i))
            .map(|&v| u128::from(v))
            .sum()
    };

    // ITL: one sample per gap at each request's TTFT point.
    let gaps: Vec<((usize, usize), u64)> = requests
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, ttft_point(r)?)))
        .flat_map(|(i, p)| {
            p.token_ns
                .windows(2)
                .enumerate()
                .map(move |(k, w)| ((i, k), w[1] - w[0]))
        })
        .collect();
    let gaps_v: Vec<u64> = gaps.iter().map(|g| g.1).collect();
    let after_itl = |removals: &[&BTreeMap<(usize, usize), u64>]| -> Vec<u64> {
        gaps.iter()
            .map(|&(key, g)| {
                let removed: u64 = removals.iter().filter_map(|m| m.get(&key)).sum();
                g.saturating_sub(removed)
            })
            .collect()
    };
    let all_itl: Vec<&BTreeMap<(usize, usize), u64>> = findings.iter().map(|f| &f.itl).collect();
    let joint_itl = p99(&gaps_v).saturating_sub(p99(&after_itl(&all_itl)));
    let tail_itl = summarize(&gaps_v).map_or(0, |s| s.p99_ns);
    let itl_weight = |m: &BTreeMap<(usize, usize), u64>| -> u128 {
        gaps.iter()
            .filter(|&&(_, g)| g >= tail_itl)
            .filter_map(|(k, _)| m.get(k))
            .map(|&v| u128::from(v))
            .sum()
    };

    let ttft_total: u128 = findings.iter().map(|f| ttft_weight(&f.ttft)).sum();
    let itl_total: u128 = findings.iter().map(|f| itl_weight(&f.itl)).sum();
    let share = |joint: u64, w: u128, total: u128| -> u64 {
        (u128::from(joint) * w).checked_div(total).unwrap_or(0) as u64
    };
    findings
        .into_iter()
        .map(|f| {
            let mut d = f.diagnosis;
            if !f.ttft.is_empty() && !base.is_empty() {
                d.saving.ttft_p95_ns = Some(share(joint_ttft, ttft_weight(&f.ttft), ttft_total));
                d.saving.ttft_p95_alone_ns =
                    Some(p95(&base_v).saturating_sub(p95(&after(&[&f.ttft]))));
            }
            if !f.itl.is_empty() && !gaps.is_empty() {
                d.saving.itl_p99_ns = Some(share(joint_itl, itl_weight(&f.itl), itl_total));
                d.saving.itl_p99_alone_ns =
                    Some(p99(&gaps_v).saturating_sub(p99(&after_itl(&[&f.itl]))));
            }
            d
        })
        .collect()
}

#[cfg(test)]
mod tests;
