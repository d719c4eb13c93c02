//! How the recording's TLS and HTTP/2 were read: which processes gave plaintext
//! (OpenSSL uprobes) and which were timed by TLS record only, and what the HTTP/2
//! decoder counted instead of making up (control frames, malformed frames, header
//! fields from before the recording, streams joined mid-way). Tallied one
//! connection at a time, as connections are released.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::protocol::limits::Limit;
use crate::stitch::{Connection, Conns};

#[derive(Clone, Debug, Default, Serialize)]
pub struct Protocols {
    /// `comm/pid` of processes whose TLS connections were read in plaintext.
    pub tls_plaintext: Vec<String>,
    /// `comm/pid` of processes with TLS connections and no plaintext: their TLS
    /// library has no OpenSSL symbols (Go crypto/tls, rustls, stripped BoringSSL),
    /// or `--tls off`. Timed by TLS record only.
    pub tls_record_only: Vec<String>,
    /// Plaintext calls that could not be tied to a socket (sessions older than the
    /// recording whose first call was served from OpenSSL's buffer).
    pub tls_untied: u64,
    /// HTTP/2 connection ends, the streams they carried, and what was counted.
    pub h2_connections: usize,
    pub h2_streams: usize,
    pub h2_control_frames: u64,
    pub h2_errors: u64,
    pub h2_unknown_headers: u64,
    /// Streams already open when the recording began: timed, head unknown.
    pub h2_attached_mid: usize,
    /// Parser bounds that input reached (`protocol::limits`), by key: a gzip bomb cut
    /// at the inflate limit, an endless HTTP head, ... Only those reached.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<&'static str, u64>,
}

/// Connections added one at a time (in any order); `finish` gives the summary.
#[derive(Debug, Default)]
pub struct ProtocolTally {
    /// By pid, the name of its first connection (lowest id): a process's threads may
    /// carry other names (tokio-rt-worker).
    names: BTreeMap<u32, (usize, String)>,
    plaintext: BTreeSet<u32>,
    record_only: BTreeSet<u32>,
    counts: Protocols,
}

impl ProtocolTally {
    pub fn add(&mut self, c: &Connection) {
        if c.pid != 0 {
            let name = self
                .names
                .entry(c.pid)
                .or_insert_with(|| (c.id, c.comm.clone()));
            if c.id < name.0 {
                *name = (c.id, c.comm.clone());
            }
            if c.tls.is_some() {
                if c.plaintext {
                    self.plaintext.insert(c.pid);
                } else {
                    self.record_only.insert(c.pid);
                }
            }
        }
        for (limit, &n) in Limit::ALL.iter().zip(&c.limits) {
            if n > 0 {
                *self.counts.limits.entry(limit.key()).or_default() += n;
            }
        }
        if c.h2 {
            let p = &mut self.counts;
            p.h2_connections += 1;
            p.h2_streams += c.exchange_count();
            p.h2_control_frames += c.h2_control_frames;
            p.h2_errors += c.h2_errors;
            p.h2_unknown_headers += c.h2_unknown_headers;
            p.h2_attached_mid += c.h2_attached_mid;
        }
    }

    pub fn finish(&self, tls_untied: u64) -> Protocols {
        let who = |pid: &u32| {
            let name = self.names.get(pid).map_or("", |(_, n)| n.as_str());
            format!("{name}/{pid}")
        };
        let plaintext: BTreeSet<String> = self.plaintext.iter().map(who).collect();
        let record_only: BTreeSet<String> = self.record_only.iter().map(who).collect();
        Protocols {
            // A process with plaintext on some TLS connection reads TLS through OpenSSL.
            tls_record_only: record_only.difference(&plaintext).cloned().collect(),
            tls_plaintext: plaintext.into_iter().collect(),
            tls_untied,
            ..self.counts.clone()
        }
    }
}

pub fn summarize(conns: &Conns, tls_untied: u64) -> Protocols {
    let mut t = ProtocolTally::default();
    for c in conns.values() {
        t.add(c);
    }
    t.finish(tls_untied)
}
