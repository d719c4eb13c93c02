//! Rules read from connections, a proxy's two sides and TCP hops: new connection per
//! request (1), proxy buffering (2), compression buffering (3), retransmits (8), slow
//! client (9). Nagle / delayed ACK (7) is nagle.rs.

use std::collections::{BTreeMap, HashMap};

use super::{fig, fix, median, ms, Draft, MIN_EVIDENCE};
use crate::diagnose::{ttft_point, Finding, Input, Instead};
use crate::stitch::{PointKind, Request};

/// A proxy holds a token when it forwards it this much later than it read it.
const HOLD_NS: u64 = 10_000_000;

/// Rule 1: most requests pay a TCP (and TLS) handshake because connections carry one
/// request each. Removes each such request's handshakes.
pub(super) fn new_connection_per_request(input: &Input) -> Option<Finding> {
    let reqs = &input.requests[..];
    let paid: Vec<usize> = (0..reqs.len())
        .filter(|&i| reqs[i].new_connection && !reqs[i].points.is_empty())
        .collect();
    let once = used_once(reqs, &paid);
    // Most requests paid a handshake, and most of their connections were used once and
    // replaced by a new one.
    if paid.len() < MIN_EVIDENCE || paid.len() * 2 < reqs.len() || once * 2 < paid.len() {
        return None;
    }
    let handshake = |r: &Request| r.stages.connect_ns.unwrap_or(0) + r.stages.tls_ns.unwrap_or(0);
    let ttft: BTreeMap<usize, u64> = paid.iter().map(|&i| (i, handshake(reqs[i]))).collect();
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
    // Over HTTP/2 the server already multiplexes: each connection carrying one stream
    // means the client opens a new one per request, so the fix is the client's.
    let http2 = paid.iter().filter(|&&i| reqs[i].http2).count() * 2 > paid.len();
    let nginx_lines: &[&'static str] = if http2 {
        &["keepalive_timeout 75s;  # HTTP/2 connections idle this long before closing"]
    } else {
        &[
            "keepalive_timeout 75s;  # to clients",
            "upstream engine { server ...; keepalive 32; }",
            "proxy_http_version 1.1; proxy_set_header Connection \"\";  # to the engine",
            "listen 443 ssl; http2 on;  # multiplex streams on one connection",
        ]
    };
    let finding = format!(
        "{} of {} requests ({:.0}%) opened a new connection{}; {once} of those connections carried \
         no other request before the client opened the next: each paid a handshake of {} ms \
         (p50)",
        paid.len(),
        reqs.len(),
        share * 100.0,
        if http2 {
            " (HTTP/2: one stream each, where one connection could carry them all)"
        } else {
            ""
        },
        ms(median(&hs))
    );
    let diagnosis = Draft {
        rule: 1,
        requests: reqs,
        weights: &ttft,
        finding,
        figures,
        basis: "each request that opened its connection would skip its TCP (and TLS) handshake",
        fix: vec![
            fix("nginx", nginx_lines),
            fix(
                "client",
                &["create the HTTP client once and reuse it (openai.OpenAI(), httpx.Client, requests.Session)"],
            ),
        ],
    }
    .diagnosis();
    Some(Finding {
        diagnosis,
        ttft,
        ttft_added: BTreeMap::new(),
        itl: BTreeMap::new(),
        instead: None,
    })
}

