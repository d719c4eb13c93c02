//! The written trace decoded back (rust-protobuf, perfetto_protos' Trace) and
//! checked for what Perfetto needs: sequence ids, incremental state, interning,
//! time order, balanced and nested slices, complete flows.

use std::collections::{BTreeMap, HashMap};

use perfetto_protos::trace::Trace;
use perfetto_protos::track_event::track_event::Type;
use protobuf::Message;

use super::*;
use crate::ingest::model::{event::Body, CudaApi, CudaCall, GpuActivity, NvmlSample};
use crate::ingest::record::Counters;
use crate::stitch::testnet::{proxied, Net, ENGINE, MS};

mod bundles;
mod check;
mod halves;
mod window;
use check::{check, flows_across, on_monotonic, Counts};

fn cuda(net: &mut Net, ts: u64, api: CudaApi, entry: bool) {
    let call = CudaCall {
        api: api as i32,
        entry,
        ..Default::default()
    };
    net.ev(ts, ENGINE, "engine", Body::Cuda(call));
}

/// Eight concurrent requests through a proxy, with the engine's GPU steps, CUPTI
/// kernels and NVML samples underneath.
fn synthetic() -> (FileHeader, Vec<Event>) {
    let mut net = Net::default();
    for k in 0..8u16 {
        let t0 = 1_000 * MS + u64::from(k) * 310 * MS;
        proxied(&mut net, t0, 41000 + k, 51000 + k, &format!("req-{k}"));
    }
    // A step every 10 ms while the first requests stream: prefill first, then decode.
    for s in 0..40u64 {
        let t = 1_030 * MS + s * 10 * MS;
        let launch = if s < 4 {
            CudaApi::LaunchKernel
        } else {
            CudaApi::GraphLaunch
        };
        cuda(&mut net, t, launch, true);
        cuda(&mut net, t + 10_000, launch, false);
        cuda(&mut net, t + 20_000, CudaApi::MemcpyDtoHAsync, true);
        cuda(&mut net, t + 30_000, CudaApi::StreamSynchronize, true);
        cuda(&mut net, t + 5 * MS, CudaApi::StreamSynchronize, false);
        for (j, name) in ["gemm", "attention"].iter().enumerate() {
            let a = GpuActivity {
                kind: GpuActivityKind::Kernel as i32,
                start_ns: t + 100_000 + j as u64 * 2 * MS,
                end_ns: t + 100_000 + j as u64 * 2 * MS + MS,
                stream: 7,
                name: (*name).into(),
                ..Default::default()
            };
            // Arriving after the step closed (the recorder writes them at their start;
            // a live hook's buffers come late): they join it all the same.
            net.ev(t + 6 * MS, ENGINE, "engine", Body::Gpu(a));
        }
    }
    for s in 0..10u64 {
        let sample = NvmlSample {
            gpu_util_pct: Some(50 + s as u32),
            power_mw: Some(200_000),
            ..Default::default()
        };
        net.ev(1_000 * MS + s * 100 * MS, 0, "", Body::Nvml(sample));
    }
    let header = FileHeader {
        start_monotonic_ns: 900 * MS,
        end_monotonic_ns: 2_000 * MS,
        complete: true,
        counters: Some(Counters {
            dropped: 3,
            ..Default::default()
        }),
        ..Default::default()
    };
    (header, net.events)
}

use crate::ingest::model::GpuActivityKind;

/// The trace as trace processor reads it: each bundle expanded in its place.
fn decode(buf: &[u8]) -> Trace {
    let packets = bundle::expand(buf).unwrap_or_else(|e| panic!("{e}"));
    Trace::parse_from_bytes(&packets).expect("the trace decodes as perfetto.protos.Trace")
}

