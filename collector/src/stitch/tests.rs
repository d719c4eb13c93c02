//! Stitching on synthetic events built from real byte streams (the same
//! stream parser as live decoding), so the chain logic is tested without root.

use std::collections::HashMap;

use super::*;
use crate::ingest::model::{event::Body, Accept, Direction, Sock, SockIo, StateChange, TcpState};
use crate::protocol::stream::StreamParser;

#[derive(Default)]
struct Net {
    events: Vec<Event>,
    parsers: HashMap<(u64, i32), StreamParser>,
    peer: HashMap<u64, (u64, u32)>,
    socks: HashMap<u64, Sock>,
    next: u64,
}

const MS: u64 = 1_000_000;

impl Net {
    fn ev(&mut self, ts: u64, pid: u32, comm: &str, body: Body) {
        self.events.push(Event {
            ts_ns: ts,
            pid,
            tid: pid,
            cpu: 0,
            comm: comm.into(),
            body: Some(body),
        });
    }

    /// A connection from (cpid, cport) to (spid, sport): both ends' handshakes and the accept.
    fn connect(
        &mut self,
        ts: u64,
        (cpid, ccomm, cport): (u32, &str, u16),
        (spid, scomm, sport): (u32, &str, u16),
    ) -> u64 {
        self.next += 2;
        let (csk, ssk) = (self.next, self.next + 1);
        let lo = vec![127, 0, 0, 1];
        let c = Sock {
            skaddr: csk,
            saddr: lo.clone(),
            sport: cport.into(),
            daddr: lo.clone(),
            dport: sport.into(),
        };
        let s = Sock {
            skaddr: ssk,
            saddr: lo.clone(),
            sport: sport.into(),
            daddr: lo,
            dport: cport.into(),
        };
        let state = |sock: &Sock, old: TcpState, new: TcpState| {
            Body::State(StateChange {
                sock: Some(sock.clone()),
                old: old as i32,
                new: new as i32,
            })
        };
        self.ev(
            ts,
            cpid,
            ccomm,
            state(&c, TcpState::Close, TcpState::SynSent),
        );
        self.ev(
            ts + 50_000,
            0,
            "",
            state(&c, TcpState::SynSent, TcpState::Established),
        );
        self.ev(
            ts + 60_000,
            0,
            "",
            state(&s, TcpState::SynRecv, TcpState::Established),
        );
        self.ev(
            ts + 70_000,
            spid,
            scomm,
            Body::Accept(Accept {
                sock: Some(s.clone()),
                fd: 5,
            }),
        );
        self.peer.insert(csk, (ssk, spid));
        self.peer.insert(ssk, (csk, cpid));
        self.socks.insert(csk, c);
        self.socks.insert(ssk, s);
        csk
    }

    fn io(&mut self, ts: u64, pid: u32, comm: &str, sk: u64, dir: Direction, bytes: &[u8]) {
        let sniff = self
            .parsers
            .entry((sk, dir as i32))
            .or_default()
            .feed(bytes, bytes.len() as u64);
        let io = SockIo {
            sock: Some(self.socks[&sk].clone()),
            dir: dir as i32,
            fd: 5,
            bytes: bytes.len() as u64,
            captured: bytes.len() as u32,
            sniff: Some(sniff),
            ..Default::default()
        };
        self.ev(ts, pid, comm, Body::Io(io));
    }

    /// `pid` sends on `sk`; the peer process reads the same bytes `delay` later.
    fn send(&mut self, ts: u64, pid: u32, sk: u64, bytes: &[u8], delay: u64) {
        self.io(ts, pid, "x", sk, Direction::Send, bytes);
        let (peer, ppid) = self.peer[&sk];
        self.io(ts + delay, ppid, "x", peer, Direction::Recv, bytes);
    }

    fn peer_of(&self, sk: u64) -> u64 {
        self.peer[&sk].0
    }
}