/// Of the requests that opened their connection (`paid`), how many connections were used
/// once and replaced.
fn used_once(reqs: &[&Request], paid: &[usize]) -> usize {
    // Used once: it carried this request only, was closed within a second of the
    // response, and the same client (address) then opened another connection to the same
    // server. A kept-alive connection that saw no second request stays open, and one
    // closed because its client was done is not followed by another.
    let close_of = |r: &Request| -> Option<u64> {
        let close = r.connection_close_ns?;
        (close <= r.end_ns? + 1_000_000_000).then_some(close)
    };
    let client_ip = |r: &Request| -> String {
        r.client_addr
            .rsplit_once(':')
            .map_or(r.client_addr.clone(), |(ip, _)| ip.to_string())
    };
    let mut opened: HashMap<(String, Option<String>), Vec<u64>> = HashMap::new();
    for &i in paid {
        opened
            .entry((client_ip(reqs[i]), reqs[i].host.clone()))
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
    paid.iter()
        .filter(|&&i| reqs[i].connection_requests <= 1 && reconnected(reqs[i]))
        .count()
}

/// A proxy's pass of one response: its first token's hold, and the writes.
struct Pass<'r> {
    request: usize,
    pid: u32,
    comm: &'r str,
    hold_ns: u64,
    compressed: bool,
    tokens: usize,
    writes_down: u32,
    writes_up: u32,
    /// When the proxy read each token upstream.
    read_ns: &'r [u64],
    /// Tokens read upstream by the proxy's first write downstream.
    read_by_first_write: usize,
    /// The tokens where the request's TTFT is read.
    at: &'r [u64],
}

impl Pass<'_> {
    /// Per gap index where the request's TTFT is read: how much longer (or, inside a
    /// burst, shorter) the gap is there than as the proxy read it. Unbatched, the reader
    /// would see the upstream rhythm, stalls included. Read only when a rule fires (a
    /// map of every gap of a window was 7.8 MB of each of top's findings makings).
    fn itl_excess(&self) -> impl Iterator<Item = (usize, i64)> + '_ {
        self.at
            .windows(2)
            .zip(self.read_ns.windows(2))
            .enumerate()
            .filter_map(|(k, (a, b))| {
                let excess = (a[1] - a[0]) as i64 - (b[1] - b[0]) as i64;
                (excess != 0).then_some((k, excess))
            })
    }
}

fn passes<'r>(reqs: &[&'r Request]) -> Vec<Pass<'r>> {
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
            out.push(Pass {
                request: i,
                pid: down.pid,
                comm: &down.comm,
                hold_ns: d.saturating_sub(u),
                compressed: down.compressed,
                tokens: down.token_ns.len(),
                writes_down: down.ios.max(1),
                writes_up: up.ios.max(1),
                read_ns: &up.token_ns,
                read_by_first_write: up.token_ns.iter().take_while(|&&t| t <= d).count(),
                at: ttft_point(r).map_or(&[][..], |p| &p.token_ns[..]),
            });
        }
    }
    out
}