#[test]
fn the_written_trace_decodes_and_keeps_perfettos_invariants() {
    let (header, events) = synthetic();
    let mut buf = Vec::new();
    let summary = write_trace(&header, &events, &mut buf).expect("trace written");
    assert_eq!(summary.bytes, buf.len() as u64, "bytes counted as written");
    let trace = decode(&buf);
    assert_eq!(summary.packets, trace.packet.len() as u64);
    let counts = check(&trace).unwrap_or_else(|e| panic!("invariant broken: {e}"));

    let report = crate::export::report::build(&header, &events);
    // What the export lays out: its own replay of the recording.
    let mut replay = pipeline(&header);
    for e in &events {
        replay.push(e.clone());
    }
    let ours = replay.finish();
    assert_eq!(
        serde_json::to_value(&ours.requests).expect("json"),
        serde_json::to_value(&report.requests).expect("json"),
        "the exporter stitches exactly as the report does"
    );
    assert_eq!(ours.steps, crate::stitch::stitch(&events, true).steps);
    let tokens: usize = report
        .requests
        .iter()
        .flat_map(|r| &r.points)
        .map(|p| p.token_ns.len())
        .sum();
    assert_eq!(
        report.requests.len(),
        8,
        "the synthetic traffic has 8 requests"
    );
    assert_eq!(
        counts.request_tracks,
        report.requests.len(),
        "a track per request"
    );
    assert_eq!(
        counts.token_instants, tokens,
        "an instant per token per point"
    );
    assert_eq!(tokens, 8 * 6 * 4, "6 tokens at 4 points per request");
    assert_eq!(counts.gpu_steps, report.gpu.steps, "a slice per GPU step");
    assert_eq!(
        counts.device_steps, report.gpu.gpu_timed,
        "one in device time per GPU-timed step"
    );
    assert_eq!((report.gpu.steps, report.gpu.gpu_timed), (40, 40));
    assert_eq!(counts.flows, 8 * 6, "a flow per token, engine to client");
    assert_eq!(counts.kernels, 80, "every CUPTI kernel");
    assert!(
        counts.counter_tracks >= 5,
        "NVML and derived counters: {counts:?}"
    );
    assert_eq!(
        (
            summary.request_tracks,
            summary.token_instants,
            summary.gpu_steps,
            summary.flows,
            summary.diagnoses
        ),
        (
            counts.request_tracks,
            counts.token_instants,
            counts.gpu_steps,
            counts.flows,
            counts.diagnoses
        ),
        "the summary says what the trace holds"
    );
}

#[test]
fn the_checker_catches_each_broken_invariant() {
    let (header, events) = synthetic();
    let mut buf = Vec::new();
    write_trace(&header, &events, &mut buf).expect("trace written");
    let good = decode(&buf);
    let broken = |what: &str, f: &dyn Fn(&mut Trace)| {
        let mut t = good.clone();
        f(&mut t);
        let err = check(&t).expect_err(what);
        println!("{what}: {err}");
    };
    broken("no sequence id", &|t| {
        t.packet[3].clear_trusted_packet_sequence_id()
    });
    broken("state not cleared", &|t| t.packet[0].set_sequence_flags(0));
    let first_interned = good
        .packet
        .iter()
        .position(|p| p.interned_data.is_some())
        .expect("some interned data");
    broken("name used before defined", &|t| {
        t.packet[first_interned].interned_data.clear()
    });
    broken("name defined twice", &|t| {
        let d = t.packet[first_interned].interned_data.clone();
        let last = t.packet.len() - 1;
        t.packet[last].interned_data = d;
    });
    let ends: Vec<usize> = good
        .packet
        .iter()
        .enumerate()
        .filter(|(_, p)| p.has_track_event() && p.track_event().type_() == Type::TYPE_SLICE_END)
        .map(|(i, _)| i)
        .collect();
    broken("unbalanced slices", &|t| {
        t.packet.remove(ends[ends.len() / 2]);
    });
    // On the incremental clock time cannot go back; a packet timed on MONOTONIC can.
    let absolute = on_monotonic(&good).expect("a sound trace");
    broken("time goes back", &|t| {
        let i = ends[ends.len() / 2];
        let earlier = absolute.packet[i - 5].timestamp();
        t.packet[i].set_timestamp_clock_id(CLOCK_MONOTONIC);
        t.packet[i].set_timestamp(earlier.saturating_sub(1));
    });
    broken("the incremental clock used before its snapshot", &|t| {
        t.packet[0].clear_clock_snapshot()
    });
    broken(
        "a snapshot that does not tie the clock to MONOTONIC",
        &|t| {
            let snap = t.packet[0].mut_clock_snapshot();
            snap.clocks.retain(|c| c.clock_id() != CLOCK_MONOTONIC);
        },
    );
    broken("another trace clock", &|t| {
        let snap = t.packet[0].mut_clock_snapshot();
        snap.primary_trace_clock = Some(EnumOrUnknown::new(BuiltinClock::BUILTIN_CLOCK_BOOTTIME));
    });
    broken("another default clock", &|t| {
        let d = t.packet[0].trace_packet_defaults.mut_or_insert_default();
        d.set_timestamp_clock_id(6);
    });
    broken(
        "a timed packet that does not say it needs the sequence's state",
        &|t| t.packet[ends[0]].set_sequence_flags(0),
    );
    let counter = good
        .packet
        .iter()
        .position(|p| p.has_track_event() && p.track_event().type_() == Type::TYPE_COUNTER)
        .expect("some counter");
    broken("a counter event without a value", &|t| {
        let e = t.packet[counter].mut_track_event();
        e.clear_counter_value();
        e.clear_double_counter_value();
    });
    let flow_start = good
        .packet
        .iter()
        .position(|p| p.has_track_event() && !p.track_event().flow_ids_old.is_empty())
        .expect("some flow");
    broken("two flows in flight on one id", &|t| {
        // The engine's next token on the same id, at the same time, before the first ends.
        let mut again = t.packet[flow_start].clone();
        again.interned_data.clear();
        again.set_timestamp(0);
        t.packet.insert(flow_start + 1, again);
    });
    broken("a flow that never ends", &|t| {
        for p in t.packet.iter_mut().filter(|p| p.has_track_event()) {
            p.mut_track_event().terminating_flow_ids_old.clear();
        }
    });
}

