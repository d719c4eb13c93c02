//! A track per connection end: the connection, its handshakes and exchanges.

use super::trace::{owned, Conn};
use super::{Arg, Builder, Cat, Flow, TrackKind};
use crate::stitch::Role;

impl Builder {
    /// A connection's pieces go to the window in which they begin (a retransmit to the
    /// window of the exchange it fell in), under a "connection" slice per window: from
    /// the connection's first moment or the window's first piece, to the window's last
    /// piece or the connection's end.
    pub(super) fn connections<'a>(&mut self, conns: impl Iterator<Item = &'a Conn>) {
        let own = self.own.clone();
        for conn in conns {
            let c = &conn.span;
            let mut items = Vec::new();
            if let Some((a, b)) = c.handshake.filter(|(a, _)| self.owns(*a)) {
                items.push(self.slice(a, b, "tcp handshake", Cat::Connection, 0));
            }
            if let Some((a, b)) = c.tls_handshake.filter(|(a, _)| self.owns(*a)) {
                items.push(self.slice(a, b, "tls handshake", Cat::Connection, 0));
            }
            for x in owned(&c.exchanges, |x| x.request_start_ns, &own) {
                let args = self.args(vec![
                    ("request_bytes", Arg::Int(x.request_bytes as i64)),
                    ("response_ios", Arg::Int(i64::from(x.response_ios))),
                ]);
                let (start, end) = (x.request_start_ns, x.end_ns);
                items.push(self.slice(start, end, &x.label, Cat::Connection, args));
                if let Some(e) = x.request_end_ns {
                    let mut s = self.slice(start, e, "request", Cat::Connection, 0);
                    s.depth = 2;
                    items.push(s);
                }
                if let Some(f) = x.response_first_ns {
                    let mut s = self.slice(f, end, "response", Cat::Connection, 0);
                    s.depth = 2;
                    items.push(s);
                }
            }
            for &ts in &c.retransmits {
                // Exchanges are in the order they began.
                let n = c.exchanges.partition_point(|x| x.request_start_ns <= ts);
                let owner = n
                    .checked_sub(1)
                    .map(|k| &c.exchanges[k])
                    .filter(|x| x.end_ns >= ts)
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
            // One track per connection, also where a socket's 4-tuple was used again.
            let track = self.track_salted(parent, name, TrackKind::Plain, c.id as u64);
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
                .max(conn.end_ns.min(own.end));
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
