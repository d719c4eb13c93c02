//! A track per connection end: the connection, its handshakes and exchanges.

use super::{Arg, Builder, Cat, Flow, TrackKind};
use crate::stitch::conn::{Conns, Exchange, Role};

impl Builder {
    /// A connection's pieces go to the window in which they begin (a retransmit to the
    /// window of the exchange it fell in), under a "connection" slice per window: from
    /// the connection's first moment or the window's first piece, to the window's last
    /// piece or the connection's end.
    pub(super) fn connections(&mut self, conns: &Conns) {
        for c in conns.values() {
            let mut items = Vec::new();
            let mut end = c.last_ns.max(c.close_ns.unwrap_or(0));
            if let Some((a, b)) = c.handshake().filter(|(a, _)| self.owns(*a)) {
                items.push(self.slice(a, b, "tcp handshake", Cat::Connection, 0));
            }
            if let Some(t) = &c.tls {
                if let (Some(a), Some(b)) = (t.client_hello_ns, t.client_first_app_ns) {
                    if self.owns(a) {
                        items.push(self.slice(a, b, "tls handshake", Cat::Connection, 0));
                    }
                }
            }
            for x in &c.exchanges {
                let x_end = exchange_end(x);
                end = end.max(x_end);
                if !self.owns(x.request_start_ns) {
                    continue;
                }
                let name = if x.encrypted {
                    "(encrypted exchange)".to_string()
                } else {
                    format!("{} {}", x.method, x.path)
                };
                let args = self.args(vec![
                    ("request_bytes", Arg::Int(x.request_bytes as i64)),
                    ("response_ios", Arg::Int(i64::from(x.response_ios))),
                ]);
                items.push(self.slice(x.request_start_ns, x_end, &name, Cat::Connection, args));
                if let Some(e) = x.request_end_ns {
                    let mut s = self.slice(x.request_start_ns, e, "request", Cat::Connection, 0);
                    s.depth = 2;
                    items.push(s);
                }
                if let Some(f) = x.response_first_ns {
                    let mut s = self.slice(f, x_end, "response", Cat::Connection, 0);
                    s.depth = 2;
                    items.push(s);
                }
            }
            for &ts in &c.retransmits {
                // Exchanges begin in time order.
                let n = c.exchanges.partition_point(|x| x.request_start_ns <= ts);
                let owner = n
                    .checked_sub(1)
                    .map(|k| &c.exchanges[k])
                    .filter(|x| exchange_end(x) >= ts)
                    .map_or(ts, |x| x.request_start_ns);
                if self.owns(owner) {
                    items.push(self.instant(ts, "retransmit", Cat::Connection, Flow::None));
                }
            }
            if items.is_empty() && !self.owns(c.first_ns) {
                continue;
            }
            let parent = self.process(c.pid, &c.comm);
            let role = match c.role {
                Role::Client => "client",
                Role::Server => "server",
                Role::Unknown => "socket",
            };
            let name = format!("{role} {} -> {}", c.local, c.remote);
            let track = self.track(parent, name, TrackKind::Plain);
            let first = if self.owns(c.first_ns) {
                c.first_ns
            } else {
                items.iter().map(|i| i.start).min().unwrap_or(c.first_ns)
            };
            let last = items
                .iter()
                .map(|i| i.end.unwrap_or(i.start))
                .max()
                .unwrap_or(first)
                .max(end.min(self.own.end));
            let args = self.args(vec![
                ("bytes_sent", Arg::Int(c.bytes_sent as i64)),
                ("bytes_received", Arg::Int(c.bytes_recv as i64)),
            ]);
            let mut root = self.slice(first, last, "connection", Cat::Connection, args);
            root.depth = 0;
            items.push(root);
            self.nest(track, items);
        }
    }
}

fn exchange_end(x: &Exchange) -> u64 {
    x.response_end_ns
        .or(x.sse.last().map(|e| e.ts_ns))
        .or(x.records_ns.last().copied())
        .or(x.response_first_ns)
        .or(x.request_end_ns)
        .unwrap_or(x.request_start_ns)
        .max(x.request_start_ns)
}