/// The committed lab recording tests/fixtures/diagnose/tuned-plain: 27 streamed
/// requests seen at four points (client, nginx both ways, engine), GPU steps.
pub(super) fn lab_recording() -> (FileHeader, Vec<Event>) {
    fixture("tuned-plain")
}

/// The committed recording tests/fixtures/diagnose/NAME.tsrec.gz.
pub(super) fn fixture(name: &str) -> (FileHeader, Vec<Event>) {
    let gz = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../tests/fixtures/diagnose/{name}.tsrec.gz"));
    let mut bytes = Vec::new();
    let file = std::fs::File::open(&gz).expect("the committed fixture");
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut bytes)
        .expect("gunzip");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tuned-plain.tsrec");
    std::fs::write(&path, bytes).expect("write");
    let mut r = crate::ingest::record::RecordReader::open(&path).expect("open the fixture");
    let events = r.read_all().expect("read the fixture");
    (r.header.clone(), events)
}

/// Decoded token instants' times by (request id, point track name).
fn token_times(trace: &Trace) -> BTreeMap<(usize, String), Vec<u64>> {
    let (seen, tracks) = events_of(trace);
    let mut times: BTreeMap<(usize, String), Vec<u64>> = BTreeMap::new();
    for s in seen.iter().filter(|s| s.end.is_none() && s.name == "token") {
        let (point, parent) = &tracks[&s.track];
        let request = &tracks[&parent.expect("a point's track is under its request's")].0;
        let id = request
            .strip_prefix("request ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a request track is named 'request N ...': {request:?}"));
        times.entry((id, point.clone())).or_default().push(s.begin);
    }
    for v in times.values_mut() {
        v.sort_unstable();
    }
    times
}

