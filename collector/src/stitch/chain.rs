//! Connection ends -> request chains: loopback peers joined by 4-tuple, a
//! proxy's accepted exchange joined to the exchange it opened upstream (by
//! request body print and time), then one chain per request from the client
//! (or the first traced hop) to the engine.

use super::conn::{Conns, Exchange, Role};
use crate::ingest::fast_hash::{FastMap, FastSet};
use crate::ingest::model::CompactString;

/// An exchange at one connection end: (connection id, exchange index).
pub type End = (usize, usize);

#[derive(Debug, Default)]
pub struct Links {
    /// Processes that accept requests and also send requests upstream (proxies):
    /// their client ends are proxy reads, not client reads.
    pub proxies: std::collections::BTreeSet<u32>,
    /// Connection id -> its peer's id (the other end of a loopback connection).
    pub peer: FastMap<usize, usize>,
    /// A proxy's accepted exchange -> the upstream exchange it opened for it.
    pub upstream: FastMap<End, End>,
    /// Upstream exchanges a proxy made on its own account while holding a
    /// request (e.g. auth_request): accepted exchange -> those sub-requests.
    pub subrequests: FastMap<End, Vec<End>>,
    /// Upstream exchanges whose hop is not decided yet (`link_ready`), and the
    /// accepted exchanges they may join: their chains are not final.
    pub undecided: FastSet<End>,
    /// Accepted exchanges joined to their upstream one by the response alone (the
    /// proxy rewrote a body-less request's path): weaker evidence, said so.
    pub by_response: FastSet<End>,
    /// Accepted exchanges joined to their upstream one by the text of the tokens
    /// forwarded (a gateway that rewrote the request and re-serialised every event).
    pub by_tokens: FastSet<End>,
}

pub fn link(conns: &Conns) -> Links {
    link_ready(conns, &|_| true)
}

/// Links with some exchanges still in flight: `ready` tells the exchanges whose
/// evidence for joining a hop is in (their first SSE events, or their end). An
/// upstream exchange is joined, or left unjoined, only once it and every accepted
/// exchange it could join are ready, so the choice is the one the whole recording
/// would make.
pub fn link_ready(conns: &Conns, ready: &dyn Fn(End) -> bool) -> Links {
    let mut links = Links {
        peer: peers(conns),
        ..Default::default()
    };
    hops(conns, &mut links, ready);
    links
}

fn peers(conns: &Conns) -> FastMap<usize, usize> {
    let mut by_tuple: FastMap<(std::net::SocketAddr, std::net::SocketAddr), Vec<usize>> =
        FastMap::default();
    for c in conns.values() {
        by_tuple.entry((c.local, c.remote)).or_default().push(c.id);
    }
    let mut peer = FastMap::default();
    for c in conns.values() {
        let Some(candidates) = by_tuple.get(&(c.remote, c.local)) else {
            continue;
        };
        // Ports are reused over time: the other end whose life overlaps this one's.
        let best = candidates
            .iter()
            .filter(|&&o| {
                o != c.id && conns[&o].first_ns <= c.last_ns && c.first_ns <= conns[&o].last_ns
            })
            .min_by_key(|&&o| conns[&o].first_ns.abs_diff(c.first_ns));
        if let Some(&o) = best {
            peer.insert(c.id, o);
        }
    }
    peer
}

