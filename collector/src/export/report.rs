//! `tokenscope report`: statistics and per-request timelines from a recording,
//! as text for people and JSON (schema/report.schema.json) for scripts.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use crate::analyze::{Stats, Summary};
use crate::diagnose::{Diagnosis, Slo, SloResult, WhatIf};
use crate::ingest::io_source::IoSource;
use crate::ingest::record::FileHeader;
use crate::ingest::Event;
use crate::stitch::Request;

mod build;

pub mod summary;

pub use build::{Builder, Requests, Spill, DIAGNOSIS_WINDOW_NS};

pub const SCHEMA: &str = "tokenscope.report/1";
/// Width of the time windows statistics are also given for.
pub const WINDOW_NS: u64 = 10_000_000_000;

#[derive(Debug, Serialize)]
pub struct Report {
    pub schema: &'static str,
    pub recording: RecordingInfo,
    /// Socket I/Os whose bytes were neither HTTP nor TLS (garbage, other protocols, lost streams).
    pub unparsed_ios: u64,
    /// How TLS and HTTP/2 were read.
    pub protocols: super::protocols::Protocols,
    pub overall: Stats,
    pub routes: BTreeMap<String, Stats>,
    /// Keyed `comm/pid` of the process that served (the last point traced).
    pub processes: BTreeMap<String, Stats>,
    /// Gateways (`comm/pid`) that rewrote requests and re-serialised their events,
    /// joined by the text of the tokens they forwarded: how many requests each.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gateways: BTreeMap<String, usize>,
    pub windows: Vec<Window>,
    pub gpu: GpuSummary,
    /// Named problems with their evidence, saving and fix, the largest saving first.
    pub diagnoses: Vec<Diagnosis>,
    /// The objectives given (`report --slo`), met or not.
    pub slo: Vec<SloResult>,
    /// `report --what-if`: latency as recorded and as predicted with those fixes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub what_if: Option<WhatIf>,
    /// Every request (`Requests::Keep`), in id order; empty when spilled or dropped.
    pub requests: Vec<Request>,
    /// Windows of `DIAGNOSIS_WINDOW_NS` whose requests were diagnosed.
    #[serde(skip)]
    pub diagnosis_windows: usize,
    /// The requests written aside (`Requests::Spill`), listed by `write_json`.
    #[serde(skip)]
    pub spilled: Option<Spill>,
}

/// GPU steps rebuilt from libcuda calls (all zero without GPU probes).
#[derive(Debug, Default, Serialize)]
pub struct GpuSummary {
    pub steps: usize,
    /// Steps timed on the device by the engine's CUPTI records (the rest are CPU-timed:
    /// first launch -> synchronisation's return). Absent when none.
    #[serde(skip_serializing_if = "is_zero_usize")]
    pub gpu_timed: usize,
    /// Step durations by kind: prefill, decode, mixed.
    pub step_ns: BTreeMap<&'static str, Summary>,
    /// GPU-timed steps' device durations by kind (first record's start to last one's
    /// end). Absent without CUPTI records.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub device_step_ns: BTreeMap<&'static str, Summary>,
    /// Decode gaps stalled by other requests' prefill, over all requests.
    pub stalls: usize,
    /// CUPTI hook spans by kind (kernel, memcpy, graph, marker): device-time durations.
    pub cupti_ns: BTreeMap<&'static str, Summary>,
    /// The requests whose prefill stalled others' decode the most (longest gap first).
    #[serde(skip)]
    pub stallers: Vec<Staller>,
}

#[derive(Clone, Debug, Default)]
pub struct Staller {
    pub id: usize,
    /// Decode gaps of other requests it stalled, and the longest.
    pub stalls: usize,
    pub gap_ns: u64,
    pub prefill_ns: u64,
}

