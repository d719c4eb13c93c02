//! The report built as a recording is replayed, in memory that follows what is in
//! flight rather than the recording's length.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

use super::{GpuSummary, IoSourceInfo, RecordingInfo, Report, Staller, Window, SCHEMA, WINDOW_NS};
use crate::analyze::{self, Breakdown, Samples};
use crate::diagnose::{self, slo, what_if, Diagnosis, Selection, Slo};
use crate::gpu::GpuStep;
use crate::ingest::model::NvmlSample;
use crate::ingest::record::{FileHeader, RecordError, Source};
use crate::ingest::Event;
use crate::pipeline::cut::Cutter;
use crate::pipeline::{self, Output, Pipeline};
use crate::stitch::Request;

/// What becomes of the requests a report has summed up.
pub enum Requests {
    /// Kept in `Report::requests` (callers that read them).
    Keep,
    /// Written, as the JSON report lists them (summaries, without per-token arrays:
    /// `summary`), to an unnamed temporary file that `write_json` copies out: memory
    /// stays flat however many requests there are.
    Spill,
    /// The same with every per-token array (`report --json --tokens`).
    SpillWithTokens,
    /// Let go (the text report lists none).
    Drop,
}

/// A report built as a recording is replayed: events go through the pipeline, and
/// every `DIAGNOSIS_WINDOW_NS` of requests, once nothing in
/// flight can start in it (see `pipeline::cut`), is numbered, joined to its GPU steps,
/// diagnosed, added to the statistics and let go. What is held is what is in flight
/// plus a window: a recording an hour long needs the memory a minute needs.
pub struct Builder {
    header: FileHeader,
    pipeline: Pipeline,
    cutter: Cutter,
    /// The first cut's start (the recording's start, as the export's windows).
    origin: Option<u64>,
    next_window: u64,
    stats: Breakdown,
    slo: slo::Checker,
    diagnoses: Vec<Diagnosis>,
    diagnosed_windows: usize,
    nvml: Vec<(u64, NvmlSample)>,
    gpu: GpuSums,
    requests: RequestSink,
    pushed: u64,
    last: Output,
    gateways: BTreeMap<String, usize>,
    /// `report --what-if`: the fixes applied and the samples re-timed so far.
    what_if: Option<(Selection, what_if::Accumulator)>,
    hosts: Vec<crate::ingest::hosts::Host>,
}

/// Per-kind step and CUPTI durations, stall counts and the worst stallers so far.
#[derive(Default)]
struct GpuSums {
    steps: usize,
    gpu_timed: usize,
    step_ns: BTreeMap<&'static str, Samples>,
    device_step_ns: BTreeMap<&'static str, Samples>,
    cupti_ns: BTreeMap<&'static str, Samples>,
    stalls: usize,
    stallers: Vec<Staller>,
}

enum RequestSink {
    Keep(Vec<Request>),
    /// The spill (made at the first request) and whether it keeps per-token arrays.
    Spill(Option<Spill>, bool),
    Drop,
}

/// Requests written out as the JSON report lists them, and how many.
#[derive(Debug)]
pub struct Spill {
    file: Option<io::BufWriter<std::fs::File>>,
    error: Option<io::Error>,
    count: usize,
}

/// Events between two looks at what can be cut (a look is cheap; a replay pushes
/// millions of events).
const LOOK_EVERY: u64 = 4096;
/// Diagnoses are made per window this long (the export's default window), so that a
/// long recording's are each about one stretch of time and the rules never hold the
/// whole recording. A recording shorter than this gets one set, as a whole.
pub const DIAGNOSIS_WINDOW_NS: u64 = 60_000_000_000;
/// Stallers listed in the GPU summary.
const STALLERS: usize = 5;