/// A token event is what Perfetto's own writers make of an instant: the packet's
/// framing (2 B), sequence id (2), flags (2), its distance in ns from the packet
/// before (a varint, 3-4), the event's framing (2), type (2), interned name (2) and
/// category (2), a small track uuid (2-3), and the flow id linking the token across
/// its points (2: a varint id, freed when its flow ends, on every token of this
/// recording). Decoded, each keeps its recorded time to the nanosecond.
#[test]
fn token_events_cost_a_few_varints_and_keep_their_time_to_the_nanosecond() {
    let (header, events) = lab_recording();
    let mut buf = Vec::new();
    let summary = write_trace(&header, &events, &mut buf).expect("trace written");
    let trace = decode(&buf);
    let counts = check(&trace).unwrap_or_else(|e| panic!("invariant broken: {e}"));

    let report = crate::export::report::build(&header, &events);
    let mut recorded: BTreeMap<(usize, String), Vec<u64>> = BTreeMap::new();
    for r in &report.requests {
        for p in r.points.iter().filter(|p| !p.token_ns.is_empty()) {
            let name = format!("{} ({} {})", p.kind.label(), p.comm, p.pid);
            let mut ts = p.token_ns.clone();
            ts.sort_unstable();
            recorded.insert((r.id, name), ts);
        }
    }
    let tokens: usize = recorded.values().map(Vec::len).sum();
    assert!(
        report.requests.len() >= 20 && tokens >= 5_000,
        "the fixture streams its requests: {} requests, {tokens} tokens",
        report.requests.len()
    );
    assert_eq!(
        counts.token_instants, tokens,
        "an instant per token per point"
    );
    assert!(
        token_times(&trace) == recorded,
        "every token at every point at its recorded nanosecond"
    );

    // What the writer counted is what the token packets decode to.
    let token_iid = trace
        .packet
        .iter()
        .filter_map(|p| p.interned_data.as_ref())
        .flat_map(|d| &d.event_names)
        .find(|n| n.name() == "token")
        .map(|n| n.iid())
        .expect("the name 'token' interned");
    let framed = |p: &perfetto_protos::trace_packet::TracePacket| {
        let n = p.compute_size();
        1 + protobuf::rt::compute_raw_varint64_size(n) + n
    };
    let decoded: u64 = trace
        .packet
        .iter()
        .filter(|p| {
            p.has_track_event()
                && p.track_event().type_() == Type::TYPE_INSTANT
                && p.track_event().name_iid() == token_iid
        })
        .map(framed)
        .sum();
    assert_eq!(
        summary.token_bytes, decoded,
        "token bytes counted as written"
    );
    let per_token = summary.token_bytes as f64 / tokens as f64;
    let whole = summary.bytes as f64 / tokens as f64;
    println!(
        "{tokens} token events: {per_token:.1} B each; the whole trace {} B, {whole:.1} B per token event",
        summary.bytes
    );
    // Absolute timestamps (7-8 B), a hashed track uuid (9-10 B), a name not interned
    // (7 B), a fixed64 flow id (10 B where the varint one is 2), flow ids never reused
    // (3 B from the 128th flow on) or a debug annotation per token would each break this.
    assert!(
        per_token <= 23.0,
        "a token event is at most 23 B on average: {per_token:.1}"
    );
    assert!(
        whole <= 36.0,
        "the whole trace, GPU steps and counters included, is at most 36 B per token event: {whole:.1}"
    );
    let flow_ids: std::collections::BTreeSet<u64> = trace
        .packet
        .iter()
        .flat_map(|p| {
            let e = p.track_event();
            e.flow_ids_old.iter().chain(&e.terminating_flow_ids_old)
        })
        .copied()
        .collect();
    assert!(
        counts.flows > 1_000 && flow_ids.last() < Some(&128),
        "{} flows on ids freed as each ends, all one-byte varints: {flow_ids:?}",
        counts.flows
    );
}

/// A slice or an instant (`end` None) of a decoded trace, with its track's name.
#[derive(Debug)]
struct Seen {
    track: u64,
    track_name: String,
    name: String,
    begin: u64,
    end: Option<u64>,
}

/// Track uuid -> (name, parent uuid).
type Tracks = HashMap<u64, (String, Option<u64>)>;

/// Every slice and instant of a trace (one that passed `check`), in begin order.
fn events_of(trace: &Trace) -> (Vec<Seen>, Tracks) {
    let trace = &on_monotonic(trace).expect("a checked trace");
    let mut names: HashMap<u64, String> = HashMap::new();
    let mut tracks = Tracks::new();
    let mut seen: Vec<Seen> = Vec::new();
    let mut open: HashMap<u64, Vec<usize>> = HashMap::new();
    for p in &trace.packet {
        if let Some(d) = p.interned_data.as_ref() {
            for n in &d.event_names {
                names.insert(n.iid(), n.name().into());
            }
        }
        if p.has_track_descriptor() {
            let d = p.track_descriptor();
            let parent = d.has_parent_uuid().then(|| d.parent_uuid());
            tracks.insert(d.uuid(), (d.name().into(), parent));
        }
        if !p.has_track_event() {
            continue;
        }
        let e = p.track_event();
        let track = e.track_uuid();
        let ev = || Seen {
            track,
            track_name: tracks[&track].0.clone(),
            name: names.get(&e.name_iid()).cloned().unwrap_or_default(),
            begin: p.timestamp(),
            end: None,
        };
        match e.type_() {
            Type::TYPE_SLICE_BEGIN => {
                open.entry(track).or_default().push(seen.len());
                seen.push(ev());
            }
            Type::TYPE_SLICE_END => {
                let i = open
                    .get_mut(&track)
                    .and_then(|s| s.pop())
                    .expect("balanced");
                seen[i].end = Some(p.timestamp());
            }
            Type::TYPE_INSTANT => seen.push(ev()),
            _ => {}
        }
    }
    (seen, tracks)
}