fn request_bytes(prompt: &str) -> Vec<u8> {
    let body = format!("{{\"prompt\":\"{prompt}\",\"stream\":true}}");
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: lab\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

fn chunk(text: &str) -> Vec<u8> {
    format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
}

fn token(req: &str, i: usize) -> Vec<u8> {
    chunk(&format!(
        "data: {{\"id\":\"{req}\",\"choices\":[{{\"text\":\" t{i}\"}}]}}\n\n"
    ))
}

const BENCH: u32 = 10;
const NGINX: u32 = 20;
const ENGINE: u32 = 30;

/// One request through client -> proxy -> engine; the engine writes a token every
/// 20 ms, the proxy forwards pairs of tokens in one write 5 ms after the second.
fn proxied(net: &mut Net, t0: u64, cport: u16, uport: u16, req: &str) {
    let a = net.connect(t0, (BENCH, "bench", cport), (NGINX, "nginx", 8080));
    net.send(t0 + MS, BENCH, a, &request_bytes(req), 100_000);
    let b = net.connect(
        t0 + 3 * MS,
        (NGINX, "nginx", uport),
        (ENGINE, "engine", 9000),
    );
    net.send(t0 + 4 * MS, NGINX, b, &request_bytes(req), 100_000);
    let e = net.peer_of(b);
    let a_srv = net.peer_of(a);
    net.send(t0 + 50 * MS, ENGINE, e, HEAD, 50_000);
    net.send(t0 + 50 * MS, NGINX, a_srv, HEAD, 50_000);
    let mut pending = Vec::new();
    for i in 0..6 {
        let ts = t0 + 100 * MS + i as u64 * 20 * MS;
        let tok = token(req, i);
        net.send(ts, ENGINE, e, &tok, 100_000);
        pending.extend(tok);
        if i % 2 == 1 {
            net.send(
                ts + 5 * MS,
                NGINX,
                a_srv,
                &std::mem::take(&mut pending),
                200_000,
            );
        }
    }
    let done = [chunk("data: [DONE]\n\n"), b"0\r\n\r\n".to_vec()].concat();
    net.send(t0 + 300 * MS, ENGINE, e, &done, 100_000);
    net.send(t0 + 301 * MS, NGINX, a_srv, &done, 100_000);
}

#[test]
fn one_request_through_a_proxy_has_every_point_and_stage() {
    let mut net = Net::default();
    proxied(&mut net, 1_000 * MS, 40000, 50000, "req-a");
    let tl = stitch(&net.events, false);
    assert_eq!(
        tl.requests.len(),
        1,
        "one request, not one per hop: {:#?}",
        tl.requests
    );
    let r = &tl.requests[0];
    let kinds: Vec<PointKind> = r.points.iter().map(|p| p.kind).collect();
    assert_eq!(
        kinds,
        vec![
            PointKind::ClientRead,
            PointKind::ProxyWrite,
            PointKind::ProxyRead,
            PointKind::EngineWrite
        ]
    );
    assert_eq!(
        r.start_ns,
        1_000 * MS,
        "a new connection's request starts at connect()"
    );
    assert!(r.new_connection && r.coalesced && !r.truncated);
    assert_eq!(r.chunk_mismatches, 0);
    let engine = r.point(PointKind::EngineWrite).unwrap();
    assert_eq!(
        engine.ttft_ns,
        Some(100 * MS),
        "engine wrote token 0 at +100 ms"
    );
    assert_eq!(engine.max_tokens_per_io, 1);
    let client = r.point(PointKind::ClientRead).unwrap();
    assert_eq!(
        client.ttft_ns,
        Some(125 * MS + 200_000),
        "token 0 reached the client with token 1, 5 ms after it"
    );
    assert_eq!(client.max_tokens_per_io, 2);
    assert_eq!(client.token_ns.len(), 6);
    assert_eq!(r.stages.connect_ns, Some(50_000));
    assert_eq!(
        r.stages.gateway_ns,
        Some(4 * MS - (MS + 100_000)),
        "proxy got the request at +1.1 ms, sent it at +4 ms"
    );
    assert_eq!(r.stages.upstream_wait_ns, Some(96 * MS - 100_000));
    let fwd = r
        .forward
        .iter()
        .find(|f| f.from == PointKind::ProxyRead && f.to == PointKind::ProxyWrite)
        .unwrap();
    assert_eq!(
        fwd.delay_ns,
        vec![
            25 * MS - 100_000,
            5 * MS - 100_000,
            25 * MS - 100_000,
            5 * MS - 100_000,
            25 * MS - 100_000,
            5 * MS - 100_000
        ]
    );
    let stats = crate::analyze::stats(&tl.requests);
    assert_eq!(stats.itl["engine_write"].count, 5);
    assert_eq!(
        stats.itl["client_read"].p50_ns, 0,
        "coalesced tokens arrive with gap 0"
    );
}

#[test]
fn concurrent_requests_with_the_same_prompt_prefix_keep_their_own_tokens() {
    let mut net = Net::default();
    for k in 0..8u16 {
        proxied(
            &mut net,
            1_000 * MS + u64::from(k) * 7 * MS,
            41000 + k,
            51000 + k,
            &format!("req-{k}"),
        );
    }
    let tl = stitch(&net.events, false);
    assert_eq!(tl.requests.len(), 8);
    for r in &tl.requests {
        assert_eq!(
            r.points.len(),
            4,
            "request {} joined across the proxy",
            r.id
        );
        assert_eq!(
            r.chunk_mismatches, 0,
            "request {}: no chunk from another request",
            r.id
        );
        assert_eq!(r.tokens(), 6);
    }
}

#[test]
fn keep_alive_requests_are_separate_and_only_the_first_pays_connect() {
    let mut net = Net::default();
    let a = net.connect(0, (BENCH, "bench", 40000), (ENGINE, "engine", 9000));
    let srv = net.peer_of(a);
    for k in 0..3u64 {
        let t = 10 * MS + k * 100 * MS;
        net.send(t, BENCH, a, &request_bytes(&format!("p{k}")), 10_000);
        net.send(t + 20 * MS, ENGINE, srv, HEAD, 10_000);
        net.send(t + 30 * MS, ENGINE, srv, &token("x", 0), 10_000);
        net.send(
            t + 40 * MS,
            ENGINE,
            srv,
            &[chunk("data: [DONE]\n\n"), b"0\r\n\r\n".to_vec()].concat(),
            10_000,
        );
    }
    let tl = stitch(&net.events, true);
    assert_eq!(tl.requests.len(), 3);
    let new: Vec<bool> = tl.requests.iter().map(|r| r.new_connection).collect();
    assert_eq!(new, vec![true, false, false]);
    assert_eq!(
        tl.requests[1].start_ns,
        110 * MS,
        "a reused connection's request starts at its first byte"
    );
    assert!(
        tl.requests.iter().all(|r| r.events_dropped),
        "drops mark every request"
    );
    assert!(tl.requests.iter().all(|r| r.points.len() == 2));
}