impl Builder {
    pub fn new(header: &FileHeader, slos: &[Slo], requests: Requests) -> Builder {
        let dropped = header.counters.unwrap_or_default().dropped > 0;
        Builder {
            header: header.clone(),
            pipeline: Pipeline::new(pipeline::Config::replay_of(header), dropped),
            cutter: Cutter::default(),
            origin: None,
            next_window: 0,
            stats: Breakdown::new(WINDOW_NS),
            slo: slo::Checker::new(slos),
            diagnoses: Vec::new(),
            diagnosed_windows: 0,
            nvml: Vec::new(),
            gpu: GpuSums::default(),
            requests: match requests {
                Requests::Keep => RequestSink::Keep(Vec::new()),
                Requests::Spill => RequestSink::Spill(None, false),
                Requests::SpillWithTokens => RequestSink::Spill(None, true),
                Requests::Drop => RequestSink::Drop,
            },
            pushed: 0,
            last: Output::default(),
            gateways: BTreeMap::new(),
            what_if: None,
            hosts: Vec::new(),
        }
    }

    /// The recordings are several hosts joined: say which and how their clocks align.
    pub fn hosts(mut self, hosts: Vec<crate::ingest::hosts::Host>) -> Builder {
        self.hosts = hosts;
        self
    }

    /// Also re-time the requests as if the fixes of `selection` were applied.
    pub fn what_if(mut self, selection: Selection) -> Builder {
        self.what_if = Some((selection, what_if::Accumulator::default()));
        self
    }

    /// Every event of `reader`, a batch at a time (never the whole recording at once),
    /// each batch handed back to it once its events went through (`Source::recycle`).
    pub fn push_all(&mut self, reader: &mut dyn Source) -> Result<(), RecordError> {
        self.pipeline.recycle_batches();
        while let Some(batch) = reader.next_batch()? {
            self.push_batch(batch);
            if let Some(done) = self.pipeline.take_spare() {
                reader.recycle(done);
            }
        }
        Ok(())
    }

    pub fn push(&mut self, event: Event) {
        self.pipeline.push(event);
        self.after_push(1);
    }

    /// `push` of each event in turn, the batch kept whole in the pipeline.
    pub fn push_batch(&mut self, events: Vec<Event>) {
        let n = events.len() as u64;
        self.pipeline.push_batch(events);
        self.after_push(n);
    }

    /// Takes what the pipeline finished and cuts the windows that are ready, each
    /// `LOOK_EVERY` events.
    fn after_push(&mut self, n: u64) {
        let before = self.pushed / LOOK_EVERY;
        self.pushed += n;
        if self.pushed / LOOK_EVERY != before {
            self.take();
            while let Some(end) = self.ready_end() {
                self.cut(end);
            }
        }
    }

    /// The report of everything pushed. Errors: only from spilling requests to disk.
    pub fn try_finish(mut self) -> io::Result<Report> {
        self.pipeline.flush();
        self.take();
        while let Some(first) = self.cutter.first_pending_ns() {
            let end = self.window_end(self.window_of(first).max(self.next_window));
            let last = end >= self.last.last_event_ns.max(self.header.end_monotonic_ns);
            self.cut(if last { u64::MAX } else { end });
        }
        if let RequestSink::Spill(Some(s), _) = &mut self.requests {
            s.finish()?;
        }
        Ok(self.report())
    }

    /// `try_finish` where requests are not spilled (nothing can fail).
    pub fn finish(self) -> Report {
        self.try_finish()
            .expect("only spilling requests can fail, and these are kept or dropped")
    }

    fn take(&mut self) {
        let mut out = self.pipeline.take();
        self.cutter.add(
            std::mem::take(&mut out.requests),
            std::mem::take(&mut out.steps),
        );
        for span in std::mem::take(&mut out.cupti) {
            if let Some(kind) = cupti_kind(span.kind) {
                self.gpu
                    .cupti_ns
                    .entry(kind)
                    .or_default()
                    .push(span.end_ns.saturating_sub(span.start_ns));
            }
        }
        self.nvml.append(&mut out.nvml);
        // What is left: the counters so far.
        self.last = out;
    }

