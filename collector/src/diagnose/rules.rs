//! The ten rules. Each reads the timeline, decides on a precise trigger, and
//! returns its evidence plus what the fix would remove (per request TTFT, per
//! inter-token gap); `super::share_savings` turns removals into savings.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::{ttft_point, Diagnosis, Evidence, Figure, Finding, Fix, Input, Saving};
use crate::gpu::StepKind;
use crate::stitch::{PointKind, Request};

/// (number, key, title) of every rule, in order.
pub const RULES: [(u8, &str, &str); 10] = [
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
];

/// A rule needs at least this many requests (or events) showing it.
const MIN_EVIDENCE: usize = 3;
/// A proxy holds a token when it forwards it this much later than it read it.
const HOLD_NS: u64 = 10_000_000;
/// A Nagle stall ends when the peer's delayed ACK fires: the held token reaches the
/// reader 35-220 ms (Linux: 40 ms minimum, 200 ms maximum) after the one before it...
const NAGLE_NS: (u64, u64) = (35_000_000, 220_000_000);
/// ... and was held on the hop at least this much longer than that one.
const NAGLE_GREW_NS: u64 = 5_000_000;
/// A prefill step stalls decodes when it runs this many decode steps long.
const STALL_FACTOR: u64 = 4;
/// Requests that waited this long for their first step, on a busy engine, queued.
const QUEUE_NS: u64 = 50_000_000;
/// NVML clock-throttle reasons that slow a busy GPU: SW power cap, HW slowdown,
/// SW thermal, HW thermal, HW power brake (nvmlClocksThrottleReason*).
const THROTTLE_MASK: u64 = 0x4 | 0x8 | 0x20 | 0x40 | 0x80;

pub(super) fn run(input: &Input) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(new_connection_per_request(input));
    out.extend(proxy_holds(input));
    let prefix = no_prefix_cache(input);
    let prefix_removed = prefix.as_ref().map(|f| f.ttft.clone()).unwrap_or_default();
    out.extend(prefix);
    out.extend(prefill_stalls_decode(input));
    out.extend(queueing(input, &prefix_removed));
    out.extend(nagle(input));
    out.extend(retransmits(input));
    out.extend(slow_client(input));
    out.extend(gpu_throttled(input));
    out
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 100.0).round() / 100.0
}

fn median(v: &[u64]) -> u64 {
    crate::analyze::summarize(v).map_or(0, |s| s.p50_ns)
}

fn fig(name: &'static str, value: f64, unit: &'static str) -> Figure {
    Figure { name, value, unit }
}

fn rule_meta(n: u8) -> (&'static str, &'static str) {
    let (_, key, title) = RULES[usize::from(n) - 1];
    (key, title)
}

