//! A request built from its chain of connection ends: its points (the tokens at each
//! end), stages, spans and what the ends say of it (`build`).

use super::{Forward, Point, PointKind, Request, Stages};
use crate::ingest::hosts::split_pid;
use crate::ingest::model::TokenKind;
use crate::stitch::chain::End;
use crate::stitch::conn::{Connection, Conns, Exchange, Role};
use crate::stitch::spans::ChainSpans;

pub fn build(
    id: usize,
    conns: &Conns,
    chain: &[End],
    links: &crate::stitch::chain::Links,
    dropped: bool,
) -> Request {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let root = chain[0];
    let (rc, rx) = (&conns[&root.0], x(root));
    let Start {
        new_connection,
        connector,
        start_ns,
        first_byte_ns,
    } = start(conns, root, links);
    let last = chain.len() - 1;
    let mut points: Vec<Point> = chain
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let c = &conns[&e.0];
            let kind = match (c.role, i) {
                (Role::Client, 0) if !links.proxies.contains(&c.pid) => PointKind::ClientRead,
                (Role::Client, _) => PointKind::ProxyRead,
                // The last end traced, unless that process is a proxy (a hop it forwarded
                // but that could not be joined upstream, e.g. a stream older than the recording).
                (_, i) if i == last && !links.proxies.contains(&c.pid) => PointKind::EngineWrite,
                _ => PointKind::ProxyWrite,
            };
            point(kind, c, x(e), start_ns)
        })
        .collect();
    if let Some(client) = connector.and_then(|c| mapped_client_point(rc, c, rx, start_ns)) {
        points.insert(0, client);
    }

    let spans = crate::stitch::spans::chain_spans(new_connection, conns, chain, links);
    let mut stages = stages(&spans, conns, chain, new_connection, connector);
    let engine = x(chain[last]);
    if spans.gateway.is_some() {
        let client = points
            .iter()
            .find(|p| p.kind != PointKind::EngineWrite && !p.token_ns.is_empty());
        let engine_point = points.iter().rfind(|p| p.kind == PointKind::EngineWrite);
        if let (Some(c), Some(e)) = (client.and_then(|c| c.ttft_ns), engine_point) {
            let engine_ttft = e
                .token_ns
                .first()
                .map(|t| t.saturating_sub(engine.request_start_ns));
            stages.gateway_ttft_ns = engine_ttft.map(|t| c.saturating_sub(t));
        }
    }

    let forward = forwards(&points);
    let chunk_mismatches = chunk_mismatches(conns, chain);

    let end_ns = rx.response_end_ns.or(rx.sse.last().map(|e| e.ts_ns));
    // The head as the first end that saw it: a client whose request bytes went untied
    // (a TLS session older than the recording) still has it decoded at the proxy.
    let head = chain
        .iter()
        .map(|&e| x(e))
        .find(|x| !x.method.is_empty())
        .unwrap_or(rx);
    // A path that end could not decode (an HTTP/2 header referring to an HPACK table
    // entry made before the recording, or a write the probes missed) is read from the
    // next end that decoded it.
    let path = chain
        .iter()
        .map(|&e| &x(e).path)
        .find(|p| !p.is_empty())
        .unwrap_or(&head.path);
    Request {
        id,
        method: head.method.as_str().to_owned(),
        // Without plaintext there is no path; the route is the server it went to.
        path: if rx.encrypted {
            "(encrypted)".into()
        } else {
            path.as_str().to_owned()
        },
        host: if rx.encrypted {
            Some(
                if rc.role == Role::Server {
                    rc.local
                } else {
                    rc.remote
                }
                .to_string(),
            )
        } else {
            head.host.clone()
        },
        trace_parent: chain.iter().find_map(|&e| x(e).trace_parent.clone()),
        encrypted: rx.encrypted,
        http2: rx.stream_id.is_some(),
        attached_mid: head.attached_mid,
        join: if chain.iter().any(|e| links.by_tokens.contains(e)) {
            Some("by-tokens")
        } else {
            chain
                .iter()
                .any(|e| links.by_response.contains(e))
                .then_some("by-response")
        },
        status: rx
            .status
            .or_else(|| chain.iter().find_map(|&e| x(e).status)),
        api: api(chain.iter().map(|&e| x(e))),
        reasoning_tokens: rx
            .tokens()
            .filter(|t| t.token == TokenKind::Reasoning)
            .count() as u32,
        tool_tokens: rx.tokens().filter(|t| t.token == TokenKind::Tool).count() as u32,
        client_pid: rc.pid,
        client_comm: rc.comm.clone(),
        client_addr: if rc.role == Role::Client {
            rc.local.to_string()
        } else {
            rc.remote.to_string()
        },
        start_ns,
        first_byte_ns,
        end_ns,
        new_connection,
        connection_requests: rc.exchange_count(),
        connections: chain.iter().map(|e| e.0).collect(),
        connection_close_ns: rc.close_ns,
        order: (rx.request_start_ns, root.0, root.1),
        spans: (rx.request_start_ns == first_byte_ns).then_some(spans),
        retransmit_ns: chain
            .iter()
            .flat_map(|e| conns[&e.0].retransmits.iter().copied())
            .filter(|&t| start_ns <= t && end_ns.is_none_or(|end| t <= end))
            .collect(),
        body_bytes: engine.body_print.or(rx.body_print).map(|p| p.1),
        prefix_prints: if engine.prefix_prints.is_empty() {
            rx.prefix_prints.clone()
        } else {
            engine.prefix_prints.clone()
        },
        tls: rc.tls.is_some(),
        coalesced: points.iter().any(|p| p.max_tokens_per_io > 1),
        truncated: !rx.encrypted && !rx.done() && rx.response_end_ns.is_none(),
        events_dropped: dropped,
        chunk_mismatches,
        stages,
        engine_received_ns: (conns[&chain[last].0].role == Role::Server)
            .then(|| engine.request_end_ns.unwrap_or(engine.request_start_ns)),
        gpu: None,
        points,
        forward,
    }
}