/// Inside each process, joins accepted exchanges to the upstream exchanges they caused.
fn hops(conns: &Conns, links: &mut Links, ready: &dyn Fn(End) -> bool) {
    // Ordered by pid so that replaying a recording always stitches it the same way.
    let mut by_pid: std::collections::BTreeMap<u32, (Vec<End>, Vec<End>)> = Default::default();
    for c in conns.values().filter(|c| c.pid != 0) {
        for i in c.live_exchange_ids() {
            let (ins, outs) = by_pid.entry(c.pid).or_default();
            match c.role {
                Role::Server => ins.push((c.id, i)),
                Role::Client => outs.push((c.id, i)),
                Role::Unknown => {}
            }
        }
    }
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    for (pid, (ins, outs)) in by_pid {
        if ins.is_empty() || outs.is_empty() {
            continue;
        }
        let joined = join_upstream(conns, links, ready, &ins, outs);
        // A process that joined a hop, or that takes encrypted requests and makes
        // its own upstream ones, is a proxy.
        if !joined.pairs.is_empty() || ins.iter().any(|&i| x(i).encrypted) {
            links.proxies.insert(pid);
        }
        assign_subrequests(conns, links, &ins, joined);
    }
}

/// One process's upstream exchanges: those joined to the accepted exchange they
/// forward, and the rest.
struct Joined {
    /// (accepted, upstream)
    pairs: Vec<(End, End)>,
    unmatched: Vec<End>,
}

/// Joins each of a process's upstream exchanges (`outs`) to the accepted one (`ins`) it
/// forwards, once the evidence is in; until then both wait in `links.undecided`.
fn join_upstream(
    conns: &Conns,
    links: &mut Links,
    ready: &dyn Fn(End) -> bool,
    ins: &[End],
    mut outs: Vec<End>,
) -> Joined {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    outs.sort_by_key(|&o| x(o).request_start_ns);
    // Accepted requests bucketed by what must match (body print, else method and
    // path), so each upstream request only looks at its own kind: linear, not
    // quadratic, in a proxy's traffic. Encrypted ones can never match.
    let mut buckets: FastMap<RequestKey, Vec<End>> = FastMap::default();
    for &i in ins.iter().filter(|&&i| !x(i).encrypted) {
        buckets.entry(RequestKey::of(x(i))).or_default().push(i);
    }
    let mut joined = Joined {
        pairs: Vec::new(),
        unmatched: Vec::new(),
    };
    for out in outs {
        let o = x(out);
        let Some(bucket) = buckets.get_mut(&RequestKey::of(o)) else {
            joined.unmatched.push(out);
            continue;
        };
        // A process that is both client and server of one loopback connection (a load
        // generator in the engine's process) did not forward the request to itself: its
        // read may even be timed a few microseconds before its own write.
        let own_peer = links.peer.get(&out.0).copied();
        let candidates = |&(_, &i): &(usize, &End)| {
            x(i).request_start_ns <= o.request_start_ns && Some(i.0) != own_peer
        };
        if !ready(out)
            || bucket
                .iter()
                .enumerate()
                .filter(candidates)
                .any(|(_, &i)| !ready(i))
        {
            // Decided once the evidence is in.
            links.undecided.insert(out);
            let open = bucket.iter().enumerate().filter(candidates);
            links.undecided.extend(open.map(|(_, &i)| i));
            continue;
        }
        // The accepted request that most recently finished arriving before this one left.
        let best = bucket
            .iter()
            .enumerate()
            .filter(candidates)
            .filter(|&(_, &i)| same_request(x(i), o))
            .max_by_key(|&(_, &i)| (x(i).request_end_ns.unwrap_or(x(i).request_start_ns), i));
        match best {
            Some((k, &i)) => {
                bucket.swap_remove(k);
                links.upstream.insert(i, out);
                joined.pairs.push((i, out));
            }
            None => joined.unmatched.push(out),
        }
    }
    let left: Vec<End> = buckets
        .into_iter()
        .filter(|(k, _)| matches!(k, RequestKey::Route(..)))
        .flat_map(|(_, v)| v)
        .collect();
    join_by_response(conns, links, ready, left, &mut joined);
    join_by_tokens(conns, links, ready, ins, &mut joined);
    joined
}

/// Tokens compared when joining a gateway's two sides (those both have so far).
const TOKENS_COMPARED: usize = 8;

