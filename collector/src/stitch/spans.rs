//! What views draw of a chain once the stitcher let it go: where a request's stages
//! lie in time, and each connection with the exchanges it carried. Handed over with
//! the request, or with the connection when it is released, so no view goes back to
//! the exchanges or relinks them (the Perfetto export lays these out).

use std::net::SocketAddr;

use super::chain::{End, Links};
use super::conn::{Connection, Conns, Exchange, Role};

/// A request's stages as spans (start, end) on the hops that carried it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainSpans {
    /// The TCP and TLS handshakes of a connection the request opened.
    pub connect: Option<(u64, u64)>,
    pub tls: Option<(u64, u64)>,
    /// Sending the request on the client's connection.
    pub upload: Option<(u64, u64)>,
    /// From the proxy's accepted request to the request it sent upstream.
    pub gateway: Option<(u64, u64)>,
    /// Requests the proxy made on its own account meanwhile: path, start, end.
    pub subrequests: Vec<(String, u64, u64)>,
}

/// The spans of the request built from `chain` (client end first).
pub(super) fn chain_spans(
    new_connection: bool,
    conns: &Conns,
    chain: &[End],
    links: &Links,
) -> ChainSpans {
    let x = |e: End| -> &Exchange { conns[&e.0].exchange(e.1) };
    let (rc, rx) = (&conns[&chain[0].0], x(chain[0]));
    let mut s = ChainSpans::default();
    if new_connection {
        s.connect = rc.handshake();
        s.tls = rc
            .tls
            .as_ref()
            .and_then(|t| Some((t.client_hello_ns?, t.client_first_app_ns?)));
    }
    if rc.role == Role::Client {
        s.upload = rx.request_end_ns.map(|e| (rx.request_start_ns, e));
    }
    if let Some((i, &inbound)) = chain
        .iter()
        .enumerate()
        .find(|(_, e)| links.upstream.contains_key(e))
    {
        let out = chain
            .get(i + 1)
            .copied()
            .unwrap_or(links.upstream[&inbound]);
        s.gateway = Some((x(inbound).request_start_ns, x(out).request_start_ns));
        for &sub in links.subrequests.get(&inbound).into_iter().flatten() {
            let sx = x(sub);
            let end = sx.response_end_ns.unwrap_or(sx.request_start_ns);
            s.subrequests
                .push((sx.path.as_str().to_owned(), sx.request_start_ns, end));
        }
    }
    s
}

/// One exchange as a connection track shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeSpan {
    /// "POST /v1/completions", or "(encrypted exchange)".
    pub label: String,
    pub request_start_ns: u64,
    pub request_end_ns: Option<u64>,
    pub response_first_ns: Option<u64>,
    /// The last thing seen of it (its response's end, else its last token or record).
    pub end_ns: u64,
    pub request_bytes: u64,
    pub response_ios: u32,
}

impl ExchangeSpan {
    pub fn of(x: &Exchange) -> ExchangeSpan {
        let end_ns = x
            .response_end_ns
            .or(x.sse.last().map(|e| e.ts_ns))
            .or(x.records_ns.last().copied())
            .or(x.response_first_ns)
            .or(x.request_end_ns)
            .unwrap_or(x.request_start_ns)
            .max(x.request_start_ns);
        ExchangeSpan {
            label: if x.encrypted {
                "(encrypted exchange)".into()
            } else {
                format!("{} {}", x.method, x.path)
            },
            request_start_ns: x.request_start_ns,
            request_end_ns: x.request_end_ns,
            response_first_ns: x.response_first_ns,
            end_ns,
            request_bytes: x.request_bytes,
            response_ios: x.response_ios,
        }
    }
}

/// A released connection as a track shows it: every exchange it carried, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionSpan {
    pub id: usize,
    pub pid: u32,
    pub comm: String,
    pub role: Role,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub first_ns: u64,
    pub last_ns: u64,
    pub close_ns: Option<u64>,
    pub handshake: Option<(u64, u64)>,
    pub tls_handshake: Option<(u64, u64)>,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub retransmits: Vec<u64>,
    pub exchanges: Vec<ExchangeSpan>,
}

impl ConnectionSpan {
    /// `c` as released, after `earlier`: the exchanges let go before it was.
    pub fn of(c: &Connection, mut earlier: Vec<ExchangeSpan>) -> ConnectionSpan {
        earlier.extend(c.exchanges.iter().map(ExchangeSpan::of));
        ConnectionSpan {
            id: c.id,
            pid: c.pid,
            comm: c.comm.clone(),
            role: c.role,
            local: c.local,
            remote: c.remote,
            first_ns: c.first_ns,
            last_ns: c.last_ns,
            close_ns: c.close_ns,
            handshake: c.handshake(),
            tls_handshake: c
                .tls
                .as_ref()
                .and_then(|t| Some((t.client_hello_ns?, t.client_first_app_ns?))),
            bytes_sent: c.bytes_sent,
            bytes_recv: c.bytes_recv,
            retransmits: c.retransmits.clone(),
            exchanges: earlier,
        }
    }
}
