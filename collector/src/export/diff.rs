//! `tokenscope diff BEFORE AFTER`: what an SRE runs after changing a config. Two runs
//! (recordings, or JSON reports of them) side by side: overall and per route, TTFT and
//! ITL percentiles at every observation point, the stages, and the diagnoses that went
//! away, appeared or stayed.
//!
//! Both sides are read as the report's JSON document (`schema/report.schema.json` is
//! the contract), so a report kept from last week compares with today's recording.
//! Routes carry the engine's address, whose port changes from run to run: a route
//! missing on the other side is matched by its path when that is unambiguous.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::report;
use crate::ingest::record::{RecordError, RecordReader};

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error(transparent)]
    Recording(#[from] RecordError),
    #[error("{path}: {err}")]
    Io { path: PathBuf, err: io::Error },
    #[error("{path}: not a tokenscope report ({why})")]
    NotAReport { path: PathBuf, why: String },
    #[error("building the report of {path}: {err}")]
    Build { path: PathBuf, err: io::Error },
}

/// The report of `path`: a recording (replayed now), or a JSON report from
/// `tokenscope report --json` (gzipped or not).
pub fn load(path: &Path) -> Result<Value, DiffError> {
    let io_err = |err| DiffError::Io {
        path: path.to_path_buf(),
        err,
    };
    let mut head = [0u8; 2];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(io_err)?;
    let gzipped = n == 2 && head == [0x1f, 0x8b];
    let json = gzipped || head[..n].first().is_some_and(|b| *b == b'{');
    if !json {
        return replay(path);
    }
    let file = std::fs::File::open(path).map_err(io_err)?;
    let reader: Box<dyn Read> = if gzipped {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let not_a_report = |why: String| DiffError::NotAReport {
        path: path.to_path_buf(),
        why,
    };
    let value: Value = serde_json::from_reader(io::BufReader::new(reader))
        .map_err(|e| not_a_report(format!("JSON: {e}")))?;
    match value["schema"].as_str() {
        Some(report::SCHEMA) => Ok(value),
        Some(other) => Err(not_a_report(format!(
            "schema {other}, this tokenscope reads {}",
            report::SCHEMA
        ))),
        None => Err(not_a_report("no \"schema\" field".into())),
    }
}

/// A recording's report, as `report --json` would print it without its requests.
fn replay(path: &Path) -> Result<Value, DiffError> {
    let mut reader = RecordReader::open(path)?;
    let mut builder = report::Builder::new(&reader.header, &[], report::Requests::Drop);
    builder.push_all(&mut reader)?;
    let built = builder.try_finish().map_err(|err| DiffError::Build {
        path: path.to_path_buf(),
        err,
    })?;
    serde_json::to_value(&built).map_err(|e| DiffError::Build {
        path: path.to_path_buf(),
        err: io::Error::other(e),
    })
}

/// How a figure is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Ns,
    Count,
}

/// One figure before and after (absent on a side that has none).
#[derive(Debug, Serialize)]
pub struct Row {
    pub metric: String,
    pub unit: Unit,
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// Changed enough to matter: by 10% or more, and by 1 ms or more for times.
    pub moved: bool,
}

impl Row {
    fn new(metric: String, unit: Unit, before: Option<f64>, after: Option<f64>) -> Row {
        let moved = match (before, after) {
            (Some(b), Some(a)) => {
                let delta = (a - b).abs();
                let floor = if unit == Unit::Ns { 1e6 } else { 0.0 };
                delta > floor && delta >= 0.1 * b.abs().max(a.abs())
            }
            (None, None) => false,
            _ => true,
        };
        Row {
            metric,
            unit,
            before,
            after,
            moved,
        }
    }
}

/// Overall, or one route on both sides.
#[derive(Debug, Serialize)]
pub struct Section {
    pub name: String,
    /// The route's key on each side, when they differ (the engine's port moved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<(String, String)>,
    pub rows: Vec<Row>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Found before, not after: the fix took (or the load changed).
    Gone,
    /// Found after only.
    New,
    /// Found on both sides.
    Kept,
}