/// Rules 2 and 3: a proxy holds tokens and writes them in batches. Uncompressed
/// responses show buffering alone; compressed ones show buffering and gzip together.
/// Buffering releases a response once its buffer fills (or the response ends): the
/// uncompressed responses show how many tokens that takes. Compression holds the rest,
/// as its compressed output fills a buffer far later. With buffering off, nginx
/// compresses each event as it arrives (a flush per read), so rule 2's fix removes the
/// compressed responses' whole hold too, and rule 3's fix then has nothing left.
pub(super) fn proxy_holds(input: &Input) -> Vec<Finding> {
    let reqs = &input.requests[..];
    let all = passes(reqs);
    // Per proxy process and route: one nginx serves many locations, each with its own
    // buffering and gzip settings; mixed behaviour is never averaged away.
    // Each distinct route's string made once, not once per pass.
    let mut routes: HashMap<(Option<&str>, &str), String> = HashMap::new();
    for p in &all {
        let r = reqs[p.request];
        routes
            .entry((r.host.as_deref(), &r.path))
            .or_insert_with(|| r.route());
    }
    let mut by_proxy: BTreeMap<(u32, &str), Vec<&Pass<'_>>> = BTreeMap::new();
    for p in &all {
        let r = reqs[p.request];
        let route = &routes[&(r.host.as_deref(), r.path.as_str())];
        by_proxy.entry((p.pid, route)).or_default().push(p);
    }
    let mut out = Vec::new();
    for ((pid, _), ps) in by_proxy {
        let comm = ps[0].comm;
        let (gz, plain): (Vec<&Pass>, Vec<&Pass>) = ps.into_iter().partition(|p| p.compressed);
        let held = |v: &[&Pass]| -> bool {
            let holds: Vec<u64> = v.iter().map(|p| p.hold_ns).collect();
            v.len() >= MIN_EVIDENCE && median(&holds) >= HOLD_NS && batching(v) >= 2.0
        };
        let buffering = held(&plain);
        // The tokens buffering alone waits for before its first write (typically).
        let fills_at = buffering.then(|| {
            let n: Vec<u64> = plain.iter().map(|p| p.read_by_first_write as u64).collect();
            median(&n).max(1) as usize
        });
        // Buffering's share of a response's hold: all of it uncompressed; compressed, up
        // to when buffering alone would have written it (the token that fills the
        // buffer, or the response's end, read upstream).
        let buffered_share = |p: &Pass| -> f64 {
            match (p.compressed, fills_at) {
                (false, _) => 1.0,
                (true, None) => 0.0,
                (true, Some(n)) => {
                    let (Some(&first), Some(&release)) =
                        (p.read_ns.first(), p.read_ns.get(n.min(p.read_ns.len()) - 1))
                    else {
                        return 0.0;
                    };
                    (release.saturating_sub(first) as f64 / p.hold_ns.max(1) as f64).min(1.0)
                }
            }
        };
        let removals = |v: &[&Pass], share: &dyn Fn(&Pass) -> f64| {
            let mut ttft = BTreeMap::new();
            let mut itl = BTreeMap::new();
            for p in v {
                let f = share(p);
                ttft.insert(p.request, (p.hold_ns as f64 * f) as u64);
                for (k, e) in p.itl_excess() {
                    itl.insert((p.request, k), (e as f64 * f) as i64);
                }
            }
            (ttft, itl)
        };
        let every: Vec<&Pass> = plain.iter().chain(&gz).copied().collect();
        if buffering {
            let (ttft, itl) = removals(&every, &|_: &Pass| 1.0);
            out.push(hold_finding(2, reqs, &plain, ttft, itl, (pid, comm)));
        }
        if held(&gz) {
            let (ttft, itl) = removals(&gz, &|p: &Pass| 1.0 - buffered_share(p));
            let mut f = hold_finding(3, reqs, &gz, ttft, itl, (pid, comm));
            if buffering {
                f.instead = Some(Instead {
                    rule: 2,
                    ttft: BTreeMap::new(),
                    itl: Some(BTreeMap::new()),
                });
            }
            out.push(f);
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
    reqs: &[&Request],
    evidence: &[&Pass],
    ttft: BTreeMap<usize, u64>,
    itl: BTreeMap<(usize, usize), i64>,
    (pid, comm): (u32, &str),
) -> Finding {
    let path = &reqs[evidence[0].request].path;
    let holds: Vec<u64> = evidence.iter().map(|p| p.hold_ns).collect();
    let tokens: usize = evidence.iter().map(|p| p.tokens).sum();
    let writes: u32 = evidence.iter().map(|p| p.writes_down).sum();
    let per_write = tokens as f64 / f64::from(writes.max(1));
    let weights: BTreeMap<usize, u64> = evidence.iter().map(|p| (p.request, p.hold_ns)).collect();
    let (what, basis, fixes) = if n == 2 {
        (
            "forwards each response's first token",
            "tokens would leave the proxy as they arrive (first token and gaps as read \
             upstream), compressed responses too (unbuffered, nginx compresses each event \
             as it arrives)",
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
            "compressed responses would leave when buffering alone releases them (as \
             uncompressed ones do: once as many tokens were read as fill their first write, \
             or at the response's end); with buffering off too, tokens leave as they arrive",
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
        "{comm}/{pid}, on {path}, {what} {} ms (p50) after reading it, {} ms p95, and writes \
         {per_write:.1} token events per write (it read them one by one)",
        ms(median(&holds)),
        ms(crate::analyze::summarize(&holds).map_or(0, |s| s.p95_ns)),
    );
    let mut d = Draft {
        rule: n,
        requests: reqs,
        weights: &weights,
        finding,
        figures: vec![
            fig("responses held", evidence.len() as f64, "responses"),
            fig("first-token hold p50", ms(median(&holds)), "ms"),
            fig(
                "token events per downstream write",
                (per_write * 10.0).round() / 10.0,
                "events",
            ),
        ],
        basis,
        fix: fixes,
    }
    .diagnosis();
    d.scope = format!("{comm}/{pid}: {}", d.scope);
    Finding {
        diagnosis: d,
        ttft,
        ttft_added: BTreeMap::new(),
        itl,
        instead: None,
    }
}

/// Rule 8: TCP retransmits on a request's connections inside its long token gaps.
pub(super) fn retransmits(input: &Input) -> Option<Finding> {
    let reqs = &input.requests[..];
    // A spike needs a retransmit inside it: none seen, no typical gap to work out.
    if reqs.iter().all(|r| r.retransmit_ns.is_empty()) {
        return None;
    }
    let mut all_gaps: Vec<u64> = reqs
        .iter()
        .filter_map(|r| ttft_point(r))
        .flat_map(|p| p.itl_ns())
        .collect();
    let typical = crate::analyze::percentile_in_place(&mut all_gaps, 500);
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    let (mut spikes, mut total) = (Vec::new(), 0usize);
    for (i, r) in reqs.iter().enumerate() {
        let times = &r.retransmit_ns;
        total += times.len();
        let Some(p) = ttft_point(r) else { continue };
        for (k, w) in p.token_ns.windows(2).enumerate() {
            let gap = w[1] - w[0];
            if gap <= 2 * typical || !times.iter().any(|&t| t > w[0] && t <= w[1]) {
                continue;
            }
            // Every gap a retransmit lengthened goes back to a typical one; the trigger
            // counts only the spikes (a loss recovered by RTO, not by fast retransmit).
            itl.insert((i, k), (gap - typical) as i64);
            if gap >= (3 * typical).max(50_000_000) {
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
    let d = Draft {
        rule: 8,
        requests: reqs,
        weights: &weights,
        finding,
        figures: vec![
            fig("gaps with a retransmit", spikes.len() as f64, "gaps"),
            fig("gap p50", ms(median(&spikes)), "ms"),
            fig("typical gap", ms(typical), "ms"),
            fig("retransmits", total as f64, "segments"),
        ],
        basis: "each gap with a retransmit, over twice the typical gap, would last a typical gap",
        fix: vec![fix(
            "host",
            &[
                "find where packets are lost: ss -ti (retrans), nstat -az TcpRetransSegs, NIC errors (ip -s link)",
                "check MTU and offload settings on the path; a lossy overlay or a full queue drops segments",
            ],
        )],
    }
    .diagnosis();
    Some(Finding::itl_only(d, itl))
}

/// Rule 9: the delay from the last sender's write to the client's read grows over the
/// stream: the client reads slower than tokens come, the socket buffers fill, and the
/// sender's writes wait.
pub(super) fn slow_client(input: &Input) -> Option<Finding> {
    let reqs = &input.requests[..];
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    let mut lags = Vec::new();
    let mut delays = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let Some(hop) = r.forward.iter().find(|f| f.to == PointKind::ClientRead) else {
            continue;
        };
        delays.clear();
        delays.extend(hop.delays(&r.points));
        let d = &delays[..];
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
    let d = Draft {
        rule: 9,
        requests: reqs,
        weights: &weights,
        finding,
        figures: vec![
            fig("slow streams", weights.len() as f64, "requests"),
            fig("last-token lag p50", ms(median(&lags)), "ms"),
        ],
        basis: "the client would read each token as it was written (its own ITL; the server is not slow)",
        fix: vec![
            fix("client", &["read the stream without blocking work in the loop; do not set a small SO_RCVBUF"]),
            fix("nginx", &["send_timeout bounds how long a stalled client holds a worker connection"]),
        ],
    }
    .diagnosis();
    Some(Finding::itl_only(d, itl))
}
