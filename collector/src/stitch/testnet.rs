//! Synthetic traffic for tests: events built from real byte streams through the
//! same stream parser as live decoding, so stitching is tested without root.

use std::collections::HashMap;

use crate::ingest::model::{
    event::Body, Accept, Addr, Direction, Sock, SockIo, StateChange, TcpState,
};
use crate::ingest::Event;
use crate::protocol::stream::StreamParser;

/// A TCP state change of `sock`.
fn state(sock: &Sock, old: TcpState, new: TcpState) -> Body {
    Body::State(StateChange {
        sock: Some(sock.clone()),
        old: old as i32,
        new: new as i32,
    })
}

#[derive(Default)]
pub(crate) struct Net {
    pub(crate) events: Vec<Event>,
    parsers: HashMap<(u64, i32), StreamParser>,
    peer: HashMap<u64, (u64, u32)>,
    socks: HashMap<u64, Sock>,
    next: u64,
}

pub(crate) const MS: u64 = 1_000_000;

impl Net {
    pub(crate) fn ev(&mut self, ts: u64, pid: u32, comm: &str, body: Body) {
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
    pub(crate) fn connect(
        &mut self,
        ts: u64,
        (cpid, ccomm, cport): (u32, &str, u16),
        (spid, scomm, sport): (u32, &str, u16),
    ) -> u64 {
        self.next += 2;
        let (csk, ssk) = (self.next, self.next + 1);
        let lo = Addr::from_slice(&[127, 0, 0, 1]);
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

    /// The client end closes (FIN), the server end follows: both reach CLOSE.
    pub(crate) fn close(&mut self, ts: u64, csk: u64) {
        let ssk = self.peer[&csk].0;
        let (c, s) = (self.socks[&csk].clone(), self.socks[&ssk].clone());
        self.ev(
            ts,
            0,
            "",
            state(&c, TcpState::Established, TcpState::FinWait1),
        );
        self.ev(
            ts + 10_000,
            0,
            "",
            state(&s, TcpState::Established, TcpState::CloseWait),
        );
        self.ev(
            ts + 20_000,
            0,
            "",
            state(&s, TcpState::LastAck, TcpState::Close),
        );
        self.ev(
            ts + 30_000,
            0,
            "",
            state(&c, TcpState::FinWait2, TcpState::Close),
        );
    }

    pub(crate) fn io(
        &mut self,
        ts: u64,
        pid: u32,
        comm: &str,
        sk: u64,
        dir: Direction,
        bytes: &[u8],
    ) {
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
    pub(crate) fn send(&mut self, ts: u64, pid: u32, sk: u64, bytes: &[u8], delay: u64) {
        self.io(ts, pid, "x", sk, Direction::Send, bytes);
        let (peer, ppid) = self.peer[&sk];
        self.io(ts + delay, ppid, "x", peer, Direction::Recv, bytes);
    }

    pub(crate) fn peer_of(&self, sk: u64) -> u64 {
        self.peer[&sk].0
    }
}

pub(crate) fn request_bytes(prompt: &str) -> Vec<u8> {
    let body = format!("{{\"prompt\":\"{prompt}\",\"stream\":true}}");
    format!(
        "POST /v1/completions HTTP/1.1\r\nHost: lab\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

pub(crate) const HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

pub(crate) fn chunk(text: &str) -> Vec<u8> {
    format!("{:x}\r\n{text}\r\n", text.len()).into_bytes()
}

pub(crate) fn token(req: &str, i: usize) -> Vec<u8> {
    chunk(&format!(
        "data: {{\"id\":\"{req}\",\"choices\":[{{\"text\":\" t{i}\"}}]}}\n\n"
    ))
}

pub(crate) const BENCH: u32 = 10;
pub(crate) const NGINX: u32 = 20;
pub(crate) const ENGINE: u32 = 30;

/// One request through client -> proxy -> engine; the engine writes a token every
/// 20 ms, the proxy forwards pairs of tokens in one write 5 ms after the second.
pub(crate) fn proxied(net: &mut Net, t0: u64, cport: u16, uport: u16, req: &str) {
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
    // The client closes its connection, as curl does after one request.
    net.close(t0 + 302 * MS, a);
}