/// A diagnosis and what became of it.
#[derive(Debug, Serialize)]
pub struct DiagnosisChange {
    pub change: Change,
    pub rule: u64,
    pub key: String,
    /// The fix, as the rule names it.
    pub title: String,
    /// Where: the route's path (the side that has it names the process and address).
    pub scope: String,
    /// Estimated TTFT p95 and ITL p99 savings on each side (ns).
    pub ttft_p95_saving_ns: (Option<u64>, Option<u64>),
    pub itl_p99_saving_ns: (Option<u64>, Option<u64>),
}

#[derive(Debug, Serialize)]
pub struct Diff {
    pub before: String,
    pub after: String,
    pub sections: Vec<Section>,
    /// Routes seen on one side only.
    pub only_before: Vec<String>,
    pub only_after: Vec<String>,
    pub diagnoses: Vec<DiagnosisChange>,
}

/// Observation points, client side first (as the report orders them).
const POINTS: [&str; 4] = ["client_read", "proxy_write", "proxy_read", "engine_write"];

/// Compares two reports (`load`ed), labelled for the output.
pub fn compare(before: (&str, &Value), after: (&str, &Value)) -> Diff {
    let (b, a) = (before.1, after.1);
    let mut sections = vec![Section {
        name: "overall".into(),
        keys: None,
        rows: rows(&b["overall"], &a["overall"]),
    }];
    let (pairs, only_before, only_after) = match_routes(&b["routes"], &a["routes"]);
    let one_route = |v: &Value| v["routes"].as_object().is_some_and(|m| m.len() == 1);
    let merged = match (pairs.as_slice(), one_route(b), one_route(a)) {
        ([(kb, ka)], true, true) => {
            // One route on each side: it is the overall figures; said once, under its name.
            sections[0].name = format!("overall = {}", path_of(kb));
            sections[0].keys = Some((kb.clone(), ka.clone()));
            true
        }
        _ => false,
    };
    for (kb, ka) in pairs.into_iter().filter(|_| !merged) {
        sections.push(Section {
            name: path_of(&kb).to_string(),
            keys: (kb != ka).then(|| (kb.clone(), ka.clone())),
            rows: rows(&b["routes"][&kb], &a["routes"][&ka]),
        });
    }
    Diff {
        before: before.0.to_string(),
        after: after.0.to_string(),
        sections,
        only_before,
        only_after,
        diagnoses: diagnoses(&b["diagnoses"], &a["diagnoses"]),
    }
}

/// The figures of one stats object (overall or a route) on both sides.
fn rows(b: &Value, a: &Value) -> Vec<Row> {
    let mut out = Vec::new();
    for (field, label) in [
        ("requests", "requests"),
        ("tokens", "tokens"),
        ("new_connections", "new connections"),
        ("coalesced", "coalesced"),
        ("truncated", "truncated"),
    ] {
        out.push(Row::new(
            label.into(),
            Unit::Count,
            b[field].as_f64(),
            a[field].as_f64(),
        ));
    }
    let mut pcts = |group: &str, name: &str, key: &str, stats: &[&str]| {
        let (sb, sa) = (&b[group][key], &a[group][key]);
        if sb.is_null() && sa.is_null() {
            return;
        }
        for stat in stats {
            let field = format!("{stat}_ns");
            out.push(Row::new(
                format!("{name} {stat} {}", key.replace('_', " ")),
                Unit::Ns,
                sb[&field].as_f64(),
                sa[&field].as_f64(),
            ));
        }
    };
    for point in POINTS {
        pcts("ttft", "TTFT", point, &["p50", "p95", "p99"]);
    }
    for point in POINTS {
        pcts("itl", "ITL", point, &["p50", "p99"]);
    }
    let stages: BTreeSet<&String> = [b, a]
        .iter()
        .filter_map(|s| s["stages"].as_object())
        .flat_map(|m| m.keys())
        .collect();
    for stage in stages {
        pcts("stages", "stage", stage, &["p50", "p95"]);
    }
    let tpot = |s: &Value| s["tpot"]["p50_ns"].as_f64();
    if tpot(b).is_some() || tpot(a).is_some() {
        out.push(Row::new("TPOT p50".into(), Unit::Ns, tpot(b), tpot(a)));
    }
    out
}