/// A diagnosis for rule `n` over the requests in `weights` (index -> how much each
/// shows it; the heaviest are listed first).
fn diagnosis(
    n: u8,
    requests: &[Request],
    weights: &BTreeMap<usize, u64>,
    finding: String,
    figures: Vec<Figure>,
    basis: &str,
    fix: Vec<Fix>,
) -> Diagnosis {
    let (key, title) = rule_meta(n);
    let mut ranked: Vec<(&usize, &u64)> = weights.iter().collect();
    ranked.sort_by_key(|(i, w)| (std::cmp::Reverse(**w), **i));
    let span = weights.keys().map(|&i| &requests[i]);
    let start_ns = span.clone().map(|r| r.start_ns).min().unwrap_or(0);
    let end_ns = span
        .map(|r| r.end_ns.unwrap_or(r.start_ns))
        .max()
        .unwrap_or(0);
    Diagnosis {
        rule: n,
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

/// The routes (host + path) the evidence requests went to, most frequent first.
fn scope(requests: &[Request], ids: impl Iterator<Item = usize>) -> String {
    let mut routes: BTreeMap<String, usize> = BTreeMap::new();
    for i in ids {
        *routes.entry(requests[i].route()).or_default() += 1;
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

/// Rule 1: most requests pay a TCP (and TLS) handshake because connections carry one
/// request each. Removes each such request's handshakes.
fn new_connection_per_request(input: &Input) -> Option<Finding> {
    let reqs = input.requests;
    let paid: Vec<usize> = (0..reqs.len())
        .filter(|&i| reqs[i].new_connection && !reqs[i].points.is_empty())
        .collect();
    // Used once: it carried this request only, was closed within a second of the
    // response, and the same client (address) then opened another connection to the same
    // server. A kept-alive connection that saw no second request stays open, and one
    // closed because its client was done is not followed by another.
    let close_of = |r: &Request| -> Option<u64> {
        let close = r
            .connections
            .first()
            .and_then(|&c| input.connections.get(c))
            .and_then(|c| c.close_ns)?;
        (close <= r.end_ns? + 1_000_000_000).then_some(close)
    };
    let client_ip = |r: &Request| -> String {
        r.client_addr
            .rsplit_once(':')
            .map_or(r.client_addr.clone(), |(ip, _)| ip.to_string())
    };
    let mut opened: HashMap<(String, Option<String>), Vec<u64>> = HashMap::new();
    for &i in &paid {
        opened
            .entry((client_ip(&reqs[i]), reqs[i].host.clone()))
            .or_default()
            .push(reqs[i].start_ns);
    }
    let reconnected = |r: &Request| -> bool {
        let Some(close) = close_of(r) else {
            return false;
        };
        opened
            .get(&(client_ip(r), r.host.clone()))
            .is_some_and(|starts| starts.iter().any(|&s| s >= close))
    };
    let once = paid
        .iter()
        .filter(|&&i| reqs[i].connection_requests <= 1 && reconnected(&reqs[i]))
        .count();
    // Most requests paid a handshake, and most of their connections were used once and
    // replaced by a new one.
    if paid.len() < MIN_EVIDENCE || paid.len() * 2 < reqs.len() || once * 2 < paid.len() {
        return None;
    }
    let handshake = |r: &Request| r.stages.connect_ns.unwrap_or(0) + r.stages.tls_ns.unwrap_or(0);
    let ttft: BTreeMap<usize, u64> = paid.iter().map(|&i| (i, handshake(&reqs[i]))).collect();
    let hs: Vec<u64> = ttft.values().copied().collect();
    let tls: Vec<u64> = paid.iter().filter_map(|&i| reqs[i].stages.tls_ns).collect();
    let share = paid.len() as f64 / reqs.len() as f64;
    let mut figures = vec![
        fig(
            "requests that opened a connection",
            paid.len() as f64,
            "requests",
        ),
        fig("share of requests", (share * 1000.0).round() / 10.0, "%"),
        fig("connections used once", once as f64, "connections"),
        fig("handshake p50", ms(median(&hs)), "ms"),
    ];
    if !tls.is_empty() {
        figures.push(fig("TLS handshake p50", ms(median(&tls)), "ms"));
    }
    let finding = format!(
        "{} of {} requests ({:.0}%) opened a new connection; {once} of those connections carried \
         no other request before the client opened the next: each paid a handshake of {} ms \
         (p50)",
        paid.len(),
        reqs.len(),
        share * 100.0,
        ms(median(&hs))
    );
    let diagnosis = diagnosis(
        1,
        reqs,
        &ttft,
        finding,
        figures,
        "each request that opened its connection would skip its TCP (and TLS) handshake",
        vec![
            fix(
                "nginx",
                &[
                    "keepalive_timeout 75s;  # to clients",
                    "upstream engine { server ...; keepalive 32; }",
                    "proxy_http_version 1.1; proxy_set_header Connection \"\";  # to the engine",
                    "listen 443 ssl; http2 on;  # multiplex streams on one connection",
                ],
            ),
            fix(
                "client",
                &["create the HTTP client once and reuse it (openai.OpenAI(), httpx.Client, requests.Session)"],
            ),
        ],
    );
    Some(Finding {
        diagnosis,
        ttft,
        itl: BTreeMap::new(),
    })
}

/// A proxy's pass of one response: its first token's hold, and the writes.
struct Pass {
    request: usize,
    pid: u32,
    comm: String,
    hold_ns: u64,
    compressed: bool,
    tokens: usize,
    writes_down: u32,
    writes_up: u32,
    /// Per gap index where the request's TTFT is read: how much longer (or, inside a
    /// burst, shorter) the gap is there than as the proxy read it. Unbatched, the reader
    /// would see the upstream rhythm, stalls included.
    itl_excess: BTreeMap<usize, i64>,
}

fn passes(reqs: &[Request]) -> Vec<Pass> {
    let mut out = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        for w in r.points.windows(2) {
            let (down, up) = (&w[0], &w[1]);
            if down.kind != PointKind::ProxyWrite
                || up.kind != PointKind::ProxyRead
                || down.pid != up.pid
            {
                continue;
            }
            let (Some(&d), Some(&u)) = (down.token_ns.first(), up.token_ns.first()) else {
                continue;
            };
            let at = ttft_point(r).map_or(&[][..], |p| &p.token_ns[..]);
            let itl_excess = at
                .windows(2)
                .zip(up.token_ns.windows(2))
                .enumerate()
                .filter_map(|(k, (a, b))| {
                    let excess = (a[1] - a[0]) as i64 - (b[1] - b[0]) as i64;
                    (excess != 0).then_some((k, excess))
                })
                .collect();
            out.push(Pass {
                request: i,
                pid: down.pid,
                comm: down.comm.clone(),
                hold_ns: d.saturating_sub(u),
                compressed: down.compressed,
                tokens: down.token_ns.len(),
                writes_down: down.ios.max(1),
                writes_up: up.ios.max(1),
                itl_excess,
            });
        }
    }
    out
}

/// Rules 2 and 3: a proxy holds tokens and writes them in batches. Uncompressed
/// responses show buffering alone; compressed ones show buffering and gzip
/// together, so gzip gets only what they are held beyond the uncompressed ones.
fn proxy_holds(input: &Input) -> Vec<Finding> {
    let reqs = input.requests;
    let all = passes(reqs);
    let mut by_proxy: BTreeMap<u32, Vec<&Pass>> = BTreeMap::new();
    for p in &all {
        by_proxy.entry(p.pid).or_default().push(p);
    }
    let mut out = Vec::new();
    for (pid, ps) in by_proxy {
        let comm = ps[0].comm.clone();
        let (gz, plain): (Vec<&Pass>, Vec<&Pass>) = ps.into_iter().partition(|p| p.compressed);
        let held = |v: &[&Pass]| -> bool {
            let holds: Vec<u64> = v.iter().map(|p| p.hold_ns).collect();
            v.len() >= MIN_EVIDENCE && median(&holds) >= HOLD_NS && batching(v) >= 2.0
        };
        let plain_hold = median(&plain.iter().map(|p| p.hold_ns).collect::<Vec<_>>());
        let buffering = held(&plain);
        // Buffering's share of a compressed response's delays: the typical plain hold's
        // share of its own hold (all of it for plain responses).
        let buffered_share = |p: &Pass| -> f64 {
            match (p.compressed, buffering) {
                (false, _) => 1.0,
                (true, false) => 0.0,
                (true, true) => p.hold_ns.min(plain_hold) as f64 / p.hold_ns.max(1) as f64,
            }
        };
        let removals = |v: &[&Pass], share: &dyn Fn(&Pass) -> f64| {
            let mut ttft = BTreeMap::new();
            let mut itl = BTreeMap::new();
            for p in v {
                let f = share(p);
                ttft.insert(p.request, (p.hold_ns as f64 * f) as u64);
                for (&k, &e) in &p.itl_excess {
                    itl.insert((p.request, k), (e as f64 * f) as i64);
                }
            }
            (ttft, itl)
        };
        let every: Vec<&Pass> = plain.iter().chain(&gz).copied().collect();
        if buffering {
            let (ttft, itl) = removals(&every, &buffered_share);
            out.push(hold_finding(2, reqs, &plain, ttft, itl, pid, &comm));
        }
        if held(&gz) {
            let (ttft, itl) = removals(&gz, &|p: &Pass| 1.0 - buffered_share(p));
            out.push(hold_finding(3, reqs, &gz, ttft, itl, pid, &comm));
        }
    }
    out
}

/// Token events per downstream write over per upstream read (1 = passed as read).
fn batching(v: &[&Pass]) -> f64 {
    let down: f64 = v
        .iter()
        .map(|p| p.tokens as f64 / f64::from(p.writes_down))
        .sum();
    let up: f64 = v
        .iter()
        .map(|p| p.tokens as f64 / f64::from(p.writes_up))
        .sum();
    if up == 0.0 {
        0.0
    } else {
        down / up
    }
}

fn hold_finding(
    n: u8,
    reqs: &[Request],
    evidence: &[&Pass],
    ttft: BTreeMap<usize, u64>,
    itl: BTreeMap<(usize, usize), i64>,
    pid: u32,
    comm: &str,
) -> Finding {
    let holds: Vec<u64> = evidence.iter().map(|p| p.hold_ns).collect();
    let tokens: usize = evidence.iter().map(|p| p.tokens).sum();
    let writes: u32 = evidence.iter().map(|p| p.writes_down).sum();
    let per_write = tokens as f64 / f64::from(writes.max(1));
    let weights: BTreeMap<usize, u64> = evidence.iter().map(|p| (p.request, p.hold_ns)).collect();
    let (what, basis, fixes) = if n == 2 {
        (
            "forwards each response's first token",
            "tokens would leave the proxy as they arrive (first token and gaps as read \
             upstream); compressed responses are credited only up to the uncompressed \
             responses' hold (the rest goes to gzip)",
            vec![
                fix(
                    "nginx",
                    &[
                        "proxy_buffering off;  # in the location that proxies the stream",
                        "proxy_http_version 1.1;",
                        "proxy_set_header Connection \"\";",
                    ],
                ),
                fix(
                    "server",
                    &["or send the response header X-Accel-Buffering: no"],
                ),
            ],
        )
    } else {
        (
            "forwards each gzip-compressed event stream's first token",
            "tokens would leave as they arrive, less what buffering alone holds (the \
             uncompressed responses' hold)",
            vec![
                fix(
                    "nginx",
                    &[
                        "gzip_types: leave text/event-stream out (or gzip off; in the SSE location)",
                    ],
                ),
                fix("server", &["or flush the compressor after every event (Z_SYNC_FLUSH)"]),
            ],
        )
    };
    let finding = format!(
        "{comm}/{pid} {what} {} ms (p50) after reading it, {} ms p95, and writes {per_write:.1} \
         token events per write (it read them one by one)",
        ms(median(&holds)),
        ms(crate::analyze::summarize(&holds).map_or(0, |s| s.p95_ns)),
    );
    let mut d = diagnosis(
        n,
        reqs,
        &weights,
        finding,
        vec![
            fig("responses held", evidence.len() as f64, "responses"),
            fig("first-token hold p50", ms(median(&holds)), "ms"),
            fig(
                "token events per downstream write",
                (per_write * 10.0).round() / 10.0,
                "events",
            ),
        ],
        basis,
        fixes,
    );
    d.scope = format!("{comm}/{pid}: {}", d.scope);
    Finding {
        diagnosis: d,
        ttft,
        itl,
    }
}

/// A request's prompt: how much of it an earlier request already sent (whole KiB of
/// shared prefix over its body length).
pub(super) fn shared_fractions(reqs: &[Request]) -> Vec<Option<f64>> {
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
fn prefill_cost(r: &Request) -> Option<u64> {
    match &r.gpu {
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
fn no_prefix_cache(input: &Input) -> Option<Finding> {
    let reqs = input.requests;
    let fractions = shared_fractions(reqs);
    let printed = fractions.iter().filter(|f| f.is_some()).count();
    let per_kib = |i: usize| -> Option<u64> {
        let kib = reqs[i].body_bytes? as f64 / 1024.0;
        Some((prefill_cost(&reqs[i])? as f64 / kib.max(1.0)) as u64)
    };
    let (mut sharing, mut fresh) = (Vec::new(), Vec::new());
    for (i, f) in fractions.iter().enumerate() {
        match f {
            Some(f) if *f >= 0.25 && prefill_cost(&reqs[i]).is_some() => sharing.push(i),
            Some(_) if prefill_cost(&reqs[i]).is_some() => fresh.push(i),
            _ => {}
        }
    }
    if sharing.len() < MIN_EVIDENCE || sharing.len() * 10 < printed * 3 {
        return None;
    }
    let cost: Vec<u64> = sharing
        .iter()
        .filter_map(|&i| prefill_cost(&reqs[i]))
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
        .filter_map(|&i| prefill_share_permille(input, &reqs[i]))
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
    let ttft: BTreeMap<usize, u64> = sharing
        .iter()
        .map(|&i| {
            let wait = reqs[i]
                .stages
                .upstream_wait_ns
                .or(prefill_cost(&reqs[i]))
                .unwrap_or(0);
            (i, (wait as f64 * fractions[i].unwrap_or(0.0)) as u64)
        })
        .collect();
    let shared: Vec<u64> = sharing
        .iter()
        .map(|&i| (fractions[i].unwrap_or(0.0) * 1000.0) as u64)
        .collect();
    let mut figures = vec![
        fig(
            "requests repeating an earlier prompt prefix",
            sharing.len() as f64,
            "requests",
        ),
        fig(
            "shared share of the prompt p50",
            median(&shared) as f64 / 10.0,
            "%",
        ),
        fig("prefill p50", ms(median(&cost)), "ms"),
        fig("prefill per prompt KiB p50", ms(median(&sharing_kib)), "ms"),
    ];
    if !fresh_kib.is_empty() {
        figures.push(fig(
            "prefill per KiB of new prompts p50",
            ms(median(&fresh_kib)),
            "ms",
        ));
    }
    let finding = format!(
        "{} requests start with a prompt prefix an earlier request sent ({:.0}% of the prompt, \
         p50), yet prefill takes {} ms (p50){}: the engine recomputes the shared prefix",
        sharing.len(),
        median(&shared) as f64 / 10.0,
        ms(median(&cost)),
        if fresh_kib.is_empty() {
            String::new()
        } else {
            format!(
                ", {} ms per KiB vs {} ms for new prompts",
                ms(median(&sharing_kib)),
                ms(median(&fresh_kib))
            )
        }
    );
    let diagnosis = diagnosis(
        4,
        reqs,
        &ttft,
        finding,
        figures,
        "the shared share of each repeating request's engine wait (queue + prefill) goes",
        vec![
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
    );
    Some(Finding {
        diagnosis,
        ttft,
        itl: BTreeMap::new(),
    })
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
fn prefill_stalls_decode(input: &Input) -> Option<Finding> {
    let reqs = input.requests;
    let decode = decode_step_medians(input);
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    let (mut gaps, mut steps, mut culprits) = (Vec::new(), Vec::new(), BTreeSet::new());
    for (i, r) in reqs.iter().enumerate() {
        let (Some(g), Some(engine)) = (&r.gpu, r.point(PointKind::EngineWrite)) else {
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
    let mut d = diagnosis(
        5,
        reqs,
        &weights,
        finding,
        vec![
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
        "each stalled gap would last one decode step (the prefill runs in chunks beside decodes)",
        vec![
            fix(
                "vLLM",
                &["--enable-chunked-prefill --max-num-batched-tokens 2048"],
            ),
            fix("SGLang", &["--chunked-prefill-size 2048"]),
        ],
    );
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
        itl,
    })
}

/// Rule 6: requests wait for their first step while the engine's steps run back to
/// back. Queueing a prefix cache would remove (rule 4) is not counted here.
fn queueing(input: &Input, prefix_removed: &BTreeMap<usize, u64>) -> Option<Finding> {
    let reqs = input.requests;
    let mut by_pid: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for s in input.steps {
        by_pid
            .entry(s.pid)
            .or_default()
            .push((s.start_ns, s.end_ns));
    }
    let busy = |pid: u32, from: u64, to: u64| -> f64 {
        let Some(spans) = by_pid.get(&pid) else {
            return 0.0;
        };
        let covered: u64 = spans
            .iter()
            .map(|&(a, b)| b.min(to).saturating_sub(a.max(from)))
            .sum();
        covered as f64 / (to - from).max(1) as f64
    };
    let mut ttft = BTreeMap::new();
    let mut queues = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let (Some(q), Some(arrived), Some(engine)) = (
            r.gpu.as_ref().and_then(|g| g.queue_ns),
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
    if ttft.len() < MIN_EVIDENCE || ttft.len() * 10 < reqs.len() {
        return None;
    }
    let finding = format!(
        "{} requests waited {} ms (p50) for their first GPU step while the engine ran steps \
         back to back",
        ttft.len(),
        ms(median(&queues))
    );
    let d = diagnosis(
        6,
        reqs,
        &ttft,
        finding,
        vec![
            fig("requests queued", ttft.len() as f64, "requests"),
            fig("queue p50", ms(median(&queues)), "ms"),
        ],
        "each queued request would start at once (enough capacity); queueing behind prefills \
         a prefix cache would shorten is left to that rule",
        vec![
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
    );
    Some(Finding {
        diagnosis: d,
        ttft,
        itl: BTreeMap::new(),
    })
}

/// The TCP hops of a request: sender's write -> receiver's read of the same tokens.
fn socket_hops(r: &Request) -> impl Iterator<Item = &crate::stitch::request::Forward> {
    r.forward.iter().filter(|f| {
        matches!(
            (f.from, f.to),
            (PointKind::EngineWrite, PointKind::ProxyRead)
                | (PointKind::ProxyWrite, PointKind::ClientRead)
                | (PointKind::EngineWrite, PointKind::ClientRead)
        )
    })
}

/// Retransmit times on the connections that carried a request.
fn retransmits_of(input: &Input, r: &Request) -> Vec<u64> {
    r.connections
        .iter()
        .filter_map(|&c| input.connections.get(c))
        .flat_map(|c| c.retransmits.iter().copied())
        .collect()
}

/// Rule 7: on a TCP hop that passes tokens in well under 5 ms, some token is held
/// longer than the one before it and reaches the reader a delayed-ACK timeout (Linux:
/// 40 ms at least) after that one, with no retransmit meanwhile: a small write waiting
/// (Nagle) for the ACK of the previous small segment, which the peer delays.
fn nagle(input: &Input) -> Option<Finding> {
    let reqs = input.requests;
    let (mut all, mut held) = (Vec::new(), Vec::new());
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    for (i, r) in reqs.iter().enumerate() {
        let lost = retransmits_of(input, r);
        for hop in socket_hops(r) {
            let Some(recv) = r.point(hop.to).map(|p| &p.token_ns) else {
                continue;
            };
            let d = &hop.delay_ns;
            all.extend(d.iter().copied());
            for k in 1..d.len().min(recv.len()) {
                let gap = recv[k] - recv[k - 1];
                let grew = d[k].saturating_sub(d[k - 1]);
                let sent = recv[k].saturating_sub(d[k]);
                if grew >= NAGLE_GREW_NS
                    && (NAGLE_NS.0..=NAGLE_NS.1).contains(&gap)
                    && !lost.iter().any(|&t| t >= sent && t <= recv[k])
                {
                    held.push(grew);
                    *weights.entry(i).or_insert(0) += grew;
                    // The gap before this token grew by how much longer it was held.
                    *itl.entry((i, k - 1)).or_insert(0) += grew as i64;
                }
            }
        }
    }
    if held.len() < 5 || held.len() * 100 < all.len() || median(&all) >= 5_000_000 {
        return None;
    }
    let finding = format!(
        "{} of {} tokens were held {} ms (p50) longer than the token before them on a TCP hop \
         that passes the others in {} ms, reaching the reader a delayed-ACK timeout after the \
         previous one: small writes waiting on a delayed ACK (Nagle)",
        held.len(),
        all.len(),
        ms(median(&held)),
        ms(median(&all))
    );
    let d = diagnosis(
        7,
        reqs,
        &weights,
        finding,
        vec![
            fig("tokens held", held.len() as f64, "tokens"),
            fig("hold p50", ms(median(&held)), "ms"),
            fig("hop delay p50", ms(median(&all)), "ms"),
        ],
        "each held token would cross the hop as the others do",
        vec![
            fix("server", &["setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, 1) on the streaming socket", "write each event in one write (or writev), not header and body apart"]),
            fix(
                "nginx",
                &["nginx sets TCP_NODELAY (tcp_nodelay on) only on keep-alive connections: with keepalive_timeout 0 its writes wait on ACKs; turn keep-alive on"],
            ),
        ],
    );
    Some(Finding {
        diagnosis: d,
        ttft: BTreeMap::new(),
        itl,
    })
}

/// Rule 8: TCP retransmits on a request's connections inside its long token gaps.
fn retransmits(input: &Input) -> Option<Finding> {
    let reqs = input.requests;
    let all_gaps: Vec<u64> = reqs
        .iter()
        .filter_map(ttft_point)
        .flat_map(|p| p.token_ns.windows(2).map(|w| w[1] - w[0]))
        .collect();
    let typical = median(&all_gaps);
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    let (mut spikes, mut total) = (Vec::new(), 0usize);
    for (i, r) in reqs.iter().enumerate() {
        let times = retransmits_of(input, r);
        total += times.len();
        let Some(p) = ttft_point(r) else { continue };
        for (k, w) in p.token_ns.windows(2).enumerate() {
            let gap = w[1] - w[0];
            if gap >= (3 * typical).max(50_000_000) && times.iter().any(|&t| t > w[0] && t <= w[1])
            {
                itl.insert((i, k), (gap - typical) as i64);
                *weights.entry(i).or_insert(0) += gap;
                spikes.push(gap);
            }
        }
    }
    if spikes.len() < 2 {
        return None;
    }
    let finding = format!(
        "{} token gaps of {} ms (p50, typical gap {} ms) each contain a TCP retransmit on the \
         request's own connections ({total} retransmits in all)",
        spikes.len(),
        ms(median(&spikes)),
        ms(typical)
    );
    let d = diagnosis(
        8,
        reqs,
        &weights,
        finding,
        vec![
            fig("gaps with a retransmit", spikes.len() as f64, "gaps"),
            fig("gap p50", ms(median(&spikes)), "ms"),
            fig("typical gap", ms(typical), "ms"),
            fig("retransmits", total as f64, "segments"),
        ],
        "each gap with a retransmit would last a typical gap",
        vec![fix(
            "host",
            &[
                "find where packets are lost: ss -ti (retrans), nstat -az TcpRetransSegs, NIC errors (ip -s link)",
                "check MTU and offload settings on the path; a lossy overlay or a full queue drops segments",
            ],
        )],
    );
    Some(Finding {
        diagnosis: d,
        ttft: BTreeMap::new(),
        itl,
    })
}

/// Rule 9: the delay from the last sender's write to the client's read grows over the
/// stream: the client reads slower than tokens come, the socket buffers fill, and the
/// sender's writes wait.
fn slow_client(input: &Input) -> Option<Finding> {
    let reqs = input.requests;
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    let mut lags = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let Some(hop) = r.forward.iter().find(|f| f.to == PointKind::ClientRead) else {
            continue;
        };
        let d = &hop.delay_ns;
        let (Some(&first), Some(&last)) = (d.first(), d.last()) else {
            continue;
        };
        // Steady growth, not a spike (a retransmit's, rule 8): the delay rises at most
        // tokens and from the first quarter of the stream to the third.
        let rising = d.windows(2).filter(|w| w[1] + 1_000_000 >= w[0]).count();
        let (q1, q3) = (d[d.len() / 4], d[d.len() * 3 / 4]);
        if last < 200_000_000
            || last < first + 150_000_000
            || q3 < q1 + 100_000_000
            || rising * 10 < (d.len() - 1) * 8
        {
            continue;
        }
        for (k, w) in d.windows(2).enumerate() {
            if w[1] > w[0] {
                itl.insert((i, k), (w[1] - w[0]) as i64);
            }
        }
        weights.insert(i, last);
        lags.push(last);
    }
    if weights.is_empty() {
        return None;
    }
    let finding = format!(
        "{} clients fell behind their streams: by the last token they read {} ms (p50) after \
         it was written, and the lag grew token after token",
        weights.len(),
        ms(median(&lags))
    );
    let d = diagnosis(
        9,
        reqs,
        &weights,
        finding,
        vec![
            fig("slow streams", weights.len() as f64, "requests"),
            fig("last-token lag p50", ms(median(&lags)), "ms"),
        ],
        "the client would read each token as it was written (its own ITL; the server is not slow)",
        vec![
            fix("client", &["read the stream without blocking work in the loop; do not set a small SO_RCVBUF"]),
            fix("nginx", &["send_timeout bounds how long a stalled client holds a worker connection"]),
        ],
    );
    Some(Finding {
        diagnosis: d,
        ttft: BTreeMap::new(),
        itl,
    })
}

/// Rule 10: NVML samples taken while the engine ran steps show clock throttling
/// (power or thermal) or low utilisation.
fn gpu_throttled(input: &Input) -> Option<Finding> {
    if input.steps.is_empty() || input.nvml.is_empty() {
        return None;
    }
    let running = |t: u64| {
        let k = input.steps.partition_point(|s| s.start_ns <= t);
        input.steps[..k].iter().rev().take(8).any(|s| s.end_ns >= t)
    };
    let during: Vec<&(u64, crate::ingest::model::NvmlSample)> =
        input.nvml.iter().filter(|(t, _)| running(*t)).collect();
    if during.len() < 5 {
        return None;
    }
    let throttled: Vec<&&(u64, _)> = during
        .iter()
        .filter(|(_, s)| s.throttle_reasons.unwrap_or(0) & THROTTLE_MASK != 0)
        .collect();
    let utils: Vec<u64> = during
        .iter()
        .filter_map(|(_, s)| s.gpu_util_pct.map(u64::from))
        .collect();
    let low_util = !utils.is_empty() && median(&utils) < 50;
    if throttled.len() * 5 < during.len() && !low_util {
        return None;
    }
    let mut reasons = 0u64;
    for (_, s) in &throttled {
        reasons |= s.throttle_reasons.unwrap_or(0) & THROTTLE_MASK;
    }
    let names: Vec<&str> = [
        (0x4, "SW power cap"),
        (0x8, "HW slowdown"),
        (0x20, "SW thermal"),
        (0x40, "HW thermal"),
        (0x80, "HW power brake"),
    ]
    .iter()
    .filter(|(bit, _)| reasons & bit != 0)
    .map(|(_, n)| *n)
    .collect();
    let clocks: Vec<u64> = during
        .iter()
        .filter_map(|(_, s)| s.sm_clock_mhz.map(u64::from))
        .collect();
    let finding = if throttled.len() * 5 >= during.len() {
        format!(
            "{} of {} NVML samples taken during GPU steps show clock throttling ({}); SM clock p50 {} MHz",
            throttled.len(),
            during.len(),
            names.join(", "),
            median(&clocks)
        )
    } else {
        format!(
            "GPU utilisation is {}% (p50) while the engine runs steps: the GPU waits on the host",
            median(&utils)
        )
    };
    let start_ns = during.first().map_or(0, |s| s.0);
    let end_ns = during.last().map_or(0, |s| s.0);
    // Estimate, when the recording also saw the GPU faster: a compute-bound step scales
    // with the SM clock, so a token gap that ended while a throttled sample held shrinks
    // by 1 - clock / the fastest clock seen.
    let fastest = input
        .nvml
        .iter()
        .filter_map(|(_, s)| s.sm_clock_mhz)
        .max()
        .unwrap_or(0);
    let slowed = |t: u64| -> f64 {
        let k = input.nvml.partition_point(|(ts, _)| *ts <= t);
        let Some((_, s)) = k.checked_sub(1).map(|k| &input.nvml[k]) else {
            return 0.0;
        };
        match s.sm_clock_mhz {
            Some(c) if s.throttle_reasons.unwrap_or(0) & THROTTLE_MASK != 0 && fastest > 0 => {
                1.0 - f64::from(c) / f64::from(fastest)
            }
            _ => 0.0,
        }
    };
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    for (i, r) in input.requests.iter().enumerate() {
        let Some(p) = ttft_point(r) else { continue };
        for (k, w) in p.token_ns.windows(2).enumerate() {
            let f = slowed(w[1]);
            if f > 0.0 {
                let cut = ((w[1] - w[0]) as f64 * f) as i64;
                itl.insert((i, k), cut);
                *weights.entry(i).or_insert(0u64) += cut as u64;
            }
        }
    }
    let mut ranked: Vec<(&usize, &u64)> = weights.iter().collect();
    ranked.sort_by_key(|(i, w)| (std::cmp::Reverse(**w), **i));
    let (key, title) = rule_meta(10);
    let d = Diagnosis {
        rule: 10,
        key,
        title,
        finding,
        scope: format!("GPU {}", during[0].1.device),
        evidence: Evidence {
            requests: weights.len(),
            request_ids: ranked
                .iter()
                .take(20)
                .map(|(i, _)| input.requests[**i].id)
                .collect(),
            figures: vec![
                fig("samples during steps", during.len() as f64, "samples"),
                fig("throttled samples", throttled.len() as f64, "samples"),
                fig("GPU utilisation p50", median(&utils) as f64, "%"),
                fig("SM clock p50", median(&clocks) as f64, "MHz"),
                fig("fastest SM clock seen", f64::from(fastest), "MHz"),
            ],
            start_ns,
            end_ns,
        },
        saving: Saving {
            basis: if itl.is_empty() {
                "not estimated: the recording never saw this GPU run faster, and NVML does not \
                 say how fast an unthrottled step would be"
                    .into()
            } else {
                "token gaps that ended while throttled shrink with the SM clock (compute-bound \
                 steps; the fastest clock in the recording as the unthrottled one)"
                    .into()
            },
            ..Default::default()
        },
        fix: vec![fix(
            "host",
            &[
                "nvidia-smi -q -d PERFORMANCE  # which throttle reason is active",
                "check cooling and the power limit (nvidia-smi -q -d POWER); low utilisation: the \
                 engine is host-bound (scheduling, tokenisation, a small batch)",
            ],
        )],
    };
    Some(Finding {
        diagnosis: d,
        ttft: BTreeMap::new(),
        itl,
    })
}