/// A gateway (LiteLLM, Portkey, an AI gateway) rewrites the request body and
/// re-serialises every event: no body print, path or event fingerprint survives. What
/// does is the text of each token, hashed at capture (`protocol::shape`). An upstream
/// exchange is joined to an accepted one of the same process that was open when it was
/// sent, whose tokens carry the same texts in the same order (empty ones, such as a
/// role-only chunk, skipped) and left no earlier than they arrived from upstream; of
/// several, the one that arrived last before it (time order). Marked `by_tokens`.
fn join_by_tokens(
    conns: &Conns,
    links: &mut Links,
    ready: &dyn Fn(End) -> bool,
    ins: &[End],
    joined: &mut Joined,
) {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let free: Vec<End> = ins
        .iter()
        .copied()
        .filter(|i| !links.upstream.contains_key(i) && !x(*i).encrypted)
        .collect();
    let pass = WeakJoin {
        eligible: &|o| !texts(x(o)).is_empty(),
        candidate: &|i, o| {
            let (a, o) = (x(i), x(o));
            a.request_start_ns <= o.request_start_ns
                && a.response_end_ns
                    .is_none_or(|end| end >= o.request_start_ns)
        },
        same: &|i, o| forwarded(&texts(x(i)), &texts(x(o))),
    };
    for i in pass.join(conns, links, ready, free, joined) {
        links.by_tokens.insert(i);
    }
}

/// An exchange's first tokens that carry text: (text print, time).
fn texts(x: &Exchange) -> Vec<(u64, u64)> {
    x.tokens()
        .filter(|t| t.text_print != 0)
        .take(TOKENS_COMPARED)
        .map(|t| (t.text_print, t.ts_ns))
        .collect()
}

#[cfg(test)]
pub(super) fn forwarded_for_tests(downstream: &[(u64, u64)], upstream: &[(u64, u64)]) -> bool {
    forwarded(downstream, upstream)
}

/// `downstream` (what the gateway wrote) forwards `upstream` (what it read): the same
/// texts in order, each written no earlier than it was read.
fn forwarded(downstream: &[(u64, u64)], upstream: &[(u64, u64)]) -> bool {
    let n = downstream.len().min(upstream.len());
    n > 0
        && downstream[..n]
            .iter()
            .zip(&upstream[..n])
            .all(|(d, u)| d.0 == u.0 && d.1 >= u.1)
}

/// Body-less requests a proxy rewrote (`location /events/ { proxy_pass http://up/; }`
/// strips the prefix): no body print and a different path, so the route key cannot
/// join them. An upstream one is joined to the accepted one, of the same method, that
/// arrived last before it left and whose response began with the same events (their
/// fingerprints: the same event ids and text). Marked `by_response`.
fn join_by_response(
    conns: &Conns,
    links: &mut Links,
    ready: &dyn Fn(End) -> bool,
    ins: Vec<End>,
    joined: &mut Joined,
) {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let pass = WeakJoin {
        eligible: &|o| x(o).body_print.is_none() && !x(o).sse.is_empty(),
        candidate: &|i, o| {
            let (a, o) = (x(i), x(o));
            a.body_print.is_none()
                && a.method == o.method
                && a.request_start_ns <= o.request_start_ns
        },
        same: &|i, o| !x(i).sse.is_empty() && same_request_events(x(i), x(o)),
    };
    for i in pass.join(conns, links, ready, ins, joined) {
        links.by_response.insert(i);
    }
}

/// A join on weaker evidence than the request itself, over what the stronger ones left.
struct WeakJoin<'a> {
    /// The upstream exchange has the evidence this join reads.
    eligible: &'a dyn Fn(End) -> bool,
    /// (accepted, upstream): the accepted exchange could have caused the upstream one.
    candidate: &'a dyn Fn(End, End) -> bool,
    /// (accepted, upstream): the evidence says they carry the same request.
    same: &'a dyn Fn(End, End) -> bool,
}

