//! Rule 7, Nagle / delayed ACK on a TCP hop: tokens held behind the segment before
//! them, the response head's included.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::readers::{socket_hops, Readers};
use super::{fig, fix, median, ms, Draft};
use crate::diagnose::{Finding, Input};
use crate::stitch::request::Forward;
use crate::stitch::{Point, Request};

/// A Nagle stall ends when the peer's delayed ACK fires: the held token reaches the
/// reader 35-220 ms (Linux: 40 ms minimum, 200 ms maximum) after the one before it...
const NAGLE_NS: (u64, u64) = (35_000_000, 220_000_000);
/// ... and was held on the hop at least this much longer than that one.
const NAGLE_GREW_NS: u64 = 5_000_000;
/// A response head that crosses the hop within this passed at once (nothing unacked
/// before it).
const HEAD_PROMPT_NS: u64 = 5_000_000;

/// The request's socket hops whose both points it has: the hop, the point it reaches
/// and the one it leaves.
fn measured_hops(r: &Request) -> impl Iterator<Item = (&Forward, &Point, &Point)> {
    socket_hops(r).filter_map(|hop| {
        let to = r.points.get(hop.to_point)?;
        Some((hop, to, r.points.get(hop.to_point + 1)?))
    })
}

/// Rule 7: on a TCP hop, a small write waits (Nagle) for the ACK of the segment before
/// it, which the peer delays: the held write reaches the reader a delayed-ACK timeout
/// (Linux: 40 ms at least) after the segment before it, with no retransmit meanwhile.
/// Two forms: on a hop that passes tokens in well under 5 ms, some token is held longer
/// than the one before it (ITL); or the response head passes at once and the first
/// token, written apart from it, waits for the head's ACK with every token written
/// meanwhile (TTFT: Python's http.server without TCP_NODELAY on keep-alive connections,
/// where the client's ACK is delayed; measured 43 ms of TTFT against the engine's 2 ms).
pub(super) fn nagle(input: &Input) -> Option<Finding> {
    let reqs = &input.requests[..];
    // Every token's delay on its hop: counted here, gathered (for their median) only
    // when enough tokens were held to make a finding (all of top's window's tokens
    // were pushed on every making: 5 MB, for a figure read once in a while).
    let mut all = 0;
    // Tokens held as Nagle holds them: (request, token, reader, sent, read, grew).
    let mut candidates = Vec::new();
    // First tokens held behind the response head, the same way; and every hop's head
    // delay (the hop passes the head promptly when Nagle holds the token after it).
    let (mut first_candidates, mut heads, mut firsts) = (Vec::new(), Vec::new(), 0usize);
    // One hop's delays at a time, in one buffer.
    let mut delays = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let lost = &r.retransmit_ns;
        let held = |sent: u64, read: u64| !lost.iter().any(|&t| t >= sent && t <= read);
        for (hop, to, from) in measured_hops(r) {
            delays.clear();
            delays.extend(hop.delays(&r.points));
            let (recv, d) = (&to.token_ns, &delays[..]);
            all += d.len();
            for k in 1..d.len().min(recv.len()) {
                let gap = recv[k].saturating_sub(recv[k - 1]);
                let grew = d[k].saturating_sub(d[k - 1]);
                let sent = recv[k].saturating_sub(d[k]);
                if grew >= NAGLE_GREW_NS
                    && (NAGLE_NS.0..=NAGLE_NS.1).contains(&gap)
                    && held(sent, recv[k])
                {
                    candidates.push((i, k, to.pid, sent, recv[k], grew));
                }
            }
            // The head as the token before the first one.
            let (Some(head_read), Some(head_sent), Some(&read), Some(&d0)) =
                (to.head_ns, from.head_ns, recv.first(), d.first())
            else {
                continue;
            };
            firsts += 1;
            let head = head_read.saturating_sub(head_sent);
            heads.push(head);
            let (gap, grew, sent) = (
                read.saturating_sub(head_read),
                d0.saturating_sub(head),
                read.saturating_sub(d0),
            );
            // Written apart from the head (a token in the head's own write cannot wait
            // behind it), the head crossing at once, the token a delayed ACK after it.
            if sent > head_sent
                && head < HEAD_PROMPT_NS
                && grew >= NAGLE_GREW_NS
                && (NAGLE_NS.0..=NAGLE_NS.1).contains(&gap)
                && held(sent, read)
            {
                first_candidates.push((i, to.pid, sent, read, grew));
            }
        }
    }
    // Held tokens are some of the candidates: too few of these cannot make a finding.
    // Checked before the readers' table, which indexes every token of the window (25 MB
    // for top's minute at 4k tokens/s), and then only for the readers of candidates.
    let enough = |n: usize, of: usize| n >= 5 && n * 100 >= of;
    // (Needed only when tokens_held: a held token is a candidate.)
    let all_p50 = if enough(candidates.len(), all) {
        delays.clear();
        for r in reqs {
            for (hop, _, _) in measured_hops(r) {
                delays.extend(hop.delays(&r.points));
            }
        }
        median(&delays)
    } else {
        0
    };
    let tokens_held = enough(candidates.len(), all) && all_p50 < 5_000_000;
    if !tokens_held && !enough(first_candidates.len(), firsts) {
        return None;
    }
    let pids: HashSet<u32> = candidates
        .iter()
        .map(|c| c.2)
        .chain(first_candidates.iter().map(|c| c.1))
        .collect();
    // What the sender held, with everything written behind it, was never at the reader.
    let mut windows: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
    for &(i, _, _, sent, read, _) in candidates.iter().filter(|_| tokens_held) {
        windows.entry(i).or_default().push((sent, read));
    }
    for &(i, _, sent, read, _) in &first_candidates {
        windows.entry(i).or_default().push((sent, read));
    }
    let readers = Readers::without(reqs, |pid| pids.contains(&pid), &windows);
    let mut stalled_reader = 0;
    let mut held = Vec::new();
    let mut itl = BTreeMap::new();
    let mut weights = BTreeMap::new();
    for (i, k, reader, sent, read, grew) in candidates.into_iter().filter(|_| tokens_held) {
        if readers.sat_on_other_data(reader, i, (sent, read)) {
            // The reader was late, not the segment: a busy event loop.
            stalled_reader += 1;
            continue;
        }
        held.push(grew);
        *weights.entry(i).or_insert(0) += grew;
        // The gap before this token grew by how much longer it was held.
        *itl.entry((i, k - 1)).or_insert(0) += grew as i64;
    }
    let mut first_held = Vec::new();
    let mut ttft = BTreeMap::new();
    for (i, reader, sent, read, grew) in first_candidates {
        if readers.sat_on_other_data(reader, i, (sent, read)) {
            stalled_reader += 1;
            continue;
        }
        first_held.push(grew);
        *weights.entry(i).or_insert(0) += grew;
        // The client's first token comes this much sooner (one hop holds it at most once).
        let t = ttft.entry(i).or_insert(0);
        *t = grew.max(*t);
    }
    let tokens_held = enough(held.len(), all);
    let firsts_held = enough(first_held.len(), firsts);
    if !tokens_held && !firsts_held {
        return None;
    }
    let mut parts = Vec::new();
    let mut figures = Vec::new();
    if tokens_held {
        parts.push(format!(
            "{} of {} tokens were held {} ms (p50) longer than the token before them on a TCP \
             hop that passes the others in {} ms, reaching the reader a delayed-ACK timeout \
             after the previous one",
            held.len(),
            all,
            ms(median(&held)),
            ms(all_p50)
        ));
        figures.extend([
            fig("tokens held", held.len() as f64, "tokens"),
            fig("hold p50", ms(median(&held)), "ms"),
            fig("hop delay p50", ms(all_p50), "ms"),
        ]);
    } else {
        itl.clear();
    }
    if firsts_held {
        parts.push(format!(
            "{} of {} responses' first token was held {} ms (p50) behind the response head, \
             which crossed the TCP hop in {} ms: the head and the first token were written \
             apart and the token reached the reader a delayed-ACK timeout after the head",
            first_held.len(),
            firsts,
            ms(median(&first_held)),
            ms(median(&heads))
        ));
        figures.extend([
            fig(
                "first tokens held behind the head",
                first_held.len() as f64,
                "requests",
            ),
            fig("first-token hold p50", ms(median(&first_held)), "ms"),
        ]);
    } else {
        ttft.clear();
    }
    figures.push(fig(
        "held by a busy reader instead (not counted)",
        stalled_reader as f64,
        "tokens",
    ));
    let d = Draft {
        rule: 7,
        requests: reqs,
        weights: &weights,
        finding: format!("{}: small writes waiting on a delayed ACK (Nagle)", parts.join("; ")),
        figures,
        basis: if firsts_held {
            "each held token would cross the hop as the others do, a first token as its \
             response head did"
        } else {
            "each held token would cross the hop as the others do"
        },
        fix: vec![
            fix("server", &["setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, 1) on the streaming socket", "write each event in one write (or writev), not header and body apart"]),
            fix(
                "nginx",
                &["nginx sets TCP_NODELAY (tcp_nodelay on) only on keep-alive connections: with keepalive_timeout 0 its writes wait on ACKs; turn keep-alive on"],
            ),
        ],
    }
    .diagnosis();
    Some(Finding {
        diagnosis: d,
        ttft,
        ttft_added: BTreeMap::new(),
        itl,
        instead: None,
    })
}

#[cfg(test)]
#[path = "nagle_tests.rs"]
mod tests;