    fn origin(&self) -> u64 {
        self.origin
            .unwrap_or_else(|| crate::export::start_ns(&self.header, self.last.first_event_ns))
    }

    fn window_of(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.origin()) / DIAGNOSIS_WINDOW_NS
    }

    fn window_end(&self, k: u64) -> u64 {
        self.origin()
            .saturating_add((k + 1).saturating_mul(DIAGNOSIS_WINDOW_NS))
    }

    /// The end of the next window that can be cut now, if any.
    fn ready_end(&self) -> Option<u64> {
        let k = self
            .window_of(self.cutter.first_pending_ns()?)
            .max(self.next_window);
        let end = self.window_end(k);
        Cutter::ready(&self.pipeline, end).then_some(end)
    }

    fn cut(&mut self, end: u64) {
        self.origin = Some(self.origin());
        let requests = self.cutter.cut_requests(end);
        let keep = self.nvml.partition_point(|(ts, _)| *ts < end);
        let nvml: Vec<_> = self.nvml.drain(..keep).collect();
        if !requests.is_empty() {
            let input = diagnose::Input {
                requests: requests.iter().collect(),
                steps: self.cutter.steps(),
                nvml: &nvml,
                shares: &[],
            };
            self.diagnoses.extend(diagnose::diagnose(&input));
            if let Some((selection, acc)) = &mut self.what_if {
                acc.add(&input, selection);
            }
            self.diagnosed_windows += 1;
        }
        self.gpu.add_stalls(&requests);
        for r in &requests {
            self.stats.add(r);
            self.slo.add(r);
            if r.join == Some("by-tokens") {
                if let Some(p) = r.point(crate::stitch::PointKind::ProxyWrite) {
                    *self
                        .gateways
                        .entry(format!(
                            "{}/{}",
                            p.comm,
                            crate::ingest::hosts::pid_label(p.pid)
                        ))
                        .or_default() += 1;
                }
            }
        }
        self.stats.seal(end);
        self.next_window = self.window_of(end.saturating_sub(1)) + 1;
        for s in self.cutter.forget_steps(end) {
            self.gpu.add_step(&s);
        }
        self.requests.put(requests);
    }

    fn report(mut self) -> Report {
        for s in std::mem::take(&mut self.cutter).into_steps() {
            self.gpu.add_step(&s);
        }
        let h = &self.header;
        let c = h.counters.unwrap_or_default();
        let slo = self.slo.finish(&self.diagnoses);
        let stats = self.stats.finish();
        let (requests, spilled) = match self.requests {
            RequestSink::Keep(v) => (v, None),
            RequestSink::Spill(s, _) => (Vec::new(), s),
            RequestSink::Drop => (Vec::new(), None),
        };
        Report {
            schema: SCHEMA,
            recording: RecordingInfo {
                host: h.host.clone(),
                kernel: h.kernel.clone(),
                io_source: IoSourceInfo::from_header(&h.io_source),
                complete: h.complete,
                duration_ns: h.end_monotonic_ns.saturating_sub(h.start_monotonic_ns),
                events: self.last.events,
                submitted: c.submitted,
                delivered: c.delivered,
                dropped: c.dropped,
                decode_errors: c.decode_errors,
                late_events: self.last.late_events,
                hosts: self.hosts.clone(),
            },
            unparsed_ios: self.last.unparsed_ios,
            protocols: self.pipeline.protocols(h.tls_untied),
            overall: stats.overall,
            routes: stats.routes,
            processes: stats.processes,
            windows: (stats.windows.into_iter())
                .map(|(start_ns, stats)| Window { start_ns, stats })
                .collect(),
            gpu: self.gpu.summary(),
            gateways: self.gateways,
            diagnoses: self.diagnoses,
            diagnosis_windows: self.diagnosed_windows,
            slo,
            what_if: self.what_if.map(|(selection, acc)| acc.finish(&selection)),
            requests,
            spilled,
        }
    }
}