#[test]
fn diagnoses_are_a_track_of_slices_over_their_evidence_cited_on_each_request() {
    let (header, events) = synthetic();
    let timeline = crate::stitch::stitch(&events, true);
    let nvml = crate::diagnose::nvml_samples(&events);
    let want = crate::diagnose::diagnose(&crate::diagnose::Input::new(&timeline, &nvml));
    assert!(
        !want.is_empty(),
        "each synthetic request opens its own connection: at least one diagnosis"
    );
    let mut buf = Vec::new();
    let summary = write_trace(&header, &events, &mut buf).expect("trace written");
    assert_eq!(summary.diagnoses, want.len(), "a slice per diagnosis");
    let trace = decode(&buf);
    check(&trace).unwrap_or_else(|e| panic!("invariant broken: {e}"));
    let (seen, tracks) = events_of(&trace);

    let root: Vec<u64> = tracks
        .iter()
        .filter(|(_, (name, parent))| name == DIAGNOSES_TRACK && parent.is_none())
        .map(|(uuid, _)| *uuid)
        .collect();
    assert_eq!(root.len(), 1, "one top-level {DIAGNOSES_TRACK:?} track");
    let slices: Vec<&Seen> = seen
        .iter()
        .filter(|s| tracks[&s.track].1 == Some(root[0]))
        .collect();
    assert_eq!(
        slices.len(),
        want.len(),
        "a slice per diagnosis: {slices:?}"
    );
    for d in &want {
        let label = format!("[{}] {}", d.rule, d.title);
        let name = format!("{label}: {}", crate::export::report::saving_line(d));
        let s = slices
            .iter()
            .find(|s| s.track_name == label)
            .unwrap_or_else(|| panic!("a row named {label:?}: {slices:?}"));
        assert_eq!(s.name, name, "the slice names the fix and its saving");
        assert_eq!(
            (s.begin, s.end),
            (d.evidence.start_ns, Some(d.evidence.end_ns)),
            "{label}: the slice spans the evidence"
        );
        assert!(!d.evidence.request_ids.is_empty(), "{label} cites requests");
        for &id in &d.evidence.request_ids {
            let prefix = format!("request {id} ");
            let cited = seen.iter().any(|e| {
                e.end.is_none()
                    && e.track_name.starts_with(&prefix)
                    && e.name.starts_with("cited by ")
                    && e.name.contains(&label)
            });
            assert!(cited, "request {id}'s track has an instant citing {label}");
        }
    }
    println!(
        "{}",
        slices
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_windowed_trace_holds_what_the_whole_one_does_each_window_a_sound_sequence() {
    let (header, events) = synthetic();
    let write = |windowing: Windowing| {
        let mut buf = Vec::new();
        let summary = write_events(
            &header,
            &events,
            &mut buf,
            windowing,
            Compression::default(),
        )
        .expect("trace written");
        let trace = decode(&buf);
        (summary, trace)
    };
    let (whole_summary, whole_trace) = write(Windowing::whole());
    let whole = check(&whole_trace).unwrap_or_else(|e| panic!("invariant broken: {e}"));
    let (summary, trace) = write(Windowing {
        window_ns: 300 * MS,
    });
    assert!(
        summary.windows >= 4,
        "8 requests 310 ms apart span several 300 ms windows: {summary:?}"
    );
    // Read as trace processor reads it, all windows sorted by time: flow ids freed in
    // one window and taken in another never join two flows.
    let flows = flows_across(&trace).unwrap_or_else(|e| panic!("across windows: {e}"));
    assert_eq!(flows, whole.flows, "each flow once across the windows");
    let mut sequences: Vec<u32> = trace
        .packet
        .iter()
        .map(|p| p.trusted_packet_sequence_id())
        .collect();
    sequences.dedup();
    assert_eq!(
        sequences.len() as u64,
        summary.windows,
        "a packet sequence per window, one after the other"
    );
    let mut sum = Counts::default();
    for seq in sequences {
        let mut one = Trace::new();
        one.packet = trace
            .packet
            .iter()
            .filter(|p| p.trusted_packet_sequence_id() == seq)
            .cloned()
            .collect();
        let c = check(&one).unwrap_or_else(|e| panic!("window {seq}: invariant broken: {e}"));
        sum.request_tracks += c.request_tracks;
        sum.token_instants += c.token_instants;
        sum.gpu_steps += c.gpu_steps;
        sum.flows += c.flows;
        sum.kernels += c.kernels;
        sum.diagnoses += c.diagnoses;
    }
    assert_eq!(
        (
            sum.request_tracks,
            sum.token_instants,
            sum.gpu_steps,
            sum.flows,
            sum.kernels
        ),
        (
            whole.request_tracks,
            whole.token_instants,
            whole.gpu_steps,
            whole.flows,
            whole.kernels
        ),
        "each request, token, step, flow and kernel once, as in one window"
    );
    // Diagnoses are each window's, over its requests: one request per 300 ms window
    // is too few for the rule the whole recording's eight requests meet.
    assert_eq!(
        (summary.request_tracks, summary.diagnoses),
        (whole_summary.request_tracks, sum.diagnoses),
        "the summary counts what the windows hold"
    );
    assert!(whole.diagnoses > 0, "the whole recording has a diagnosis");
    // A track several windows describe (a GPU thread's, a counter) is described the
    // same each time; no uuid names two tracks.
    let mut described: HashMap<u64, (String, Option<u64>)> = HashMap::new();
    let mut again = 0;
    for p in trace.packet.iter().filter(|p| p.has_track_descriptor()) {
        let d = p.track_descriptor();
        if d.process.is_some() {
            continue;
        }
        let seen = (
            d.name().to_string(),
            d.has_parent_uuid().then(|| d.parent_uuid()),
        );
        if let Some(before) = described.insert(d.uuid(), seen.clone()) {
            assert_eq!(
                before,
                seen,
                "track {} described twice, differently",
                d.uuid()
            );
            again += 1;
        }
    }
    assert!(again > 0, "some tracks are described by several windows");
    // Each window's clock starts again from its own snapshot.
    assert!(
        token_times(&trace) == token_times(&whole_trace),
        "each token at the same nanosecond, windowed or not"
    );
}

#[test]
fn ring_buffer_drops_are_drawn_as_the_recorder_read_them() {
    let (header, mut events) = synthetic();
    // Readings the recorder wrote when the drops moved: 1 by 1.2 s, 3 by 1.6 s.
    for (t, dropped) in [(1_200 * MS, 1), (1_600 * MS, 3)] {
        events.push(Event {
            ts_ns: t,
            pid: 0,
            tid: 0,
            cpu: 0,
            comm: Default::default(),
            body: Some(Body::Ring(crate::ingest::model::RingCounters {
                submitted: 1000,
                dropped,
            })),
        });
    }
    events.sort_by_key(|e| e.ts_ns);
    let mut buf = Vec::new();
    write_trace(&header, &events, &mut buf).expect("trace written");
    let trace = decode(&buf);
    check(&trace).unwrap_or_else(|e| panic!("invariant broken: {e}"));
    let trace = on_monotonic(&trace).expect("checked");
    let uuid = trace
        .packet
        .iter()
        .filter(|p| p.has_track_descriptor())
        .map(|p| p.track_descriptor())
        .find(|d| d.name() == "ring-buffer drops")
        .map(|d| d.uuid())
        .expect("a ring-buffer drops track");
    let drops: Vec<(u64, f64)> = trace
        .packet
        .iter()
        .filter(|p| p.has_track_event() && p.track_event().track_uuid() == uuid)
        .map(|p| (p.timestamp(), check::counter_value(p.track_event())))
        .collect();
    let values: Vec<f64> = drops.iter().map(|d| d.1).collect();
    assert_eq!(
        values,
        [0.0, 1.0, 3.0, 3.0],
        "0 at the start, each reading, the header's total at the end: {drops:?}"
    );
    assert_eq!(drops[1].0, 1_200 * MS, "a reading at its own time");
    assert!(drops.windows(2).all(|w| w[0].0 <= w[1].0), "in time order");
}