impl WeakJoin<'_> {
    /// Joins each of `joined.unmatched` that is eligible to the candidate of `free` with
    /// the same request that arrived last before it (time order), once both sides'
    /// evidence is in (until then both wait in `links.undecided`); the accepted
    /// exchanges it joined.
    fn join(
        &self,
        conns: &Conns,
        links: &mut Links,
        ready: &dyn Fn(End) -> bool,
        mut free: Vec<End>,
        joined: &mut Joined,
    ) -> Vec<End> {
        let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
        let mut unmatched = Vec::new();
        let mut done = Vec::new();
        for out in std::mem::take(&mut joined.unmatched) {
            if !(self.eligible)(out) || links.undecided.contains(&out) {
                unmatched.push(out);
                continue;
            }
            let own_peer = links.peer.get(&out.0).copied();
            let candidate = |i: End| Some(i.0) != own_peer && (self.candidate)(i, out);
            if !ready(out) || free.iter().any(|&i| candidate(i) && !ready(i)) {
                links.undecided.insert(out);
                links
                    .undecided
                    .extend(free.iter().copied().filter(|&i| candidate(i)));
                continue;
            }
            let best = free
                .iter()
                .enumerate()
                .filter(|&(_, &i)| candidate(i) && (self.same)(i, out))
                .max_by_key(|&(_, &i)| (x(i).request_end_ns.unwrap_or(x(i).request_start_ns), i));
            match best {
                Some((k, &i)) => {
                    free.swap_remove(k);
                    links.upstream.insert(i, out);
                    joined.pairs.push((i, out));
                    done.push(i);
                }
                None => unmatched.push(out),
            }
        }
        joined.unmatched = unmatched;
        done
    }
}

/// Both responses begin with the same events (up to three).
fn same_request_events(inbound: &Exchange, outbound: &Exchange) -> bool {
    inbound
        .sse
        .iter()
        .zip(&outbound.sse)
        .take(3)
        .all(|(a, b)| a.fingerprint == b.fingerprint)
}

/// Unmatched upstream exchanges made while an accepted request was held (between its
/// first byte and its upstream request) are its sub-requests (auth_request runs before
/// the body is read); the latest arrival holds it. An accepted request still waiting for
/// its hop may hold any later upstream request as a sub-request: those wait with it.
fn assign_subrequests(conns: &Conns, links: &mut Links, ins: &[End], joined: Joined) {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let waiting_from = ins
        .iter()
        .filter(|i| links.undecided.contains(i))
        .map(|&i| x(i).request_start_ns)
        .min();
    for out in joined.unmatched {
        let t = x(out).request_start_ns;
        if waiting_from.is_some_and(|w| w <= t) {
            links.undecided.insert(out);
            continue;
        }
        // Prefer a held request that has no sub-request yet: requests that arrive
        // together each make their own auth_request.
        let holder = joined
            .pairs
            .iter()
            .filter(|(i, up)| {
                x(*i).request_start_ns <= t
                    && t <= x(*up).request_start_ns
                    && i.0 != out.0
                    && links.peer.get(&out.0) != Some(&i.0)
            })
            .max_by_key(|(i, _)| {
                (
                    !links.subrequests.contains_key(i),
                    x(*i).request_start_ns,
                    *i,
                )
            });
        if let Some(&(i, _)) = holder {
            links.subrequests.entry(i).or_default().push(out);
        }
    }
}

/// The same request seen before and after a proxy: equal body prints when both
/// have one, else the same method and path. When both responses carry SSE events, the proxy forwarded the same
/// events: their first fingerprints must agree. That rules out a process that is
/// both a server and an unrelated client (an engine that also runs the load).
fn same_request(inbound: &Exchange, outbound: &Exchange) -> bool {
    // An encrypted inbound request has nothing to compare, and time alone is
    // ambiguous under concurrency: such hops stay unjoined rather than guessed.
    let requests_agree = !inbound.encrypted
        && match (inbound.body_print, outbound.body_print) {
            (Some(a), Some(b)) => a == b,
            (None, None) => inbound.method == outbound.method && inbound.path == outbound.path,
            _ => false,
        };
    requests_agree && same_request_events(inbound, outbound)
}

