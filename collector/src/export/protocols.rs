//! The protocols summary as text (tallied in `analyze::protocols`).

use std::io::{self, Write};

pub use crate::analyze::protocols::{summarize, Protocols};
use crate::protocol::limits::Limit;

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
    for limit in Limit::ALL {
        if let Some(&n) = p.limits.get(limit.key()) {
            writeln!(out, "limit: {}", limit.describe(n))?;
        }
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
