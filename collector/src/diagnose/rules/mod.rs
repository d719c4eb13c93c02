//! The rules. Each reads the timeline, decides on a precise trigger, and
//! returns its evidence plus what the fix would remove (per request TTFT, per
//! inter-token gap); `super::share_savings` turns removals into savings. By what
//! they read: `network` (connections, proxies, TCP hops: rules 1-3, 7-9), `engine`
//! (prompts and GPU steps: rules 4-6), `gpu` (NVML: rule 10), `host` (the GPU idle
//! between decode steps: rule 11), `preempt` (streams stopped and recomputed: rule
//! 12), `slots` (an engine's writes when it has no GPU source: rule 13).

mod engine;
mod gpu;
mod host;
mod nagle;
mod network;
mod preempt;
mod readers;
mod slots;

use std::collections::{BTreeMap, HashMap};

use super::{Diagnosis, Evidence, Figure, Finding, Fix, Input, Saving};
use crate::stitch::Request;

#[cfg(test)]
pub(super) use engine::shared_fractions;

/// (number, key, title) of every rule, in order.
pub const RULES: [(u8, &str, &str); 13] = [
    (1, "new_connection_per_request", "keep connections alive"),
    (2, "proxy_buffering", "turn proxy buffering off"),
    (3, "compression_buffering", "do not gzip event streams"),
    (4, "no_prefix_cache", "enable prefix caching"),
    (5, "prefill_stalls_decode", "enable chunked prefill"),
    (6, "queueing", "add serving capacity"),
    (7, "nagle_delayed_ack", "set TCP_NODELAY"),
    (8, "retransmits", "find the packet loss"),
    (9, "slow_client", "the client reads too slowly"),
    (10, "gpu_throttled", "the GPU is throttled or idle"),
    (
        11,
        "host_bound_decode",
        "overlap the host loop with the GPU",
    ),
    (12, "kv_cache_preemption", "give the KV cache room"),
    (13, "slot_saturation", "add engine slots"),
];

/// A rule needs at least this many requests (or events) showing it.
const MIN_EVIDENCE: usize = 3;

pub(super) fn run(input: &Input) -> Vec<Finding> {
    run_with(input, Fixed::default())
}

/// Which other fixes a rule's saving may assume applied, where one fix changes what
/// another costs (a what-if of several rules). Where two fixes remove some of the same
/// time, the finding says so instead (`Finding::instead`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Fixed {
    /// Rule 4 (prefix cache) applied: rule 5's chunked prefill then prefills only the
    /// unshared part of each long prompt, so its cost counts the cache.
    pub prefix_cache: bool,
}

impl Default for Fixed {
    fn default() -> Self {
        Fixed { prefix_cache: true }
    }
}

/// The rules, each saving under the fixes `fixed` assumes applied alongside.
pub(super) fn run_with(input: &Input, fixed: Fixed) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(network::new_connection_per_request(input));
    out.extend(network::proxy_holds(input));
    // Rule 6 subtracts only what the cache takes off each request's own engine wait.
    let (prefix, prefix_removed) = match engine::no_prefix_cache(input) {
        Some((f, own)) => (Some(f), own),
        None => (None, BTreeMap::new()),
    };
    let prefix_cache_fixed = prefix.is_some() && fixed.prefix_cache;
    out.extend(prefix);
    out.extend(engine::prefill_stalls_decode(input, prefix_cache_fixed));
    out.extend(engine::queueing(input, &prefix_removed));
    out.extend(nagle::nagle(input));
    out.extend(network::retransmits(input));
    out.extend(network::slow_client(input));
    out.extend(gpu::gpu_throttled(input));
    out.extend(host::host_bound_decode(input));
    out.extend(preempt::kv_preemption(input));
    out.extend(slots::slot_saturation(input));
    out
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 100.0).round() / 100.0
}

fn median(v: &[u64]) -> u64 {
    crate::analyze::percentile(v, 500)
}

fn fig(name: &'static str, value: f64, unit: &'static str) -> Figure {
    Figure { name, value, unit }
}

fn rule_meta(n: u8) -> (&'static str, &'static str) {
    let (_, key, title) = RULES
        .iter()
        .find(|r| r.0 == n)
        .expect("every rule is in RULES");
    (key, title)
}

/// What a rule found, each part by name; `diagnosis()` adds the rule's key and title,
/// the routes, the heaviest requests and the span they cover.
struct Draft<'a> {
    /// The rule's number in `RULES`.
    rule: u8,
    requests: &'a [&'a Request],
    /// Index into `requests` -> how much that request shows the rule.
    weights: &'a BTreeMap<usize, u64>,
    finding: String,
    figures: Vec<Figure>,
    /// What the fix would remove, in words (the saving's basis).
    basis: &'a str,
    fix: Vec<Fix>,
}

impl Draft<'_> {
    fn diagnosis(self) -> Diagnosis {
        let Draft {
            rule,
            requests,
            weights,
            finding,
            figures,
            basis,
            fix,
        } = self;
        let (key, title) = rule_meta(rule);
        let mut ranked: Vec<(&usize, &u64)> = weights.iter().collect();
        ranked.sort_by_key(|(i, w)| (std::cmp::Reverse(**w), **i));
        let span = weights.keys().map(|&i| &requests[i]);
        let start_ns = span.clone().map(|r| r.start_ns).min().unwrap_or(0);
        let end_ns = span
            .map(|r| r.end_ns.unwrap_or(r.start_ns))
            .max()
            .unwrap_or(0);
        Diagnosis {
            rule,
            key,
            title,
            finding,
            scope: scope(requests, weights.keys().copied()),
            evidence: Evidence {
                requests: weights.len(),
                request_ids: ranked
                    .iter()
                    .take(20)
                    .map(|(i, _)| requests[**i].id)
                    .collect(),
                figures,
                start_ns,
                end_ns,
            },
            saving: Saving {
                basis: basis.to_string(),
                ..Default::default()
            },
            fix,
        }
    }
}

/// The routes (host + path) the evidence requests went to, most frequent first.
fn scope(requests: &[&Request], ids: impl Iterator<Item = usize>) -> String {
    // Counted by the route's parts (no string per request), then merged by route.
    let mut parts: HashMap<(Option<&str>, &str), usize> = HashMap::new();
    for i in ids {
        let r = requests[i];
        *parts.entry((r.host.as_deref(), &r.path)).or_default() += 1;
    }
    let mut routes: BTreeMap<String, usize> = BTreeMap::new();
    for ((host, path), n) in parts {
        *routes
            .entry(crate::stitch::request::route(host, path))
            .or_default() += n;
    }
    let mut v: Vec<(String, usize)> = routes.into_iter().collect();
    v.sort_by_key(|(r, n)| (std::cmp::Reverse(*n), r.clone()));
    match v.len() {
        0 => String::new(),
        1 => v[0].0.clone(),
        n => format!("{} (+{} more routes)", v[0].0, n - 1),
    }
}

fn fix(target: &'static str, lines: &[&'static str]) -> Fix {
    Fix {
        target,
        lines: lines.to_vec(),
    }
}