#[derive(Debug, Serialize)]
pub struct RecordingInfo {
    pub host: String,
    pub kernel: String,
    /// Where socket I/O came from; absent in recordings older than the choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_source: Option<IoSourceInfo>,
    pub complete: bool,
    pub duration_ns: u64,
    pub events: u64,
    pub submitted: u64,
    pub delivered: u64,
    pub dropped: u64,
    pub decode_errors: u64,
    /// Events later than the replay's reorder window (`pipeline::Config::replay_of`):
    /// used out of order. Absent when none.
    #[serde(skip_serializing_if = "is_zero")]
    pub late_events: u64,
    /// Several recordings joined (`report A B`): each one's host and how its clock was
    /// put on the first one's. Absent for one recording.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<crate::ingest::hosts::Host>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
pub struct IoSourceInfo {
    /// `sock`, `kprobe` or `syscall` (`record --io-source`).
    pub name: String,
    pub description: String,
    /// What the source cannot see, when something.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_seen: Option<&'static str>,
}

impl IoSourceInfo {
    fn from_header(name: &str) -> Option<IoSourceInfo> {
        if name.is_empty() {
            return None;
        }
        let known = IoSource::from_name(name);
        Some(IoSourceInfo {
            name: name.to_string(),
            description: known.map_or_else(|| name.to_string(), |s| s.describe().to_string()),
            not_seen: known.and_then(IoSource::blind_spot),
        })
    }
}

#[derive(Debug, Serialize)]
pub struct Window {
    pub start_ns: u64,
    pub stats: Stats,
}

pub fn build(header: &FileHeader, events: &[Event]) -> Report {
    build_checked(header, events, &[])
}

/// The report with the objectives checked (every request kept in `Report::requests`).
pub fn build_checked(header: &FileHeader, events: &[Event], slos: &[Slo]) -> Report {
    let mut b = Builder::new(header, slos, Requests::Keep);
    for e in events {
        b.push(e.clone());
    }
    b.finish()
}

pub fn write_json(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let Some(spill) = report.spilled.as_ref().filter(|s| s.count() > 0) else {
        serde_json::to_writer_pretty(&mut *out, report).map_err(io::Error::other)?;
        return writeln!(out);
    };
    // The report without its requests ends `"requests": []` and the object's brace;
    // the spilled requests go between the brackets, as serde_json nests them.
    let head = serde_json::to_string_pretty(report).map_err(io::Error::other)?;
    let head = head
        .strip_suffix("[]\n}")
        .ok_or_else(|| io::Error::other("the report JSON does not end with its requests"))?;
    out.write_all(head.as_bytes())?;
    out.write_all(b"[\n")?;
    if spill.copy_to(out)? == 0 {
        return Err(io::Error::other("the spilled requests are empty"));
    }
    out.write_all(b"\n  ]\n}\n")
}

pub fn write_text(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let o = &report.overall;
    let r = &report.recording;
    writeln!(
        out,
        "tokenscope report: {} requests ({} on new connections, {} seen only as TLS records), {} tokens; {} events, {} dropped, {} unparsed I/Os",
        o.requests, o.new_connections, o.encrypted, o.tokens, r.events, r.dropped, report.unparsed_ios
    )?;
    for line in crate::ingest::hosts::describe(&r.hosts) {
        writeln!(out, "{line}")?;
    }
    if let Some(io) = &r.io_source {
        writeln!(out, "I/O source: {}, kernel {}", io.description, r.kernel)?;
        if let Some(blind) = io.not_seen {
            writeln!(out, "  not seen with this source: {blind}")?;
        }
    }
    if r.dropped > 0 {
        writeln!(
            out,
            "WARNING: the recording dropped {} events; figures below may miss some",
            r.dropped
        )?;
    }
    if !r.complete {
        writeln!(
            out,
            "WARNING: the recording never completed (cut off); its counters are not final"
        )?;
    }
    if r.late_events > 0 {
        writeln!(
            out,
            "WARNING: {} events came later than the replay's {} ms reorder window (used out of order; timings next to them may be off)",
            r.late_events,
            crate::pipeline::Config::replay().reorder_ns / 1_000_000
        )?;
    }
    super::protocols::write_text(&report.protocols, out)?;
    for (gateway, n) in &report.gateways {
        writeln!(
            out,
            "gateway {gateway}: {n} requests it rewrote and re-serialised, joined to the engine by their tokens' text (its share of TTFT: stage 'gateway ttft'; per token: forward delay 'proxy read -> proxy write')"
        )?;
    }
    write_stats(o, out)?;
    write_gpu(report, out)?;
    if report.routes.len() > 1 {
        for (route, s) in &report.routes {
            writeln!(out, "\nroute {route}: {} requests", s.requests)?;
            write_stats(s, out)?;
        }
    }
    write_diagnoses(report, out)?;
    if let Some(w) = &report.what_if {
        write_what_if(w, &report.diagnoses, out)?;
    }
    write_slo(&report.slo, &report.diagnoses, out)
}

/// The what-if table: recorded and predicted TTFT p50/p95 and ITL mean/p99.
fn write_what_if(w: &WhatIf, diagnoses: &[Diagnosis], out: &mut dyn Write) -> io::Result<()> {
    let title = |rule: u8| {
        diagnoses
            .iter()
            .find(|d| d.rule == rule)
            .map_or("", |d| d.title)
    };
    let applied: Vec<String> = w
        .applied
        .iter()
        .map(|a| match a.with {
            Some(w) => format!(
                "[{}] {} ({} requests beside [{w}]'s fix)",
                a.rule,
                title(a.rule),
                a.requests
            ),
            None => format!("[{}] {} ({} requests)", a.rule, title(a.rule), a.requests),
        })
        .collect();
    writeln!(out, "\nwhat-if --what-if {}:", w.rules)?;
    if applied.is_empty() {
        writeln!(out, "  none of these rules fired: nothing to re-time")?;
    } else {
        writeln!(out, "  applied: {}", applied.join(", "))?;
    }
    let (r, p) = (&w.recorded, &w.predicted);
    writeln!(
        out,
        "  {:<10} {:>10} {:>10} {:>10}",
        "", "recorded", "predicted", "change"
    )?;
    for (name, a, b) in [
        ("TTFT p50", r.ttft_p50_ns, p.ttft_p50_ns),
        ("TTFT p95", r.ttft_p95_ns, p.ttft_p95_ns),
        ("ITL mean", r.itl_mean_ns, p.itl_mean_ns),
        ("ITL p99", r.itl_p99_ns, p.itl_p99_ns),
    ] {
        let change = (b as f64 - a as f64) / 1e6;
        writeln!(
            out,
            "  {name:<10} {:>10} {:>10} {:>+7.1} ms",
            ms1(a),
            ms1(b),
            change
        )?;
    }
    writeln!(
        out,
        "  ({} requests, {} gaps, at each request's client-most point; each fix re-times requests by the model behind its saving)",
        r.requests, r.gaps
    )
}

fn ms1(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn ms0(ns: u64) -> String {
    format!("{:.0} ms", ns as f64 / 1e6)
}

/// One line per diagnosis's saving: "saves ~740 ms TTFT p95, ~30 ms ITL p99".
pub fn saving_line(d: &Diagnosis) -> String {
    let s = &d.saving;
    let mut parts = Vec::new();
    if let Some(t) = s.ttft_p95_ns {
        parts.push(format!("~{} of TTFT p95", ms0(t)));
    }
    if let Some(t) = s.itl_p99_ns {
        parts.push(format!("~{} of ITL p99", ms0(t)));
    }
    if parts.is_empty() {
        "saving not estimated".into()
    } else {
        format!("saves {}", parts.join(", "))
    }
}

fn write_diagnoses(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let diagnoses = &report.diagnoses;
    if diagnoses.is_empty() {
        return writeln!(
            out,
            "\nDiagnoses: none (no rule's trigger holds on this recording)"
        );
    }
    if report.diagnosis_windows <= 1 {
        writeln!(
            out,
            "\nDiagnoses ({}), the largest saving first:",
            diagnoses.len()
        )?;
        for d in diagnoses {
            write_diagnosis(d, out)?;
        }
        return Ok(());
    }
    // One finding per rule and scope, from the window where it saves most.
    let mut groups: Vec<(&Diagnosis, usize)> = Vec::new();
    for d in diagnoses {
        match groups
            .iter_mut()
            .find(|(g, _)| (g.rule, &g.scope) == (d.rule, &d.scope))
        {
            Some((g, n)) => {
                *n += 1;
                if saving_of(d) > saving_of(g) {
                    *g = d;
                }
            }
            None => groups.push((d, 1)),
        }
    }
    groups.sort_by_key(|(d, _)| (std::cmp::Reverse(saving_of(d)), d.rule));
    writeln!(
        out,
        "\nDiagnoses per {} s window ({} windows with requests; the JSON lists each window's): {} findings, each from its window with the largest saving:",
        DIAGNOSIS_WINDOW_NS / 1_000_000_000,
        report.diagnosis_windows,
        groups.len()
    )?;
    for (d, n) in groups {
        write_diagnosis(d, out)?;
        writeln!(
            out,
            "    seen in {n} of {} windows",
            report.diagnosis_windows
        )?;
    }
    Ok(())
}

/// What a diagnosis saves, TTFT and ITL together (to rank the same finding across windows).
fn saving_of(d: &Diagnosis) -> u64 {
    d.saving.ttft_p95_ns.unwrap_or(0) + d.saving.itl_p99_ns.unwrap_or(0)
}

fn write_diagnosis(d: &Diagnosis, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "[{}] {}: {} ({})",
        d.rule,
        d.title,
        saving_line(d),
        d.scope
    )?;
    writeln!(out, "    {}", d.finding)?;
    if !d.evidence.request_ids.is_empty() {
        let ids: Vec<String> = d
            .evidence
            .request_ids
            .iter()
            .map(|i| format!("#{i}"))
            .collect();
        writeln!(
            out,
            "    evidence: {} requests, e.g. {}",
            d.evidence.requests,
            ids.join(" ")
        )?;
    }
    if let (Some(joint), Some(alone)) = (d.saving.ttft_p95_ns, d.saving.ttft_p95_alone_ns) {
        if joint != alone {
            writeln!(
                out,
                "    alone (without the other fixes): ~{} of TTFT p95",
                ms0(alone)
            )?;
        }
    }
    writeln!(out, "    estimate: {}", d.saving.basis)?;
    for f in &d.fix {
        for line in &f.lines {
            writeln!(out, "    fix ({}): {line}", f.target)?;
        }
    }
    Ok(())
}

fn write_slo(
    results: &[SloResult],
    diagnoses: &[Diagnosis],
    out: &mut dyn Write,
) -> io::Result<()> {
    if results.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nSLOs:")?;
    for r in results {
        let measured = r.measured_ns.map_or("no samples".to_string(), ms0);
        let verdict = if r.met { "met" } else { "VIOLATED" };
        writeln!(
            out,
            "{verdict}: {} (measured {measured} over {} samples)",
            r.slo, r.samples
        )?;
        for rule in &r.top_diagnoses {
            let best = diagnoses
                .iter()
                .filter(|d| d.rule == *rule)
                .max_by_key(|d| saving_of(d));
            if let Some(d) = best {
                writeln!(out, "    [{}] {}: {}", d.rule, d.title, saving_line(d))?;
            }
        }
    }
    Ok(())
}

fn write_gpu(report: &Report, out: &mut dyn Write) -> io::Result<()> {
    let g = &report.gpu;
    if !g.cupti_ns.is_empty() {
        writeln!(out, "GPU activity (CUPTI hook, device time)")?;
        for (kind, v) in &g.cupti_ns {
            summary_row(out, kind, v)?;
        }
    }
    if g.steps == 0 {
        return Ok(());
    }
    let timing = match g.gpu_timed {
        0 => "CPU-timed (no CUPTI records joined)".to_string(),
        n if n == g.steps => "GPU-timed by CUPTI".to_string(),
        n => format!("{n} GPU-timed by CUPTI, the rest CPU-timed"),
    };
    writeln!(out, "GPU steps (from libcuda calls): {}, {timing}", g.steps)?;
    for (kind, v) in &g.step_ns {
        summary_row(out, kind, v)?;
    }
    for (kind, v) in &g.device_step_ns {
        summary_row(out, &format!("{kind} on the device"), v)?;
    }
    for st in &g.stallers {
        writeln!(
            out,
            "  request {} (prefill {} ms) stalled {} decode gaps of other requests, up to {} ms",
            st.id,
            ms(st.prefill_ns),
            st.stalls,
            ms(st.gap_ns)
        )?;
    }
    Ok(())
}

fn write_stats(s: &Stats, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "{:<34}{:>7}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        "(ms)", "count", "p50", "p90", "p95", "p99", "p99.9", "max"
    )?;
    let mut section = |title: &str, rows: Vec<(String, &Summary)>| -> io::Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        writeln!(out, "{title}")?;
        for (name, v) in rows {
            summary_row(out, &name, v)?;
        }
        Ok(())
    };
    let mut ttft = per_point(&s.ttft);
    if let Some(v) = &s.ttft_server {
        ttft.push(("from first request byte".into(), v));
    }
    section("TTFT", ttft)?;
    section("ITL", per_point(&s.itl))?;
    section(
        "TPOT",
        s.tpot
            .iter()
            .map(|v| ("per request".to_string(), v))
            .collect(),
    )?;
    section(
        "stages",
        s.stages
            .iter()
            .map(|(k, v)| (k.replace('_', " "), v))
            .collect(),
    )?;
    section(
        "forward delay per token",
        s.forward.iter().map(|(k, v)| (k.clone(), v)).collect(),
    )
}