impl RequestSink {
    fn put(&mut self, requests: Vec<Request>) {
        match self {
            RequestSink::Keep(v) => v.extend(requests),
            RequestSink::Drop => {}
            RequestSink::Spill(spill, tokens) => {
                let s = spill.get_or_insert_with(Spill::new);
                for r in requests {
                    if *tokens {
                        s.write(&serde_json::to_vec_pretty(&r).expect("a request serializes"));
                    } else {
                        s.write(&super::summary::summary(r));
                    }
                }
            }
        }
    }
}

impl Spill {
    fn new() -> Spill {
        let file = unnamed_file();
        let (file, error) = match file {
            Ok(f) => (Some(io::BufWriter::new(f)), None),
            Err(e) => (None, Some(e)),
        };
        Spill {
            file,
            error,
            count: 0,
        }
    }

    /// One request's JSON (pretty, or a summary on one line) as the pretty JSON report
    /// nests it (four spaces in, after a comma unless it is the first). A write error
    /// is kept for `try_finish`.
    fn write(&mut self, json: &[u8]) {
        let Some(file) = &mut self.file else { return };
        let mut text = Vec::with_capacity(4096);
        if self.count > 0 {
            text.extend_from_slice(b",\n");
        }
        self.count += 1;
        // JSON strings hold no raw newline: each line is a line of the document. A
        // summary is one line: found so by `contains` (a memchr), not by a split's
        // closure called on each byte.
        if json.contains(&b'\n') {
            for (i, line) in json.split(|&b| b == b'\n').enumerate() {
                if i > 0 {
                    text.push(b'\n');
                }
                text.extend_from_slice(b"    ");
                text.extend_from_slice(line);
            }
        } else {
            text.extend_from_slice(b"    ");
            text.extend_from_slice(json);
        }
        if let Err(e) = file.write_all(&text) {
            self.error.get_or_insert(e);
            self.file = None;
        }
    }

    /// Requests written.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Copies what was written to `out` (by offset: it can be copied more than once);
    /// the bytes copied.
    pub(super) fn copy_to(&self, out: &mut dyn Write) -> io::Result<u64> {
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| io::Error::other("the spilled requests were lost"))?
            .get_ref();
        let mut buf = vec![0u8; 64 * 1024];
        let mut at = 0u64;
        loop {
            let n = file.read_at(&mut buf, at)?;
            if n == 0 {
                return Ok(at);
            }
            out.write_all(&buf[..n])?;
            at += n as u64;
        }
    }

    /// Flushed, or the first error met.
    fn finish(&mut self) -> io::Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

/// A file with no name in the temporary directory, mode 0600: gone when closed,
/// whatever ends the process.
fn unnamed_file() -> io::Result<std::fs::File> {
    let dir = std::env::temp_dir();
    unnamed_file_in(&dir, true).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "a temporary file in {} for the report's requests: {e}",
                dir.display()
            ),
        )
    })
}

/// O_TMPFILE where the filesystem has it (`tmpfile`); else (9p, some overlay and
/// network filesystems: EOPNOTSUPP) a new 0600 file unlinked as soon as it is open.
fn unnamed_file_in(dir: &std::path::Path, tmpfile: bool) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |flags: i32| {
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).mode(0o600).custom_flags(flags);
        o
    };
    if tmpfile {
        match open(libc::O_TMPFILE).open(dir) {
            Ok(f) => return Ok(f),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {} // a kernel without it
            Err(e) => return Err(e),
        }
    }
    for n in 0u32.. {
        let path = dir.join(format!(".tokenscope-report-{}-{n}", std::process::id()));
        match open(0).create_new(true).open(&path) {
            Ok(f) => {
                std::fs::remove_file(&path)?;
                return Ok(f);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 1000 => {}
            Err(e) => return Err(e),
        }
    }
    unreachable!("the loop returns")
}

