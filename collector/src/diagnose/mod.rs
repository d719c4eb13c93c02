//! Diagnoses: rules over a stitched timeline that name a fix, show the evidence
//! (requests and figures) and estimate the time the fix saves. Pure: the same
//! timeline gives the same diagnoses, live or replayed.
//!
//! Savings. Each rule says, per request, how much of its TTFT the fix removes
//! (and, per inter-token gap, how much of the gap). The causes overlap (a token
//! held by both proxy buffering and gzip is freed only when both go; a proxy's
//! bursts hide an engine stall until buffering is off), so the removals are
//! applied together: the joint saving is p95(TTFT) minus p95(TTFT with every
//! removal) (p99 for ITL), shared between the rules by Shapley value (each rule's
//! marginal saving averaged over every order of applying the fixes). The shares
//! add up to the joint saving; each rule also carries what it would save alone.

mod rules;
pub mod slo;
pub mod what_if;

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::analyze::percentile_in_place;
use crate::gpu::GpuStep;
use crate::ingest::model::NvmlSample;
use crate::stitch::attribution::GpuShare;
use crate::stitch::Request;

pub use rules::RULES;
pub use slo::{Slo, SloResult};
pub use what_if::{Selection, WhatIf};

/// What the rules read.
pub struct Input<'a> {
    /// Borrowed one by one, so that a caller holding them apart (top's window shares each
    /// request with its screen) need not copy them into one slice.
    pub requests: Vec<&'a Request>,
    pub steps: &'a [GpuStep],
    /// NVML samples with their time (CLOCK_MONOTONIC ns).
    pub nvml: &'a [(u64, NvmlSample)],
    /// Each request's GPU share by index, when they were attributed apart from the
    /// requests (`attribution::shares`); empty: each request's own `gpu`.
    pub shares: &'a [Option<GpuShare>],
}

impl Input<'_> {
    /// Request `i`'s GPU share (see `shares`).
    pub fn gpu(&self, i: usize) -> Option<&GpuShare> {
        match self.shares.get(i) {
            Some(share) => share.as_ref(),
            None if self.shares.is_empty() => self.requests[i].gpu.as_ref(),
            None => None,
        }
    }
}

// The batch stitch's timeline as input: the oracle the pipeline's output is checked
// against in tests; no product path builds one.
#[cfg(test)]
impl<'a> Input<'a> {
    pub fn new(timeline: &'a crate::stitch::Timeline, nvml: &'a [(u64, NvmlSample)]) -> Self {
        Input {
            requests: timeline.requests.iter().collect(),
            steps: &timeline.steps,
            nvml,
            shares: &[],
        }
    }
}

/// The NVML samples of a recording with their time, in time order (tests: the pipeline
/// hands them out as `Output::nvml`).
#[cfg(test)]
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
    /// Per request index: TTFT the fix adds (chunked prefill lengthens a long prompt's
    /// own prefill).
    pub ttft_added: BTreeMap<usize, u64>,
    /// Per (request index, gap index at the request's TTFT point): gap time removed
    /// (negative: the fix lengthens the gap, as unbatching a burst does).
    pub itl: BTreeMap<(usize, usize), i64>,
    /// What the fix removes instead when another rule's fix is applied too (the two
    /// fixes remove some of the same time).
    pub instead: Option<Instead>,
}

/// Per (request index, gap index): gap time removed.
pub(crate) type GapRemovals = BTreeMap<(usize, usize), i64>;

/// A rule's removals when the fix of `rule` is applied beside it.
pub(crate) struct Instead {
    pub rule: u8,
    /// Per request index: TTFT removed (what the rule adds stays as alone).
    pub ttft: BTreeMap<usize, u64>,
    /// Per gap: time removed; None where the gaps change as they do alone.
    pub itl: Option<BTreeMap<(usize, usize), i64>>,
}

impl Finding {
    /// A finding whose fix changes token gaps only (the ITL rules).
    pub(crate) fn itl_only(diagnosis: Diagnosis, itl: BTreeMap<(usize, usize), i64>) -> Finding {
        Finding {
            diagnosis,
            ttft: BTreeMap::new(),
            ttft_added: BTreeMap::new(),
            itl,
            instead: None,
        }
    }

    /// Per request index: TTFT the fix removes, less what it adds.
    fn ttft_removed(&self) -> BTreeMap<usize, i64> {
        self.net(&self.ttft)
    }