/// `  name  count p50 p90 p95 p99 p99.9 max` in ms.
fn summary_row(out: &mut dyn Write, name: &str, v: &Summary) -> io::Result<()> {
    writeln!(
        out,
        "  {name:<32}{:>7}{:>10}{:>10}{:>10}{:>10}{:>10}{:>10}",
        v.count,
        ms(v.p50_ns),
        ms(v.p90_ns),
        ms(v.p95_ns),
        ms(v.p99_ns),
        ms(v.p999_ns),
        ms(v.max_ns)
    )
}

/// Rows in the order a response travels back: client first, engine last.
fn per_point<'a>(m: &'a BTreeMap<&'static str, Summary>) -> Vec<(String, &'a Summary)> {
    ["client_read", "proxy_write", "proxy_read", "engine_write"]
        .iter()
        .filter_map(|k| Some((k.replace('_', " "), m.get(k)?)))
        .collect()
}

fn ms(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1e6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::record::Counters;
    use crate::stitch::testnet::{proxied, Net, MS};

    fn schema() -> serde_json::Value {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/report.schema.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema file"))
            .expect("schema is JSON")
    }

    #[test]
    fn json_report_matches_the_committed_schema() {
        let mut net = Net::default();
        proxied(&mut net, 1_000 * MS, 40000, 50000, "req-a");
        proxied(&mut net, 1_020 * MS, 40001, 50001, "req-b");
        let header = FileHeader {
            host: "h".into(),
            kernel: "6.1.0-57-amd64".into(),
            io_source: "syscall".into(),
            complete: true,
            counters: Some(Counters {
                dropped: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut events = net.events.clone();
        // A ring reading 3 s on, then one far later than the reorder window allows:
        // used, and counted.
        let reading = |ts_ns: u64| Event {
            ts_ns,
            body: Some(crate::ingest::model::event::Body::Ring(Default::default())),
            ..Default::default()
        };
        events.extend([reading(4_000 * MS), reading(1)]);
        let report = build(&header, &events);
        assert_eq!(report.requests.len(), 2);
        assert_eq!(report.recording.late_events, 1);
        let mut buf = Vec::new();
        write_json(&report, &mut buf).expect("json");
        let value: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        let schema = schema();
        let validator = jsonschema::validator_for(&schema).expect("the schema is JSON Schema");
        if let Err(e) = validator.validate(&value) {
            panic!(
                "report JSON breaks the schema at {}: {e}",
                e.instance_path()
            );
        }
        // The checker is not vacuous: an extra field, a wrong type and a value under
        // its minimum are caught.
        let mut bad = value.clone();
        bad["requests"][0]["surprise"] = serde_json::json!(1);
        assert!(!validator.is_valid(&bad), "unknown request field must fail");
        let mut bad = value.clone();
        bad["overall"]["ttft"]["client_read"]["p95_ns"] = serde_json::json!("fast");
        assert!(!validator.is_valid(&bad), "a string percentile must fail");
        let mut bad = value;
        bad["requests"][0]["connection_requests"] = serde_json::json!(-1);
        assert!(
            !validator.is_valid(&bad),
            "connection_requests under its minimum (0) must fail"
        );
        let mut text = Vec::new();
        write_text(&report, &mut text).expect("text");
        let text = String::from_utf8(text).expect("utf8");
        assert!(
            text.contains("client read")
                && text.contains("WARNING: the recording dropped 1 events")
                && text.contains(
                    "WARNING: 1 events came later than the replay's 1000 ms reorder window"
                ),
            "{text}"
        );
        assert!(
            text.contains("I/O source: syscall tracepoints (fd -> socket), kernel 6.1.0-57-amd64")
                && text.contains("not seen with this source: sendfile, splice and io_uring"),
            "the report names the I/O source and what it cannot see: {text}"
        );
    }

    #[test]
    fn text_names_a_finding_of_several_windows_once_from_its_largest_saving() {
        let mut report = build(&FileHeader::default(), &[]);
        let finding = |rule: u8, scope: &str, ttft_ms: u64| Diagnosis {
            rule,
            key: "k",
            title: "fix it",
            finding: format!("window saving {ttft_ms} ms"),
            scope: scope.into(),
            evidence: Default::default(),
            saving: crate::diagnose::Saving {
                ttft_p95_ns: Some(ttft_ms * 1_000_000),
                ..Default::default()
            },
            fix: Vec::new(),
        };
        report.diagnoses = vec![
            finding(2, "nginx/1", 300),
            finding(4, "route", 50),
            finding(2, "nginx/1", 900),
            finding(2, "nginx/2", 10),
        ];
        report.diagnosis_windows = 3;
        let mut text = Vec::new();
        write_text(&report, &mut text).expect("text");
        let text = String::from_utf8(text).expect("utf8");
        assert!(
            text.contains("Diagnoses per 60 s window (3 windows with requests"),
            "{text}"
        );
        assert!(text.contains("3 findings"), "{text}");
        let first = text.find("[2] fix it").expect("rule 2");
        assert!(
            text[first..].starts_with("[2] fix it: saves ~900 ms of TTFT p95 (nginx/1)"),
            "the largest window's saving leads: {text}"
        );
        assert!(
            text.contains("seen in 2 of 3 windows") && !text.contains("window saving 300 ms"),
            "{text}"
        );
        assert!(
            text.find("(route)").unwrap() < text.find("(nginx/2)").unwrap(),
            "{text}"
        );
    }
}