/// When a request started: its connect() when it opened its connection, else its first
/// request byte (at the client's socket when only the server end had plaintext).
struct Start<'a> {
    new_connection: bool,
    /// A server end's client traced only as TLS records: its socket still tells when it
    /// connected and sent.
    connector: Option<&'a Connection>,
    start_ns: u64,
    first_byte_ns: u64,
}

fn start<'a>(conns: &'a Conns, root: End, links: &crate::stitch::chain::Links) -> Start<'a> {
    let (rc, rx) = (&conns[&root.0], conns[&root.0].exchange(root.1));
    let new_connection = root.1 == 0
        && (rc.connect_ns.is_some() || rc.accept_ns.is_some() || rc.established_ns.is_some());
    // A server end whose client was traced only as TLS records (no plaintext there):
    // the client's own socket still tells when it connected.
    let connector = links
        .peer
        .get(&root.0)
        .and_then(|p| conns.get(p))
        .filter(|p| rc.role == Role::Server && p.role == Role::Client && p.connect_ns.is_some());
    let start_ns = match (new_connection, rc.role) {
        (true, Role::Client) => rc.connect_ns.unwrap_or(rx.request_start_ns),
        (true, _) if connector.is_some() => connector
            .and_then(|c| c.connect_ns)
            .unwrap_or(rx.request_start_ns)
            .min(rx.request_start_ns),
        (true, _) => rc
            .established_ns
            .or(rc.accept_ns)
            .unwrap_or(rx.request_start_ns)
            .min(rx.request_start_ns),
        (false, _) => rx.request_start_ns,
    };
    // That client's socket also tells, through the connection's byte stream, when it
    // sent this request and when it read each token (see stitch::wire).
    let client_sent =
        connector.and_then(|c| crate::stitch::wire::peer_send_ns(rc, c, rx.request_start_ns));
    let first_byte_ns = client_sent.map_or(rx.request_start_ns, |t| t.min(rx.request_start_ns));
    let start_ns = if new_connection {
        start_ns
    } else {
        first_byte_ns
    };
    Start {
        new_connection,
        connector,
        start_ns,
        first_byte_ns,
    }
}

/// Where a request's time went before its first token: the lengths of its chain's
/// spans (handshakes, upload, the proxy's hold and its sub-requests), and the engine's
/// wait.
fn stages(
    spans: &ChainSpans,
    conns: &Conns,
    chain: &[End],
    new_connection: bool,
    connector: Option<&Connection>,
) -> Stages {
    let len = |s: Option<(u64, u64)>| s.map(|(a, b)| b.saturating_sub(a));
    // The client's own socket, when only it saw the handshake.
    let connect = match connector {
        Some(c) if new_connection => c.handshake(),
        _ => spans.connect,
    };
    let last = chain[chain.len() - 1];
    let engine = conns[&last.0].exchange(last.1);
    Stages {
        connect_ns: len(connect),
        tls_ns: len(spans.tls),
        upload_ns: len(spans.upload),
        gateway_ns: len(spans.gateway),
        subrequest_ns: (!spans.subrequests.is_empty()).then(|| {
            spans
                .subrequests
                .iter()
                .map(|(_, a, b)| b.saturating_sub(*a))
                .sum()
        }),
        upstream_wait_ns: (conns[&last.0].role == Role::Server)
            .then(|| {
                let received = engine.request_end_ns.unwrap_or(engine.request_start_ns);
                let first = engine.tokens().next()?;
                Some(first.ts_ns.saturating_sub(received))
            })
            .flatten(),
        gateway_ttft_ns: None,
    }
}