/// What an accepted request and the upstream request it caused have in common.
#[derive(Clone, PartialEq, Eq, Hash)]
enum RequestKey {
    Body(u64, u64),
    Route(CompactString, CompactString),
}

impl RequestKey {
    fn of(x: &Exchange) -> RequestKey {
        match x.body_print {
            Some((hash, len)) => RequestKey::Body(hash, len),
            None => RequestKey::Route(x.method.clone(), x.path.clone()),
        }
    }
}

/// The other end of an exchange, when its connection's peer was traced.
pub fn peer_end(conns: &Conns, links: &Links, end: End) -> Option<End> {
    let peer = *links.peer.get(&end.0)?;
    let x = conns[&end.0].exchange(end.1);
    let p = conns.get(&peer)?;
    // HTTP/2 streams pair by id (either end may have joined mid-connection);
    // HTTP/1.x exchanges pair in order.
    let other = match x.stream_id {
        Some(id) => p
            .exchanges
            .iter()
            .position(|x| x.stream_id == Some(id))
            .map(|i| (peer, p.exchange_base + i)),
        None => p.exchange_ids().contains(&end.1).then_some((peer, end.1)),
    }?;
    // Exchanges cut from TLS records at one end do not pair with plaintext ones.
    (p.exchange(other.1).encrypted == x.encrypted).then_some(other)
}

/// A client end seen only as TLS records whose server end has the plaintext (a
/// client on rustls or Go talking to an OpenSSL server): the server end tells the
/// request, so the client end's record-cut exchanges start no chain of their own.
fn opaque_client(conns: &Conns, links: &Links, id: usize) -> bool {
    let c = &conns[&id];
    c.role == Role::Client
        && c.tls.is_some()
        && !c.plaintext
        && links
            .peer
            .get(&id)
            .is_some_and(|p| conns.get(p).is_some_and(|p| p.plaintext))
}

/// One chain per request, ordered from the client end to the engine end.
pub fn chains(conns: &Conns, links: &Links) -> Vec<Vec<End>> {
    let mut downstream_of: FastMap<End, End> = FastMap::default(); // upstream end -> accepted end
    for (&i, &o) in &links.upstream {
        downstream_of.insert(o, i);
    }
    let sub: FastSet<End> = links.subrequests.values().flatten().copied().collect();
    let mut chains = Vec::new();
    for c in conns.values() {
        for i in c.live_exchange_ids() {
            let end = (c.id, i);
            let is_root = match c.role {
                // A client end starts a chain unless a proxy opened it for an accepted request.
                Role::Client => {
                    !downstream_of.contains_key(&end)
                        && !sub.contains(&end)
                        && !opaque_client(conns, links, c.id)
                }
                // A server end starts one when its client was not traced (or only
                // as TLS records).
                Role::Server => peer_end(conns, links, end).is_none_or(|p| {
                    conns[&p.0].role != Role::Client || opaque_client(conns, links, p.0)
                }),
                Role::Unknown => false,
            };
            if !is_root {
                continue;
            }
            let mut chain = vec![end];
            let mut cur = end;
            loop {
                let next = match conns[&cur.0].role {
                    Role::Client => {
                        peer_end(conns, links, cur).filter(|p| conns[&p.0].role == Role::Server)
                    }
                    _ => links.upstream.get(&cur).copied(),
                };
                match next {
                    Some(n) if !chain.contains(&n) => {
                        chain.push(n);
                        cur = n;
                    }
                    _ => break,
                }
            }
            chains.push(chain);
        }
    }
    chains.sort_by_key(|ch| conns[&ch[0].0].exchange(ch[0].1).request_start_ns);
    chains
}
