//! `tokenscope dump`: one readable line per event, after a summary of the
//! recording's header. Only redacted fields exist to print (see ingest::model).

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::Path;

use crate::ingest::model::{event::Body, sniff, Direction, Event, Sock, Syscall, TcpState};
use crate::ingest::record::{FileHeader, RecordError, RecordReader};
use crate::protocol::tls;

#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
}

/// Prints the recording at `path`; `limit` caps the number of event lines.
pub fn dump(path: &Path, limit: Option<u64>, out: &mut dyn Write) -> Result<u64, DumpError> {
    let mut reader = RecordReader::open(path)?;
    write_header(&reader.header, out)?;
    let mut shown = 0u64;
    let mut total = 0u64;
    while let Some(batch) = reader.next_batch()? {
        for ev in &batch {
            total += 1;
            if limit.is_none_or(|l| shown < l) {
                writeln!(out, "{}", event_line(ev))?;
                shown += 1;
            }
        }
    }
    if shown < total {
        writeln!(
            out,
            "# ... {} more events not shown (--limit {shown})",
            total - shown
        )?;
    }
    match reader.cut_off_at {
        Some(at) => writeln!(
            out,
            "# {total} events; the recording was cut off at byte {at} (it never completed)"
        )?,
        None => writeln!(out, "# {total} events")?,
    }
    Ok(total)
}