/// The API of the first exchange of the chain whose events tell it; `json` for a plain
/// JSON answer.
fn api<'a>(mut exchanges: impl Iterator<Item = &'a Exchange> + Clone) -> Option<&'static str> {
    if let Some(api) = exchanges.clone().find_map(Exchange::api) {
        return Some(api.label());
    }
    exchanges.any(|x| x.json).then_some("json")
}

/// The hops between adjacent points, engine side first.
fn forwards(points: &[Point]) -> Vec<Forward> {
    (0..points.len().saturating_sub(1))
        .rev()
        .map(|k| Forward::between(points, k))
        .collect()
}

/// Tokens whose chunk differs from one hop to the next (a proxy re-chunked the stream).
fn chunk_mismatches(conns: &Conns, chain: &[End]) -> u32 {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let mut chunk_mismatches = 0;
    for w in chain.windows(2) {
        let (a, b) = (x(w[0]), x(w[1]));
        chunk_mismatches += a
            .tokens()
            .zip(b.tokens())
            .filter(|(p, q)| p.fingerprint != q.fingerprint)
            .count() as u32;
    }
    chunk_mismatches
}

/// The client-read point of a client seen only as TLS records: each token the server
/// wrote, at the client's read that took in its bytes. None unless every token maps.
fn mapped_client_point(
    server: &Connection,
    client: &Connection,
    x: &Exchange,
    start_ns: u64,
) -> Option<Point> {
    let mut token_ns = Vec::new();
    let mut per_read: std::collections::HashMap<usize, u32> = std::collections::HashMap::new();
    for t in x.tokens() {
        let (ts, read) = crate::stitch::wire::peer_read_ns(server, client, t.ts_ns)?;
        token_ns.push(ts);
        *per_read.entry(read).or_default() += 1;
    }
    Some(Point {
        kind: PointKind::ClientRead,
        pid: client.pid,
        host: split_pid(client.pid).0,
        comm: client.comm.clone(),
        ttft_ns: token_ns.first().map(|t| t.saturating_sub(start_ns)),
        token_ns,
        head_ns: x
            .response_first_ns
            .and_then(|t| crate::stitch::wire::peer_read_ns(server, client, t))
            .map(|(ts, _)| ts),
        ios: per_read.len() as u32,
        max_tokens_per_io: per_read.values().copied().max().unwrap_or(0),
        done: x.done(),
        compressed: x.compressed,
        record_ns: Vec::new(),
        token_choice: choices(x),
    })
}

/// Each token's choice, when some token is not choice 0.
fn choices(x: &Exchange) -> Vec<u32> {
    if x.tokens().all(|t| t.choice == 0) {
        return Vec::new();
    }
    x.tokens().map(|t| t.choice).collect()
}

fn point(kind: PointKind, c: &Connection, x: &Exchange, start_ns: u64) -> Point {
    // Sized once: collected from the filter it doubled to 128 slots for 65 tokens, and a
    // window of finished requests (top) holds four of these per request.
    let mut token_ns = Vec::with_capacity(x.sse.len());
    token_ns.extend(x.tokens().map(|t| t.ts_ns));
    // A plain JSON answer's first token is its first body byte.
    let first = token_ns
        .first()
        .copied()
        .or_else(|| x.json.then_some(x.response_body_ns).flatten());
    Point {
        kind,
        pid: c.pid,
        host: split_pid(c.pid).0,
        comm: c.comm.clone(),
        ttft_ns: first.map(|t| t.saturating_sub(start_ns)),
        token_ns,
        head_ns: x.response_first_ns,
        ios: x.response_ios,
        max_tokens_per_io: max_per_io(|| x.tokens().map(|t| t.io)),
        done: x.done(),
        compressed: x.compressed,
        record_ns: x.records_ns.clone(),
        token_choice: choices(x),
    }
}

/// The most tokens one I/O carried. An exchange numbers its response I/Os as they come,
/// so a token's I/O never goes down and equal ones are neighbours: runs, not a map
/// (built for every point of every request). Sorted first should that ever not hold.
pub(in crate::stitch) fn max_per_io<I: Iterator<Item = u32>>(ios: impl Fn() -> I) -> u32 {
    let longest_run = |ios: &mut dyn Iterator<Item = u32>| -> Option<u32> {
        let (mut prev, mut run, mut max) = (None, 0, 0);
        for io in ios {
            match prev {
                Some(p) if p == io => run += 1,
                Some(p) if p > io => return None,
                _ => run = 1,
            }
            prev = Some(io);
            max = max.max(run);
        }
        Some(max)
    };
    longest_run(&mut ios()).unwrap_or_else(|| {
        let mut sorted: Vec<u32> = ios().collect();
        sorted.sort_unstable();
        longest_run(&mut sorted.into_iter()).expect("sorted")
    })
}