    /// `removed` less what the fix adds, per request index.
    fn net(&self, removed: &BTreeMap<usize, u64>) -> BTreeMap<usize, i64> {
        let mut m: BTreeMap<usize, i64> = removed.iter().map(|(&k, &v)| (k, v as i64)).collect();
        for (&k, &v) in &self.ttft_added {
            *m.entry(k).or_default() -= v as i64;
        }
        m
    }

    /// [`Finding::ttft_removed`] and the gaps removed, with `beside`'s fix applied too
    /// where this rule's removals then change.
    fn removals_beside(&self, beside: &BTreeSet<u8>) -> (BTreeMap<usize, i64>, &GapRemovals) {
        match &self.instead {
            Some(i) if beside.contains(&i.rule) => {
                (self.net(&i.ttft), i.itl.as_ref().unwrap_or(&self.itl))
            }
            _ => (self.ttft_removed(), &self.itl),
        }
    }
}

/// All diagnoses for a timeline, the largest saving first.
pub fn diagnose(input: &Input) -> Vec<Diagnosis> {
    let findings = rules::run(input);
    let mut out = share_savings(&input.requests, findings);
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

fn p95(v: &mut [u64]) -> u64 {
    percentile_in_place(v, 950)
}

fn p99(v: &mut [u64]) -> u64 {
    percentile_in_place(v, 990)
}

/// Most rules whose savings are shared exactly (2^n subsets are evaluated); past it,
/// shares are proportional to what each fix saves alone.
const MAX_SHAPLEY: usize = 10;

/// A rule's removals, and the removals it makes instead when another rule (an index into
/// the same list) is in the coalition.
struct Removal<'a, K> {
    map: &'a BTreeMap<K, i64>,
    with: Option<(usize, BTreeMap<K, i64>)>,
}

/// Each removal map's share of the joint saving of `stat` over the samples `values`
/// (`at`: a map's key -> its sample, None for none), and what it saves alone. Shares
/// are Shapley values: a rule's marginal saving averaged over every order in which the
/// fixes could be applied, so causes that hide each other (a proxy's bursts hide an
/// engine stall) are credited fairly and the shares add up to the joint saving.
fn shapley<K>(
    values: &[u64],
    at: impl Fn(&K) -> Option<usize>,
    removals: &[Removal<K>],
    stat: fn(&mut [u64]) -> u64,
) -> Vec<(u64, u64)> {
    let live: Vec<usize> = (0..removals.len())
        .filter(|&j| !removals[j].map.is_empty())
        .collect();
    // Per live rule: the live position of the rule whose presence switches its removals.
    let switch: Vec<Option<usize>> = live
        .iter()
        .map(|&j| {
            let (other, _) = removals[j].with.as_ref()?;
            live.iter().position(|&l| l == *other)
        })
        .collect();
    let m = live.len();
    let mut out = vec![(0, 0); removals.len()];
    if m == 0 || values.is_empty() {
        return out;
    }
    // The samples some rule removes from (most gaps of a window are untouched): their
    // positions, and per touched sample what each live rule removes from it, alone and
    // with its switch, `m` entries a sample in one vector. Read from the maps, not looked
    // up per sample: a minute of tokens is a quarter of a million samples.
    let keys = |j: usize| {
        let r = &removals[j];
        r.map
            .keys()
            .chain(r.with.iter().flat_map(|(_, w)| w.keys()))
    };
    let mut touched: Vec<usize> = live.iter().flat_map(|&j| keys(j)).filter_map(&at).collect();
    touched.sort_unstable();
    touched.dedup();
    let mut rem = vec![(0i64, 0i64); touched.len() * m];
    for (b, &j) in live.iter().enumerate() {
        let slot = |k: &K| Some(touched.binary_search(&at(k)?).ok()? * m + b);
        for (k, &v) in removals[j].map {
            if let Some(s) = slot(k) {
                rem[s] = (v, v);
            }
        }
        if let Some((_, with)) = &removals[j].with {
            for t in 0..touched.len() {
                rem[t * m + b].1 = 0;
            }
            for (k, &v) in with {
                if let Some(s) = slot(k) {
                    rem[s].1 = v;
                }
            }
        }
    }
    let base = stat(&mut values.to_vec());
    let saving = |mask: usize| -> u64 {
        let mut after = values.to_vec();
        for (&t, r) in touched.iter().zip(rem.chunks_exact(m)) {
            let removed: i64 = (0..m)
                .filter(|b| mask & (1 << b) != 0)
                .map(|b| match switch[b] {
                    Some(o) if mask & (1 << o) != 0 => r[b].1,
                    _ => r[b].0,
                })
                .sum();
            after[t] = (values[t] as i64 - removed).max(0) as u64;
        }
        base.saturating_sub(stat(&mut after))
    };
    let alone: Vec<u64> = (0..m).map(|b| saving(1 << b)).collect();
    let shares: Vec<u64> = if m <= MAX_SHAPLEY {
        let v: Vec<u64> = (0..1usize << m).map(saving).collect();
        let fact = |n: usize| (1..=n).map(|x| x as f64).product::<f64>();
        (0..m)
            .map(|b| {
                let phi: f64 = (0..1usize << m)
                    .filter(|mask| mask & (1 << b) == 0)
                    .map(|mask| {
                        let size = mask.count_ones() as usize;
                        let weight = fact(size) * fact(m - size - 1) / fact(m);
                        weight * (v[mask | (1 << b)] as f64 - v[mask] as f64)
                    })
                    .sum();
                phi.max(0.0).round() as u64
            })
            .collect()
    } else {
        let joint = saving((1 << m) - 1);
        let total: u64 = alone.iter().sum();
        alone
            .iter()
            .map(|&a| {
                (u128::from(joint) * u128::from(a))
                    .checked_div(u128::from(total))
                    .unwrap_or(0) as u64
            })
            .collect()
    };
    for (b, &j) in live.iter().enumerate() {
        out[j] = (shares[b], alone[b]);
    }
    out
}

