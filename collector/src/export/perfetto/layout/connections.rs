//! A track per connection end: the connection, its handshakes and exchanges.

use super::trace::Conn;
use super::{Arg, Builder, Cat, Flow, TrackKind};
use crate::stitch::Role;

impl Builder {
    /// Each connection whole (it was released, so nothing more comes of it), in the
    /// window it ended in: its handshakes, exchanges and retransmits under one
    /// "connection" slice from its first moment to its last.
    pub(super) fn connections(&mut self, conns: &[Conn]) {
        for conn in conns {
            let c = &conn.span;
            let mut items = Vec::new();
            if let Some((a, b)) = c.handshake {
                items.push(self.slice(a, b, "tcp handshake", Cat::Connection, 0));
            }
            if let Some((a, b)) = c.tls_handshake {
                items.push(self.slice(a, b, "tls handshake", Cat::Connection, 0));
            }
            for x in &c.exchanges {
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
                items.push(self.instant(ts, "retransmit", Cat::Connection, Flow::None));
            }
            let parent = self.process(c.pid, &c.comm);
            let role = match c.role {
                Role::Client => "client",
                Role::Server => "server",
                Role::Unknown => "socket",
            };
            let name = format!("{role} {} -> {}", c.local, c.remote);
            // One track per connection, also where a socket's 4-tuple was used again.
            let track = self.track_once(parent, name, TrackKind::Plain);
            let first = c.first_ns;
            let last = items
                .iter()
                .map(|i| i.end.unwrap_or(i.start))
                .fold(conn.end_ns, u64::max);
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
