//! How the recording's TLS and HTTP/2 were read: which processes gave plaintext
//! (OpenSSL uprobes) and which were timed by TLS record only, and what the HTTP/2
//! decoder counted instead of making up (control frames, malformed frames, header
//! fields from before the recording, streams joined mid-way).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};

use serde::Serialize;

use crate::stitch::Connection;

#[derive(Debug, Default, Serialize)]
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
}

pub fn summarize(conns: &[Connection], tls_untied: u64) -> Protocols {
    // By pid: a process's threads may carry other names (tokio-rt-worker).
    let mut names: BTreeMap<u32, &str> = BTreeMap::new();
    for c in conns.iter().filter(|c| c.pid != 0) {
        names.entry(c.pid).or_insert(&c.comm);
    }
    let mut plaintext = BTreeSet::new();
    let mut record_only = BTreeSet::new();
    let mut p = Protocols {
        tls_untied,
        ..Default::default()
    };
    for c in conns {
        let who = format!("{}/{}", names.get(&c.pid).unwrap_or(&""), c.pid);
        if c.tls.is_some() && c.pid != 0 {
            if c.plaintext {
                plaintext.insert(who);
            } else {
                record_only.insert(who);
            }
        }
        if c.h2 {
            p.h2_connections += 1;
            p.h2_streams += c.exchanges.len();
            p.h2_control_frames += c.h2_control_frames;
            p.h2_errors += c.h2_errors;
            p.h2_unknown_headers += c.h2_unknown_headers;
            p.h2_attached_mid += c.exchanges.iter().filter(|x| x.attached_mid).count();
        }
    }
    // A process with plaintext on some TLS connection reads TLS through OpenSSL.
    p.tls_record_only = record_only.difference(&plaintext).cloned().collect();
    p.tls_plaintext = plaintext.into_iter().collect();
    p
}

pub fn write_text(p: &Protocols, out: &mut dyn Write) -> io::Result<()> {
    if !p.tls_plaintext.is_empty() {
        writeln!(
            out,
            "TLS read in plaintext (OpenSSL uprobes): {}",
            p.tls_plaintext.join(", ")
        )?;
    }
    for who in &p.tls_record_only {
        writeln!(
            out,
            "TLS in {who}: timed by record only (no OpenSSL plaintext: Go crypto/tls, rustls, a stripped library, or --tls off)"
        )?;
    }
    if p.tls_untied > 0 {
        writeln!(
            out,
            "TLS: {} plaintext reads/writes could not be tied to a socket (sessions older than the recording)",
            p.tls_untied
        )?;
    }
    if p.h2_connections > 0 {
        writeln!(
            out,
            "HTTP/2: {} connection ends, {} streams; {} control frames (never requests), {} malformed frames skipped, {} header fields from before the recording, {} streams attached mid-connection",
            p.h2_connections,
            p.h2_streams,
            p.h2_control_frames,
            p.h2_errors,
            p.h2_unknown_headers,
            p.h2_attached_mid
        )?;
    }
    Ok(())
}