/// `host:port/path` -> `/path`.
fn path_of(route: &str) -> &str {
    route.find('/').map_or(route, |i| &route[i..])
}

/// Routes on both sides: by key, then by path where one route on each side has it.
fn match_routes(b: &Value, a: &Value) -> (Vec<(String, String)>, Vec<String>, Vec<String>) {
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let (mut kb, mut ka) = (keys(b), keys(a));
    let mut pairs: Vec<(String, String)> = kb
        .intersection(&ka)
        .map(|k| (k.clone(), k.clone()))
        .collect();
    for (k, _) in &pairs {
        kb.remove(k);
        ka.remove(k);
    }
    let by_path = |keys: &BTreeSet<String>| -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for k in keys {
            m.entry(path_of(k).to_string()).or_default().push(k.clone());
        }
        m
    };
    let (pb, pa) = (by_path(&kb), by_path(&ka));
    for (path, before) in &pb {
        if let (Some(after), [one_before]) = (pa.get(path), before.as_slice()) {
            if let [one_after] = after.as_slice() {
                pairs.push((one_before.clone(), one_after.clone()));
                kb.remove(one_before);
                ka.remove(one_after);
            }
        }
    }
    pairs.sort();
    (pairs, kb.into_iter().collect(), ka.into_iter().collect())
}

/// Diagnoses matched by rule, key and the route path of their scope (a process id and
/// an engine port change between runs).
fn diagnoses(b: &Value, a: &Value) -> Vec<DiagnosisChange> {
    type Key = (u64, String, String);
    let index = |v: &Value| -> BTreeMap<Key, Value> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| {
                let key = (
                    d["rule"].as_u64()?,
                    d["key"].as_str()?.to_string(),
                    scope_path(d["scope"].as_str().unwrap_or("")).to_string(),
                );
                Some((key, d.clone()))
            })
            .collect()
    };
    let (ib, ia) = (index(b), index(a));
    let keys: BTreeSet<&Key> = ib.keys().chain(ia.keys()).collect();
    let saving = |d: Option<&Value>, field: &str| d.and_then(|d| d["saving"][field].as_u64());
    let mut out: Vec<DiagnosisChange> = keys
        .into_iter()
        .map(|k| {
            let (db, da) = (ib.get(k), ia.get(k));
            let change = match (db, da) {
                (Some(_), None) => Change::Gone,
                (None, Some(_)) => Change::New,
                _ => Change::Kept,
            };
            let any = db.or(da).expect("a key comes from one side");
            DiagnosisChange {
                change,
                rule: k.0,
                key: k.1.clone(),
                title: any["title"].as_str().unwrap_or("").to_string(),
                scope: k.2.clone(),
                ttft_p95_saving_ns: (saving(db, "ttft_p95_ns"), saving(da, "ttft_p95_ns")),
                itl_p99_saving_ns: (saving(db, "itl_p99_ns"), saving(da, "itl_p99_ns")),
            }
        })
        .collect();
    // Gone first (what the change fixed), largest estimated saving first.
    out.sort_by_key(|d| {
        let before = d.ttft_p95_saving_ns.0.unwrap_or(0) + d.itl_p99_saving_ns.0.unwrap_or(0);
        (d.change, std::cmp::Reverse(before), d.rule)
    });
    out
}

/// "nginx/812: 127.0.0.1:8000/v1/chat" -> "/v1/chat".
fn scope_path(scope: &str) -> &str {
    path_of(scope.rsplit(' ').next().unwrap_or(scope))
}

/// "23.5 ms", "1.21 s", "180 us".
fn duration(ns: f64) -> String {
    let abs = ns.abs();
    if abs >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if abs >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.0} us", ns / 1e3)
    }
}

fn figure(v: Option<f64>, unit: Unit) -> String {
    match (v, unit) {
        (None, _) => "-".into(),
        (Some(v), Unit::Ns) => duration(v),
        (Some(v), Unit::Count) => format!("{v:.0}"),
    }
}

fn change(row: &Row) -> String {
    let (Some(b), Some(a)) = (row.before, row.after) else {
        return String::new();
    };
    if a == b {
        return "=".into();
    }
    let delta = match row.unit {
        Unit::Ns => duration(a - b),
        Unit::Count => format!("{:.0}", a - b),
    };
    let sign = if a > b { "+" } else { "" };
    if b == 0.0 {
        return format!("{sign}{delta}");
    }
    format!("{sign}{delta} ({:+.0}%)", (a - b) / b * 100.0)
}