fn cupti_kind(kind: crate::ingest::model::GpuActivityKind) -> Option<&'static str> {
    use crate::ingest::model::GpuActivityKind;
    match kind {
        GpuActivityKind::Kernel => Some("kernel"),
        GpuActivityKind::Memcpy => Some("memcpy"),
        GpuActivityKind::Graph => Some("graph"),
        GpuActivityKind::Marker => Some("marker"),
        GpuActivityKind::Unknown => None,
    }
}

impl GpuSums {
    fn add_step(&mut self, s: &GpuStep) {
        let kind = match s.kind {
            crate::gpu::StepKind::Prefill => "prefill",
            crate::gpu::StepKind::Decode => "decode",
            crate::gpu::StepKind::Mixed => "mixed",
        };
        self.steps += 1;
        if let Some(d) = s.device {
            self.gpu_timed += 1;
            self.device_step_ns
                .entry(kind)
                .or_default()
                .push(d.end_ns - d.start_ns);
        }
        self.step_ns
            .entry(kind)
            .or_default()
            .push(s.end_ns - s.start_ns);
    }

    /// A cut's requests: stalls are named within a cut (attribution joins a cut's
    /// requests among themselves), so each staller's figures are whole here.
    fn add_stalls(&mut self, requests: &[Request]) {
        // Whose prefill stalled others: culprit id -> (stalls, longest gap).
        let mut culprits: BTreeMap<usize, (usize, u64)> = BTreeMap::new();
        for r in requests {
            let Some(g) = &r.gpu else { continue };
            self.stalls += g.stalled_by.len();
            for stall in &g.stalled_by {
                for &c in &stall.requests {
                    let e = culprits.entry(c).or_default();
                    e.0 += 1;
                    e.1 = e.1.max(stall.gap_ns);
                }
            }
        }
        for (id, (stalls, gap_ns)) in culprits {
            let prefill_ns = requests
                .iter()
                .find(|r| r.id == id)
                .and_then(|r| r.gpu.as_ref())
                .map_or(0, |g| g.prefill_ns);
            self.stallers.push(Staller {
                id,
                stalls,
                gap_ns,
                prefill_ns,
            });
        }
        self.stallers
            .sort_by_key(|s| (std::cmp::Reverse((s.gap_ns, s.stalls)), s.id));
        self.stallers.truncate(STALLERS);
    }