fn write_header(h: &FileHeader, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "# tokenscope recording v{}: host {} kernel {} clock {} ({})",
        h.format_version,
        h.host,
        h.kernel,
        h.clock,
        if h.complete {
            "complete"
        } else {
            "INCOMPLETE: counters are not final"
        }
    )?;
    let secs = h.end_monotonic_ns.saturating_sub(h.start_monotonic_ns) as f64 / 1e9;
    if h.complete {
        writeln!(
            out,
            "# duration {secs:.3}s, payload cap {} bytes per I/O",
            h.payload_cap
        )?;
    }
    if !h.boot_id.is_empty() {
        // What `report A B` joins hosts by: one boot is one clock; the pairs align others.
        writeln!(
            out,
            "# boot {} netns {}; clocks at start: monotonic {} realtime {}; at end: monotonic {} realtime {}",
            h.boot_id,
            h.net_namespace,
            h.start_monotonic_ns,
            h.start_realtime_ns,
            h.end_monotonic_ns,
            h.end_realtime_ns
        )?;
    }
    if let Some(source) = crate::ingest::io_source::IoSource::from_name(&h.io_source) {
        writeln!(out, "# I/O source: {}", source.describe())?;
    }
    writeln!(
        out,
        "# probes attached ({}): {}",
        h.probes.len(),
        h.probes.join(" ")
    )?;
    if !h.probes_skipped.is_empty() {
        writeln!(out, "# probes skipped: {}", h.probes_skipped.join("; "))?;
    }
    if !h.gpu_devices.is_empty() {
        writeln!(
            out,
            "# GPUs (NVML): {}; samples dropped {}",
            h.gpu_devices.join("; "),
            h.nvml_dropped
        )?;
    }
    if h.cupti_received > 0 || h.cupti_dropped > 0 {
        writeln!(
            out,
            "# CUPTI hook records received {} dropped by the hooks {}",
            h.cupti_received, h.cupti_dropped
        )?;
    }
    if !h.nvml_note.is_empty() {
        writeln!(out, "# NVML off: {}", h.nvml_note)?;
    }
    if !h.filter_pids.is_empty() || !h.filter_ports.is_empty() {
        writeln!(
            out,
            "# filters: pids {:?} ports {:?}",
            h.filter_pids, h.filter_ports
        )?;
    }
    if let Some(c) = &h.counters {
        writeln!(
            out,
            "# events submitted {} delivered {} dropped {} decode_errors {} written {}{}",
            c.submitted,
            c.delivered,
            c.dropped,
            c.decode_errors,
            c.written,
            if c.dropped > 0 {
                "  (WARNING: events were dropped; results built on them are incomplete)"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

/// `time pid/comm src > dst kind details`
pub fn event_line(ev: &Event) -> String {
    let mut s = format!(
        "{:>6}.{:09} ",
        ev.ts_ns / 1_000_000_000,
        ev.ts_ns % 1_000_000_000
    );
    let who = if ev.pid == 0 {
        "-".to_string()
    } else {
        format!("{}/{}", ev.pid, ev.comm)
    };
    let _ = write!(s, "{who:<22} ");
    if let Some(sock) = ev.sock() {
        let _ = write!(s, "{} ", tuple(sock));
    }
    match &ev.body {
        Some(Body::State(st)) => {
            let _ = write!(s, "state {} -> {}", st.old().label(), st.new().label());
        }
        Some(Body::Accept(a)) => {
            let _ = write!(s, "accept fd {}", a.fd);
        }
        Some(Body::Retransmit(r)) => {
            let _ = write!(
                s,
                "retransmit in {}",
                TcpState::try_from(r.state)
                    .unwrap_or(TcpState::Unknown)
                    .label()
            );
        }
        Some(Body::Io(io)) => {
            let dir = match io.dir() {
                Direction::Send => "send",
                Direction::Recv => "recv",
                Direction::Unknown => "io?",
            };
            let sys = if io.syscall() == Syscall::None {
                "(no syscall)"
            } else {
                io.syscall().label()
            };
            let _ = write!(s, "{dir} {sys} fd {} {} B", io.fd, io.bytes);
            if io.payload_fault {
                s.push_str(" [payload unreadable]");
            }
            if let Some(sn) = io.sniff.as_ref() {
                if let Some(kind) = sn.kind.as_ref() {
                    s.push_str("  ");
                    s.push_str(&sniff_text(kind));
                }
                s.push_str(&stream_text(sn));
                s.push_str(&h2_text(sn));
            }
        }
        Some(Body::Cuda(c)) => {
            let _ = write!(
                s,
                "cuda {} {}",
                c.symbol(),
                if c.entry { "entry" } else { "return" }
            );
            if c.stream != 0 {
                let _ = write!(s, " stream {:#x}", c.stream);
            }
            if c.bytes != 0 {
                let _ = write!(s, " {} B", c.bytes);
            }
            if !c.entry && c.result != 0 {
                let _ = write!(s, " CUresult {}", c.result);
            }
        }
        Some(Body::Nvml(n)) => s.push_str(&nvml_text(n)),
        Some(Body::Gpu(g)) => {
            let _ = write!(
                s,
                "cupti {:?} {} dev {} stream {} corr {} {:.1} us",
                g.kind(),
                g.name,
                g.device,
                g.stream,
                g.correlation_id,
                g.end_ns.saturating_sub(g.start_ns) as f64 / 1e3
            );
            if g.bytes > 0 {
                let _ = write!(s, " {} B", g.bytes);
            }
        }
        Some(Body::Ring(r)) => {
            let _ = write!(
                s,
                "ring submitted {} dropped {} so far",
                r.submitted, r.dropped
            );
        }
        None => s.push_str("(empty event)"),
    }
    s
}

/// `nvml gpu0 util 55% mem 20% sm 1410 MHz ...`, fields NVML refused left out.
fn nvml_text(n: &crate::ingest::model::NvmlSample) -> String {
    let mut s = format!("nvml gpu{}", n.device);
    let fields: [(&str, Option<u64>, &str); 10] = [
        ("util", n.gpu_util_pct.map(u64::from), "%"),
        ("mem-util", n.mem_util_pct.map(u64::from), "%"),
        ("sm", n.sm_clock_mhz.map(u64::from), " MHz"),
        ("mem-clock", n.mem_clock_mhz.map(u64::from), " MHz"),
        ("mem-used", n.mem_used_bytes.map(|b| b >> 20), " MiB"),
        ("power", n.power_mw.map(|p| u64::from(p) / 1000), " W"),
        ("temp", n.temperature_c.map(u64::from), " C"),
        ("throttle", n.throttle_reasons, ""),
        ("pcie-tx", n.pcie_tx_kbps.map(u64::from), " KB/s"),
        ("pcie-rx", n.pcie_rx_kbps.map(u64::from), " KB/s"),
    ];
    for (name, v, unit) in fields {
        if let Some(v) = v {
            let _ = if name == "throttle" {
                write!(s, " {name} {v:#x}")
            } else {
                write!(s, " {name} {v}{unit}")
            };
        }
    }
    s
}

fn tuple(sock: &Sock) -> String {
    format!("{} > {}", sock.src(), sock.dst())
}

fn sniff_text(kind: &sniff::Kind) -> String {
    match kind {
        sniff::Kind::HttpRequest(h) => {
            format!(
                "http {} {}{} {}{}",
                h.method,
                h.path,
                if h.has_query { "?…" } else { "" },
                h.version,
                headers_text(&h.headers)
            )
        }
        sniff::Kind::HttpResponse(h) => format!(
            "http {} {}{}",
            h.version,
            h.status,
            headers_text(&h.headers)
        ),
        sniff::Kind::Tls(t) => {
            let recs: Vec<String> = t
                .records
                .iter()
                .map(|r| {
                    let what = match r.handshake_type {
                        Some(ht) => tls::handshake_label(ht).to_string(),
                        None => tls::content_type_label(r.content_type).to_string(),
                    };
                    format!("{what}({})", r.length)
                })
                .collect();
            format!("tls {}", recs.join(" "))
        }
    }
}

/// Body and SSE facts: `body 120 B`, `sse 3 (3 tokens)`, `[DONE]`, `end`, `gzip`, `unparsed`.
fn stream_text(sn: &crate::ingest::model::Sniff) -> String {
    use crate::ingest::model::SseKind;
    let mut parts = Vec::new();
    if sn.body_bytes > 0 {
        parts.push(format!("body {} B", sn.body_bytes));
    }
    if !sn.sse.is_empty() {
        let tokens = sn
            .sse
            .iter()
            .filter(|e| e.kind() == SseKind::Choice)
            .count();
        let done = sn.sse.iter().any(|e| e.kind() == SseKind::Done);
        parts.push(format!(
            "sse {} ({tokens} tokens{})",
            sn.sse.len(),
            if done { ", [DONE]" } else { "" }
        ));
    }
    for (on, label) in [
        (sn.message_end, "end"),
        (sn.compressed, "compressed"),
        (sn.unparsed, "unparsed"),
    ] {
        if on {
            parts.push(label.to_string());
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("  {{{}}}", parts.join(", "))
    }
}

/// HTTP/2 facts: `h2 preface; control=2; s1 HEADERS POST /v1/chat/completions [...];
/// s3 DATA 120 B 3 events (3 tokens) END_STREAM; s5 RST`.
fn h2_text(sn: &crate::ingest::model::Sniff) -> String {
    use crate::ingest::model::SseKind;
    let mut parts = Vec::new();
    if sn.h2_preface {
        parts.push("preface".to_string());
    }
    if sn.h2_control_frames > 0 {
        parts.push(format!("control={}", sn.h2_control_frames));
    }
    if sn.h2_errors > 0 {
        parts.push(format!("errors={}", sn.h2_errors));
    }
    for st in &sn.h2_streams {
        let mut s = format!("s{}", st.stream_id);
        if st.attached_mid {
            s.push_str(" attached mid-stream");
        }
        if let Some(inner) = &st.sniff {
            match &inner.kind {
                Some(sniff::Kind::HttpRequest(h)) => {
                    let query = if h.has_query { "?…" } else { "" };
                    let _ = write!(s, " HEADERS {} {}{query}", h.method, h.path);
                    s.push_str(&headers_text(&h.headers));
                }
                Some(sniff::Kind::HttpResponse(h)) => {
                    let _ = write!(s, " HEADERS {}", h.status);
                    s.push_str(&headers_text(&h.headers));
                }
                _ => {}
            }
            if inner.body_bytes > 0 {
                let _ = write!(s, " DATA {} B", inner.body_bytes);
            }
            if !inner.sse.is_empty() {
                let tokens = inner
                    .sse
                    .iter()
                    .filter(|e| e.kind() == SseKind::Choice)
                    .count();
                let done = inner.sse.iter().any(|e| e.kind() == SseKind::Done);
                let _ = write!(
                    s,
                    " {} events ({tokens} tokens{})",
                    inner.sse.len(),
                    if done { ", [DONE]" } else { "" }
                );
            }
            for (on, label) in [
                (inner.message_end, " END_STREAM"),
                (inner.compressed, " compressed"),
            ] {
                if on {
                    s.push_str(label);
                }
            }
        }
        if st.reset {
            s.push_str(" RST");
        }
        if st.unknown_headers > 0 {
            let _ = write!(s, " unknown headers {}", st.unknown_headers);
        }
        parts.push(s);
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("  h2 {}", parts.join("; "))
    }
}

fn headers_text(headers: &[crate::ingest::model::Header]) -> String {
    if headers.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = headers
        .iter()
        .map(|h| match &h.value {
            Some(v) => format!("{}={v}", h.name),
            None => format!("{}=<redacted>", h.name),
        })
        .collect();
    format!(" [{}]", parts.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::model::{H2StreamSniff, Header, HttpRequestHead, Sniff, SseEvent, SseKind};

    #[test]
    fn h2_streams_are_shown_per_stream() {
        let head = HttpRequestHead {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            has_query: true,
            version: "HTTP/2".into(),
            headers: vec![Header {
                name: "authorization".into(),
                value: None,
            }],
            complete: true,
        };
        let sn = Sniff {
            h2_preface: true,
            h2_control_frames: 2,
            h2_streams: vec![
                H2StreamSniff {
                    stream_id: 1,
                    sniff: Some(Sniff {
                        kind: Some(sniff::Kind::HttpRequest(Box::new(head))),
                        message_start: true,
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                H2StreamSniff {
                    stream_id: 3,
                    sniff: Some(Sniff {
                        body_bytes: 90,
                        sse: smallvec::smallvec![SseEvent {
                            fingerprint: 1,
                            kind: SseKind::Choice as i32,
                            ..Default::default()
                        }],
                        message_end: true,
                        ..Default::default()
                    }),
                    attached_mid: true,
                    unknown_headers: 2,
                    ..Default::default()
                },
                H2StreamSniff {
                    stream_id: 5,
                    reset: true,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            h2_text(&sn),
            "  h2 preface; control=2; s1 HEADERS POST /v1/chat/completions?… [authorization=<redacted>]; \
s3 attached mid-stream DATA 90 B 1 events (1 tokens) END_STREAM unknown headers 2; s5 RST"
        );
        assert_eq!(h2_text(&Sniff::default()), "");
    }
}