pub fn write_text(d: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "tokenscope diff: {} -> {}", d.before, d.after)?;
    for s in &d.sections {
        writeln!(out)?;
        match &s.keys {
            Some((b, a)) => writeln!(out, "{} ({b} -> {a})", s.name)?,
            None => writeln!(out, "{}", s.name)?,
        }
        writeln!(out, "  {:<34} {:>11} {:>11}  change", "", "before", "after")?;
        for r in &s.rows {
            writeln!(
                out,
                "{} {:<34} {:>11} {:>11}  {}",
                if r.moved { "*" } else { " " },
                r.metric,
                figure(r.before, r.unit),
                figure(r.after, r.unit),
                change(r)
            )?;
        }
    }
    for (label, routes) in [("before", &d.only_before), ("after", &d.only_after)] {
        for r in routes {
            writeln!(out, "route only {label}: {r}")?;
        }
    }
    writeln!(out)?;
    if d.diagnoses.is_empty() {
        writeln!(out, "diagnoses: none on either side")?;
    } else {
        writeln!(out, "diagnoses")?;
    }
    for x in &d.diagnoses {
        let (state, side) = match x.change {
            Change::Gone => ("gone", 0),
            Change::New => ("new ", 1),
            Change::Kept => ("kept", 1),
        };
        let pick = |p: (Option<u64>, Option<u64>)| if side == 0 { p.0 } else { p.1 };
        let mut savings = Vec::new();
        if let Some(t) = pick(x.ttft_p95_saving_ns).filter(|t| *t > 0) {
            savings.push(format!("TTFT p95 ~{}", duration(t as f64)));
        }
        if let Some(t) = pick(x.itl_p99_saving_ns).filter(|t| *t > 0) {
            savings.push(format!("ITL p99 ~{}", duration(t as f64)));
        }
        let estimate = if savings.is_empty() {
            String::new()
        } else {
            let when = if x.change == Change::Gone {
                "estimated before"
            } else {
                "estimated"
            };
            format!(" ({when}: {})", savings.join(", "))
        };
        writeln!(
            out,
            "  {state} [{}] {} on {}{estimate}",
            x.rule, x.title, x.scope
        )?;
    }
    let gone = d.diagnoses.iter().filter(|x| x.change == Change::Gone);
    let estimated: u64 = gone.filter_map(|x| x.ttft_p95_saving_ns.0).sum();
    let measured = d.sections[0]
        .rows
        .iter()
        .find(|r| r.metric.starts_with("TTFT p95"))
        .filter(|r| r.before.is_some() && r.after.is_some());
    if let (true, Some(r)) = (estimated > 0, measured) {
        writeln!(
            out,
            "  the gone diagnoses estimated TTFT p95 -{} together; measured {} at {}",
            duration(estimated as f64),
            change(r),
            r.metric.trim_start_matches("TTFT p95 ")
        )?;
    }
    writeln!(
        out,
        "\n* moved by 10% or more (and 1 ms or more for times). Routes match by address, else by path."
    )
}

