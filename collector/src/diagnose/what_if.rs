//! What-if: the recorded requests re-timed as if some rules' fixes were applied, by the
//! model each rule uses for its saving (per request, the TTFT the fix removes; per
//! inter-token gap, the time it removes or adds). The same samples as the savings: TTFT
//! and gaps at each request's client-most point with tokens.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::{rules, ttft_point, Input};
use crate::analyze::Samples;

/// The rules whose fixes are applied: by number or key, or every rule that fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    All,
    Rules(BTreeSet<u8>),
}

impl Selection {
    fn takes(&self, rule: u8) -> bool {
        match self {
            Selection::All => true,
            Selection::Rules(r) => r.contains(&rule),
        }
    }
}

impl FromStr for Selection {
    type Err = String;

    /// `all`, or a comma-separated list of rule numbers or keys (`2,3` or
    /// `proxy_buffering,compression_buffering`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "all" {
            return Ok(Selection::All);
        }
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let rule = rules::RULES
                .iter()
                .find(|(n, key, _)| part == *key || part.parse::<u8>().ok() == Some(*n))
                .map(|r| r.0)
                .ok_or_else(|| {
                    let known: Vec<String> = rules::RULES
                        .iter()
                        .map(|(n, key, _)| format!("{n} ({key})"))
                        .collect();
                    format!("no rule '{part}'; rules: {}, or all", known.join(", "))
                })?;
            set.insert(rule);
        }
        if set.is_empty() {
            return Err("name one or more rules (e.g. 2,3) or all".into());
        }
        Ok(Selection::Rules(set))
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selection::All => f.write_str("all"),
            Selection::Rules(r) => {
                let v: Vec<String> = r.iter().map(u8::to_string).collect();
                f.write_str(&v.join(","))
            }
        }
    }
}

/// Recorded and predicted samples, added window by window.
#[derive(Default)]
pub struct Accumulator {
    ttft: Samples,
    ttft_after: Samples,
    gaps: Samples,
    gaps_after: Samples,
    /// Rule -> requests whose TTFT or gaps its fix changes, and the rule whose fix,
    /// applied beside it, changed what it removes.
    applied: BTreeMap<u8, (usize, Option<u8>)>,
}

impl Accumulator {
    /// The window's requests re-timed with the fixes of `selection` that fire in it.
    pub fn add(&mut self, input: &Input, selection: &Selection) {
        let fixed = rules::Fixed {
            prefix_cache: selection.takes(4),
        };
        let findings: Vec<super::Finding> = rules::run_with(input, fixed)
            .into_iter()
            .filter(|f| selection.takes(f.diagnosis.rule))
            .collect();
        let firing: BTreeSet<u8> = findings.iter().map(|f| f.diagnosis.rule).collect();
        let removals: Vec<_> = findings
            .iter()
            .map(|f| f.removals_beside(&firing))
            .collect();
        for (f, (ttft, itl)) in findings.iter().zip(&removals) {
            let touched: BTreeSet<usize> = ttft
                .keys()
                .copied()
                .chain(itl.keys().map(|k| k.0))
                .collect();
            let beside = f
                .instead
                .as_ref()
                .map(|i| i.rule)
                .filter(|r| firing.contains(r));
            let entry = self.applied.entry(f.diagnosis.rule).or_default();
            entry.0 += touched.len();
            entry.1 = entry.1.or(beside);
        }
        let ttft_removed =
            |i: usize| -> i64 { removals.iter().filter_map(|(m, _)| m.get(&i)).sum() };
        let gap_removed =
            |k: (usize, usize)| -> i64 { removals.iter().filter_map(|(_, m)| m.get(&k)).sum() };
        for (i, r) in input.requests.iter().enumerate() {
            let Some(p) = ttft_point(r) else { continue };
            if let Some(t) = p.ttft_ns {
                self.ttft.push(t);
                self.ttft_after.push(after(t, ttft_removed(i)));
            }
            for (k, w) in p.token_ns.windows(2).enumerate() {
                let gap = w[1] - w[0];
                self.gaps.push(gap);
                self.gaps_after.push(after(gap, gap_removed((i, k))));
            }
        }
    }

    pub fn finish(&self, selection: &Selection) -> WhatIf {
        WhatIf {
            rules: selection.to_string(),
            applied: self
                .applied
                .iter()
                .map(|(&rule, &(requests, with))| Applied {
                    rule,
                    requests,
                    with,
                })
                .collect(),
            recorded: Latency::of(&self.ttft, &self.gaps),
            predicted: Latency::of(&self.ttft_after, &self.gaps_after),
        }
    }
}

fn after(v: u64, removed: i64) -> u64 {
    (v as i64 - removed).max(0) as u64
}

/// `report --what-if`: the recorded latency and the latency predicted with the fixes.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIf {
    /// The rules asked for (`all`, or numbers).
    pub rules: String,
    /// The rules that fired and were applied, with the requests each changed; a rule
    /// asked for that did not fire changes nothing and is absent.
    pub applied: Vec<Applied>,
    pub recorded: Latency,
    pub predicted: Latency,
}

#[derive(Clone, Debug, Serialize)]
pub struct Applied {
    pub rule: u8,
    pub requests: usize,
    /// The rule whose fix, applied too, changed what this one removes (rule 3 beside
    /// rule 2: unbuffered, nothing is left for gzip to hold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with: Option<u8>,
}

/// TTFT (one sample per request) and ITL (one per gap) at the client-most point.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub requests: usize,
    pub ttft_p50_ns: u64,
    pub ttft_p95_ns: u64,
    pub gaps: usize,
    pub itl_mean_ns: u64,
    pub itl_p99_ns: u64,
}

impl Latency {
    fn of(ttft: &Samples, gaps: &Samples) -> Latency {
        let t = ttft.summary();
        let g = gaps.summary();
        Latency {
            requests: ttft.len(),
            ttft_p50_ns: t.map_or(0, |s| s.p50_ns),
            ttft_p95_ns: t.map_or(0, |s| s.p95_ns),
            gaps: gaps.len(),
            itl_mean_ns: g.map_or(0, |s| s.mean_ns),
            itl_p99_ns: g.map_or(0, |s| s.p99_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_parse_numbers_keys_and_all_and_refuse_unknown_rules() {
        assert_eq!("all".parse::<Selection>().unwrap(), Selection::All);
        let s: Selection = "2, compression_buffering,13".parse().unwrap();
        assert_eq!(s, Selection::Rules(BTreeSet::from([2, 3, 13])));
        assert_eq!(s.to_string(), "2,3,13");
        let e = "2,14".parse::<Selection>().unwrap_err();
        assert!(
            e.contains("no rule '14'") && e.contains("13 (slot_saturation)"),
            "{e}"
        );
        assert!(",".parse::<Selection>().is_err());
    }

    #[test]
    fn removals_never_make_a_latency_negative_and_added_gap_time_counts() {
        assert_eq!(after(10, 4), 6);
        assert_eq!(after(10, 40), 0);
        assert_eq!(after(10, -5), 15);
    }
}