fn share_savings(requests: &[&Request], findings: Vec<Finding>) -> Vec<Diagnosis> {
    // TTFT: one sample per request that has one; a request's index -> its sample.
    let mut ttft = Vec::new();
    let ttft_at: Vec<Option<usize>> = requests
        .iter()
        .map(|r| {
            let t = request_ttft(r)?;
            ttft.push(t);
            Some(ttft.len() - 1)
        })
        .collect();
    // ITL: one sample per gap at each request's TTFT point; a request's index -> where
    // its gaps start among them, and how many it has.
    let mut gaps = Vec::new();
    let gaps_at: Vec<(usize, usize)> = requests
        .iter()
        .map(|r| {
            let start = gaps.len();
            if let Some(p) = ttft_point(r) {
                gaps.extend(p.token_ns.windows(2).map(|w| w[1] - w[0]));
            }
            (start, gaps.len() - start)
        })
        .collect();
    let gap_at = |&(i, k): &(usize, usize)| {
        let &(start, n) = gaps_at.get(i)?;
        (k < n).then_some(start + k)
    };
    let ttft_maps: Vec<BTreeMap<usize, i64>> = findings.iter().map(Finding::ttft_removed).collect();
    // The position of the rule whose fix changes a finding's removals.
    fn beside<'a>(findings: &[Finding], f: &'a Finding) -> Option<(usize, &'a Instead)> {
        let i = f.instead.as_ref()?;
        Some((findings.iter().position(|g| g.diagnosis.rule == i.rule)?, i))
    }
    let ttft_removals: Vec<Removal<usize>> = findings
        .iter()
        .zip(&ttft_maps)
        .map(|(f, map)| Removal {
            map,
            with: beside(&findings, f).map(|(other, i)| (other, f.net(&i.ttft))),
        })
        .collect();
    let at = |&i: &usize| *ttft_at.get(i)?;
    let ttft_shares = shapley(&ttft, at, &ttft_removals, p95);
    let itl_removals: Vec<Removal<(usize, usize)>> = findings
        .iter()
        .map(|f| Removal {
            map: &f.itl,
            with: beside(&findings, f).and_then(|(other, i)| Some((other, i.itl.clone()?))),
        })
        .collect();
    let itl_shares = shapley(&gaps, gap_at, &itl_removals, p99);
    findings
        .into_iter()
        .enumerate()
        .map(|(j, f)| {
            let mut d = f.diagnosis;
            let changes_ttft = !f.ttft.is_empty() || !f.ttft_added.is_empty();
            if changes_ttft && !ttft.is_empty() {
                d.saving.ttft_p95_ns = Some(ttft_shares[j].0);
                d.saving.ttft_p95_alone_ns = Some(ttft_shares[j].1);
            }
            if !f.itl.is_empty() && !gaps.is_empty() {
                d.saving.itl_p99_ns = Some(itl_shares[j].0);
                d.saving.itl_p99_alone_ns = Some(itl_shares[j].1);
            }
            d
        })
        .collect()
}

#[cfg(test)]
mod tests;