pub fn write_json(d: &Diff, out: &mut dyn Write) -> io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, d).map_err(io::Error::other)?;
    writeln!(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stats(ttft_p95_ms: u64, new_conns: u64) -> Value {
        json!({
            "requests": 10, "tokens": 100, "new_connections": new_conns, "coalesced": 0, "truncated": 0,
            "ttft": {"client_read": {"p50_ns": ttft_p95_ms * 500_000, "p95_ns": ttft_p95_ms * 1_000_000, "p99_ns": ttft_p95_ms * 1_100_000}},
            "itl": {"client_read": {"p50_ns": 20_000_000, "p99_ns": 30_000_000}},
            "stages": {"connect": {"p50_ns": 50_000, "p95_ns": 60_000}},
            "tpot": {"p50_ns": 20_000_000}
        })
    }

    fn report(port: u16, ttft_p95_ms: u64, new_conns: u64, diagnoses: Value) -> Value {
        let route = format!("127.0.0.1:{port}/v1/chat/completions");
        json!({
            "schema": report::SCHEMA,
            "overall": stats(ttft_p95_ms, new_conns),
            "routes": {route: stats(ttft_p95_ms, new_conns)},
            "diagnoses": diagnoses,
        })
    }

    fn diagnosis(rule: u64, key: &str, scope: &str, ttft_ms: u64) -> Value {
        json!({"rule": rule, "key": key, "title": format!("fix {key}"), "scope": scope,
               "saving": {"ttft_p95_ns": ttft_ms * 1_000_000, "itl_p99_ns": null}})
    }

    #[test]
    fn routes_match_across_ports_and_diagnoses_across_pids() {
        let before = report(
            38535,
            900,
            10,
            json!([
                diagnosis(
                    1,
                    "new_connection_per_request",
                    "127.0.0.1:38535/v1/chat/completions",
                    5
                ),
                diagnosis(
                    2,
                    "proxy_buffering",
                    "nginx/27750: 127.0.0.1:38535/v1/chat/completions",
                    700
                ),
                diagnosis(8, "retransmits", "127.0.0.1:38535/v1/chat/completions", 40),
            ]),
        );
        let after = report(
            38855,
            60,
            0,
            json!([diagnosis(
                8,
                "retransmits",
                "127.0.0.1:38855/v1/chat/completions",
                30
            )]),
        );
        let d = compare(("a.tsrec", &before), ("b.tsrec", &after));
        assert_eq!(
            d.sections.len(),
            1,
            "one route on each side: the overall figures"
        );
        let route = &d.sections[0];
        assert_eq!(route.name, "overall = /v1/chat/completions");
        assert!(route.keys.is_some(), "the engine's port moved");
        assert!(d.only_before.is_empty() && d.only_after.is_empty());
        let ttft = route
            .rows
            .iter()
            .find(|r| r.metric == "TTFT p95 client read")
            .expect("TTFT p95 row");
        assert_eq!((ttft.before, ttft.after), (Some(900e6), Some(60e6)));
        assert!(ttft.moved);
        let itl = route
            .rows
            .iter()
            .find(|r| r.metric == "ITL p99 client read")
            .unwrap();
        assert!(!itl.moved, "unchanged");
        let changes: Vec<(Change, u64)> = d.diagnoses.iter().map(|x| (x.change, x.rule)).collect();
        assert_eq!(
            changes,
            [(Change::Gone, 2), (Change::Gone, 1), (Change::Kept, 8)],
            "gone first, the largest saving first"
        );
        let mut text = Vec::new();
        write_text(&d, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains("gone [2] fix proxy_buffering on /v1/chat/completions (estimated before: TTFT p95 ~700.0 ms)"),
            "{text}"
        );
        assert!(text.contains("* TTFT p95 client read"), "{text}");
        assert!(text.contains("-840.0 ms (-93%)"), "{text}");
    }

    #[test]
    fn a_route_on_one_side_only_is_named() {
        let before = report(1, 100, 0, json!([]));
        let mut after = report(2, 100, 0, json!([]));
        after["routes"]["127.0.0.1:2/v1/embeddings"] = stats(5, 0);
        let d = compare(("a", &before), ("b", &after));
        assert_eq!(d.only_after, ["127.0.0.1:2/v1/embeddings"]);
        assert_eq!(d.sections.len(), 2, "overall, and the route on both sides");
        assert_eq!(d.sections[1].name, "/v1/chat/completions");
    }

    #[test]
    fn files_that_are_not_reports_are_one_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        std::fs::write(&p, b"{\"hello\": 1}").unwrap();
        let e = load(&p).unwrap_err().to_string();
        assert!(
            e.contains("not a tokenscope report (no \"schema\" field)"),
            "{e}"
        );
        std::fs::write(&p, b"{ truncated").unwrap();
        assert!(load(&p)
            .unwrap_err()
            .to_string()
            .contains("not a tokenscope report (JSON:"));
        std::fs::write(&p, b"garbage bytes").unwrap();
        assert!(load(&p)
            .unwrap_err()
            .to_string()
            .contains("not a tokenscope recording"));
        assert!(load(&dir.path().join("missing")).is_err());
    }
}