    fn summary(&self) -> GpuSummary {
        GpuSummary {
            steps: self.steps,
            gpu_timed: self.gpu_timed,
            step_ns: analyze::summaries(&self.step_ns),
            device_step_ns: analyze::summaries(&self.device_step_ns),
            stalls: self.stalls,
            cupti_ns: analyze::summaries(&self.cupti_ns),
            stallers: self.stallers.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stitch::testnet::{proxied, Net, MS};

    /// A request every 700 ms for 200 s: four diagnosis windows.
    fn long_recording() -> Vec<Event> {
        let mut net = Net::default();
        for k in 0..286u16 {
            let t0 = 1_000 * MS + u64::from(k) * 700 * MS;
            proxied(&mut net, t0, 20000 + k, 30000 + k, "r");
        }
        let mut events = net.events;
        events.sort_by_key(|e| e.ts_ns);
        events
    }

    fn json(report: &Report) -> String {
        let mut buf = Vec::new();
        super::super::write_json(report, &mut buf).expect("json");
        String::from_utf8(buf).expect("utf8")
    }

    #[test]
    fn a_long_replay_holds_what_is_in_flight_and_sums_up_the_same() {
        let header = FileHeader::default();
        let mut b = Builder::new(&header, &[], Requests::Keep);
        let mut held = 0;
        for e in long_recording() {
            b.push(e);
            held = held.max(b.cutter.held());
        }
        let report = b.finish();
        assert_eq!(report.requests.len(), 286);
        assert!(
            report.diagnosis_windows >= 4,
            "{} windows",
            report.diagnosis_windows
        );
        assert!(
            held <= 2 * 60_000 / 700 + 20,
            "what is held is about a window and the lateness, not the recording: {held}"
        );
        assert_eq!(
            report.requests.iter().map(|r| r.id).collect::<Vec<_>>(),
            (0..286).collect::<Vec<_>>(),
            "ids in start order, across windows"
        );
        // Summed up a window at a time, the same figures as all requests at once.
        let at_once = analyze::stats(&report.requests);
        assert_eq!(
            serde_json::to_value(&report.overall).unwrap(),
            serde_json::to_value(&at_once).unwrap()
        );
        assert_eq!(
            report.windows.len(),
            21,
            "10 s stats windows from 1 s to 200.5 s"
        );
        let windowed: usize = report.windows.iter().map(|w| w.stats.requests).sum();
        assert_eq!(windowed, 286);
    }

    #[test]
    fn spilled_requests_give_the_json_kept_ones_give() {
        let header = FileHeader::default();
        let mut kept = Builder::new(&header, &[], Requests::Keep);
        let mut spilled = Builder::new(&header, &[], Requests::SpillWithTokens);
        let mut dropped = Builder::new(&header, &[], Requests::Drop);
        for e in long_recording() {
            kept.push(e.clone());
            spilled.push(e.clone());
            dropped.push(e);
        }
        let kept = kept.finish();
        let spilled = spilled.try_finish().expect("spill");
        assert!(spilled.requests.is_empty());
        assert_eq!(spilled.spilled.as_ref().map(Spill::count), Some(286));
        let want = json(&kept);
        assert_eq!(json(&spilled), want, "byte for byte");
        assert_eq!(
            json(&spilled),
            want,
            "and again: the spill is read by offset"
        );
        // By default each request is listed as its summary, whatever its length.
        let mut summed = Builder::new(&header, &[], Requests::Spill);
        for e in long_recording() {
            summed.push(e);
        }
        let summed = summed.try_finish().expect("spill");
        let v: serde_json::Value = serde_json::from_str(&json(&summed)).expect("JSON");
        let listed = v["requests"].as_array().expect("requests");
        assert_eq!(listed.len(), 286);
        for (r, full) in listed.iter().zip(&kept.requests) {
            let value = super::super::summary::summary_value(full.clone());
            assert_eq!(*r, value);
            let bytes = super::super::summary::summary(full.clone());
            assert!(
                bytes == serde_json::to_vec(&value).expect("JSON"),
                "the summary, byte for byte as through a Value: {}",
                String::from_utf8_lossy(&bytes)
            );
            assert!(r["points"][0].get("token_ns").is_none(), "{r:#}");
        }
        let dropped = dropped.finish();
        assert!(dropped.requests.is_empty() && dropped.spilled.is_none());
        assert!(json(&dropped).ends_with("\"requests\": []\n}\n"));
        // No request: the spill is never created, and the JSON is whole.
        let empty = Builder::new(&header, &[], Requests::Spill)
            .try_finish()
            .expect("empty");
        let v: serde_json::Value = serde_json::from_str(&json(&empty)).expect("JSON");
        assert_eq!(v["requests"], serde_json::json!([]));
    }

    #[test]
    fn the_spill_file_has_no_name_with_or_without_o_tmpfile() {
        use std::io::{Read, Seek};
        let dir = tempfile::tempdir().expect("tempdir");
        for tmpfile in [true, false] {
            let mut f = unnamed_file_in(dir.path(), tmpfile).expect("a file");
            f.write_all(b"spilled").unwrap();
            f.rewind().unwrap();
            let mut back = String::new();
            f.read_to_string(&mut back).unwrap();
            assert_eq!(back, "spilled");
            let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
            assert!(
                names.is_empty(),
                "tmpfile {tmpfile}: no name left: {names:?}"
            );
        }
    }
}
