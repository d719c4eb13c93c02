//! `tokenscope export`: a recording as a Perfetto trace (protobuf: track events
//! encoded by `wire`, the rest with perfetto_protos), request-centred: a track per request with its stages and the
//! tokens at every observation point linked by flows, connections, GPU steps and
//! kernels, counter tracks, and the diagnoses (a "tokenscope diagnoses" track, and
//! an instant on each request a diagnosis cites). Laid out from what the pipeline
//! hands over as the replay goes (`pipeline::Output`): the export stitches nothing
//! itself. A packet sequence per window, packets in time order, event names, categories
//! and argument names interned on first use. Timed as Perfetto's own writers time
//! packets: on a sequence-scoped incremental clock, each packet's timestamp the
//! nanoseconds since the one before on its sequence, the clock tied to MONOTONIC (3)
//! by the snapshot in each sequence's first packet.

mod bundle;
pub(super) mod layout;
#[cfg(test)]
mod tests;
mod windows;
mod wire;

use std::io::Write;

use perfetto_protos::builtin_clock::BuiltinClock;
use perfetto_protos::clock_snapshot::{clock_snapshot::Clock, ClockSnapshot};
use perfetto_protos::counter_descriptor::{counter_descriptor::Unit, CounterDescriptor};
use perfetto_protos::debug_annotation::{DebugAnnotation, DebugAnnotationName};
use perfetto_protos::interned_data::InternedData;
use perfetto_protos::process_descriptor::ProcessDescriptor;
use perfetto_protos::trace_packet::{trace_packet::SequenceFlags, TracePacket};
use perfetto_protos::trace_packet_defaults::TracePacketDefaults;
use perfetto_protos::track_descriptor::{track_descriptor::ChildTracksOrdering, TrackDescriptor};
use perfetto_protos::track_event::{track_event::Type, EventCategory, EventName};
use protobuf::{EnumOrUnknown, Message, MessageField};

use crate::ingest::record::{FileHeader, Source};
use crate::ingest::Event;
use crate::pipeline::{self, Pipeline};

use bundle::Bundles;
pub use bundle::Compression;
use layout::{Arg, ChildOrder, Flow, OpKind, Plan, TrackKind};
use windows::Windows;

/// The one packet sequence this writer uses (0 is reserved by Perfetto).
pub const SEQUENCE_ID: u32 = 1;
/// Perfetto's builtin clock id for CLOCK_MONOTONIC.
pub const CLOCK_MONOTONIC: u32 = 3;
/// The clock every packet is timed on: sequence-scoped (ids 64-127), incremental (a
/// packet's timestamp is its distance from the previous timed packet on the sequence;
/// the first one's from the snapshot's value), equal to MONOTONIC at the snapshot.
pub const INCREMENTAL_CLOCK: u32 = 64;
/// The top-level track whose rows are the diagnoses, one slice each.
pub const DIAGNOSES_TRACK: &str = "tokenscope diagnoses";

/// What was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    /// One per stitched request (equals the report's request count).
    pub request_tracks: usize,
    /// Token events, one per token at each observation point.
    pub token_instants: usize,
    /// Bytes of the token events' packets (of `bytes`).
    pub token_bytes: u64,
    pub gpu_steps: usize,
    /// Flows linking a token across observation points.
    pub flows: usize,
    /// Diagnosis slices (the report's diagnoses).
    pub diagnoses: usize,
    /// Packets, counted before compression (a bundle is not counted).
    pub packets: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Bytes of the packets before compression (`bytes` without it).
    pub uncompressed_bytes: u64,
    /// Bundles of deflated packets (see `Compression`).
    pub bundles: u64,
    /// Export windows, one packet sequence each.
    pub windows: u64,
    /// Events later than the pipeline's reorder window (used out of order).
    pub late_events: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PerfettoError {
    #[error("writing the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding a trace packet: {0}")]
    Encode(#[from] protobuf::Error),
    #[error(transparent)]
    Record(#[from] crate::ingest::record::RecordError),
}

/// How a recording's trace is cut: each window (its own packet sequence) writes the
/// requests, steps, samples and CUPTI spans that begin in it, the connections that end
/// in it, and the diagnoses of its requests; a window is written once nothing still
/// in flight can begin in it (see `windows`), so what is held is what is in flight,
/// whatever the recording's length.
#[derive(Clone, Copy, Debug)]
pub struct Windowing {
    pub window_ns: u64,
}

impl Default for Windowing {
    fn default() -> Self {
        Windowing {
            window_ns: 60 * 1_000_000_000,
        }
    }
}

impl Windowing {
    /// The whole recording in one window.
    pub fn whole() -> Windowing {
        Windowing {
            window_ns: u64::MAX,
        }
    }
}

/// Replays `events` (a whole recording, in memory) through the pipeline and writes
/// what it produced to `out` as a Perfetto trace in one window, compressed as
/// `tokenscope export` writes it by default.
pub fn write_trace(
    header: &FileHeader,
    events: &[Event],
    out: impl Write,
) -> Result<TraceSummary, PerfettoError> {
    write_events(
        header,
        events,
        out,
        Windowing::whole(),
        Compression::default(),
    )
}

/// `write_trace`, cut in windows as `tokenscope export` cuts them.
pub fn write_events(
    header: &FileHeader,
    events: &[Event],
    out: impl Write,
    windowing: Windowing,
    compression: Compression,
) -> Result<TraceSummary, PerfettoError> {
    let mut batches = events.chunks(1024);
    let next = |_done| Ok(batches.next().map(<[Event]>::to_vec));
    write_batches(header, next, out, windowing, compression)
}

/// Replays a recording from `reader` through the pipeline (no event is held past its
/// reorder window) and writes what it produced to `out`, window by window as they are
/// done (see `Windowing`).
pub fn write_trace_streamed(
    reader: &mut dyn Source,
    out: impl Write,
    windowing: Windowing,
    compression: Compression,
) -> Result<TraceSummary, PerfettoError> {
    let header = reader.header().clone();
    let next = |done: Option<Vec<Event>>| {
        if let Some(done) = done {
            reader.recycle(done);
        }
        Ok(reader.next_batch()?)
    };
    write_batches(&header, next, out, windowing, compression)
}

/// The pipeline a recording is replayed through for a trace.
pub fn pipeline(header: &FileHeader) -> Pipeline {
    let dropped = header.counters.is_some_and(|c| c.dropped > 0);
    Pipeline::new(pipeline::Config::export_of(header), dropped)
}

/// Pushes each batch through the pipeline, takes what it finished, and writes each
/// window once it is done: laid out, encoded and let go before the next. `next` is
/// handed each batch whose events all went through (`Pipeline::recycle_batches`).
fn write_batches(
    header: &FileHeader,
    mut next: impl FnMut(Option<Vec<Event>>) -> Result<Option<Vec<Event>>, PerfettoError>,
    mut out: impl Write,
    windowing: Windowing,
    compression: Compression,
) -> Result<TraceSummary, PerfettoError> {
    let mut p = pipeline(header);
    p.recycle_batches();
    let mut windows = Windows::new(header, windowing.window_ns);
    let mut w = Writer::new(Bundles::new(&mut out, compression));
    let mut uuids = layout::Uuids::default();
    while let Some(batch) = next(p.take_spare())? {
        p.push_batch(batch);
        windows.take(&mut p);
        while let Some(trace) = windows.ready(&p) {
            let plan = layout::plan(&trace, &mut uuids);
            w.window(&plan)?;
            let_go((trace, plan));
        }
    }
    p.flush();
    windows.take(&mut p);
    while let Some(trace) = windows.rest() {
        let plan = layout::plan(&trace, &mut uuids);
        w.window(&plan)?;
        let_go((trace, plan));
    }
    w.out.finish()?;
    Ok(TraceSummary {
        bytes: w.out.written,
        uncompressed_bytes: w.out.encoded,
        bundles: w.out.bundles,
        late_events: windows.late_events,
        ..w.summary
    })
}

/// Runs `there` on a scoped thread named `name` while `here` runs on this one, for
/// the parts of a window's cut, layout and sort that need not wait for each other
/// (with one window they run after the last event, where the reading thread's core
/// is idle). `there`'s result, or None where no thread could be had: it did not run,
/// and the caller does that work itself. A panic on the thread goes on here.
fn beside<T: Send, H>(
    name: &str,
    there: impl FnOnce() -> T + Send,
    here: impl FnOnce() -> H,
) -> (Option<T>, H) {
    std::thread::scope(|s| {
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, there);
        let h = here();
        let t = thread.ok().map(|t| {
            t.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        });
        (t, h)
    })
}

/// Frees a written window (its requests and ops: hundreds of thousands of allocations,
/// milliseconds) on a thread of its own: the next window, or the export's end, need
/// not wait for it. Where no thread can be had, here.
fn let_go<T: Send + 'static>(window: T) {
    let _ = std::thread::Builder::new()
        .name("tokenscope-free".into())
        .spawn(move || drop(window));
}

struct Writer<'a> {
    out: Bundles<'a>,
    sequence: u32,
    /// The incremental clock's value: the time of the sequence's last timed packet.
    clock_ns: u64,
    names_defined: Vec<bool>,
    cats_defined: [bool; layout::CATEGORIES.len()],
    /// Argument names interned on this sequence, iid = index + 1.
    arg_names: Vec<&'static str>,
    packets: wire::Packets,
    /// The window's name "token" (index into its plan's names), if it has one.
    token_name: Option<u32>,
    summary: TraceSummary,
}

impl<'a> Writer<'a> {
    fn new(out: Bundles<'a>) -> Self {
        Writer {
            out,
            sequence: SEQUENCE_ID,
            clock_ns: 0,
            names_defined: Vec::new(),
            cats_defined: [false; layout::CATEGORIES.len()],
            arg_names: Vec::new(),
            packets: wire::Packets::default(),
            token_name: None,
            summary: TraceSummary::default(),
        }
    }

    /// One window's plan as the next packet sequence (`SEQUENCE_ID` first): its own
    /// interning and clock, its tracks described (again, for those an earlier window
    /// described: same uuid), then its events in time order.
    fn window(&mut self, plan: &Plan) -> Result<(), PerfettoError> {
        let index = self.summary.windows;
        self.sequence = SEQUENCE_ID + u32::try_from(index).expect("fewer than 2^32 windows");
        self.names_defined = vec![false; plan.names.len()];
        self.cats_defined = [false; layout::CATEGORIES.len()];
        self.arg_names.clear();
        self.token_name = (plan.names.iter())
            .position(|n| n == "token")
            .map(|i| i as u32);
        self.first_packet(plan, index == 0)?;
        for t in &plan.tracks {
            self.descriptor(t)?;
        }
        for op in &plan.ops {
            self.event(op, plan)?;
        }
        let s = &mut self.summary;
        s.request_tracks += plan.request_tracks;
        s.token_instants += plan.token_instants;
        s.gpu_steps += plan.gpu_steps;
        s.flows += plan.flows;
        s.diagnoses += plan.diagnoses;
        s.windows += 1;
        Ok(())
    }

    fn packet(&mut self, mut p: TracePacket) -> Result<(), PerfettoError> {
        p.set_trusted_packet_sequence_id(self.sequence);
        // Trace.packet is field 1: the file is a Trace message written one packet at a time.
        let buf = self.out.buf();
        wire::key(buf, 1, wire::LENGTH_DELIMITED);
        p.write_length_delimited_to_vec(buf)?;
        self.summary.packets += 1;
        Ok(self.out.packet_done()?)
    }

    /// Clears the sequence's incremental state, makes the incremental clock every
    /// packet's default and starts it at the window's first event, where it equals
    /// MONOTONIC (the trace clock). The trace's first window also ties MONOTONIC to the
    /// wall clock of the recording.
    fn first_packet(&mut self, plan: &Plan, first: bool) -> Result<(), PerfettoError> {
        // Ops are in time order: no delta is negative. The packet has no timestamp of
        // its own (it would count as a step of the clock).
        self.clock_ns = plan.ops.first().map_or(plan.start_ns, |op| op.ts);
        let mut p = TracePacket::new();
        p.set_sequence_flags(SequenceFlags::SEQ_INCREMENTAL_STATE_CLEARED as u32);
        let mut defaults = TracePacketDefaults::new();
        defaults.set_timestamp_clock_id(INCREMENTAL_CLOCK);
        p.trace_packet_defaults = MessageField::some(defaults);
        let mut snap = ClockSnapshot::new();
        snap.clocks
            .push(clock(INCREMENTAL_CLOCK, self.clock_ns, true));
        snap.clocks
            .push(clock(CLOCK_MONOTONIC, self.clock_ns, false));
        // The trace clock is chosen once, before any timestamp is converted.
        let primary = Some(EnumOrUnknown::new(BuiltinClock::BUILTIN_CLOCK_MONOTONIC));
        if first {
            snap.primary_trace_clock = primary;
        }
        p.set_clock_snapshot(snap);
        self.packet(p)?;
        if !first || plan.start_monotonic_ns == 0 || plan.start_realtime_ns == 0 {
            return Ok(());
        }
        // The pair the recorder read at its start, as it read it.
        let mut snap = ClockSnapshot::new();
        snap.clocks
            .push(clock(CLOCK_MONOTONIC, plan.start_monotonic_ns, false));
        let realtime = BuiltinClock::BUILTIN_CLOCK_REALTIME as u32;
        snap.clocks
            .push(clock(realtime, plan.start_realtime_ns, false));
        snap.primary_trace_clock = primary;
        let mut p = TracePacket::new();
        p.set_clock_snapshot(snap);
        self.packet(p)
    }

    fn descriptor(&mut self, t: &layout::Track) -> Result<(), PerfettoError> {
        let mut d = TrackDescriptor::new();
        d.set_uuid(t.uuid);
        if let Some(parent) = t.parent {
            d.set_parent_uuid(parent);
        }
        match &t.kind {
            TrackKind::Process { pid } => {
                let mut pd = ProcessDescriptor::new();
                pd.set_pid(*pid as i32);
                pd.set_process_name(t.name.clone());
                d.process = MessageField::some(pd);
            }
            TrackKind::Plain => d.set_name(t.name.clone()),
            TrackKind::Counter { unit } => {
                d.set_name(t.name.clone());
                let mut c = CounterDescriptor::new();
                match unit {
                    Some(u) => c.set_unit_name((*u).into()),
                    None => c.unit = Some(EnumOrUnknown::new(Unit::UNIT_COUNT)),
                }
                d.counter = MessageField::some(c);
            }
        }
        let order = match t.children {
            ChildOrder::Default => None,
            ChildOrder::Chronological => Some(ChildTracksOrdering::CHRONOLOGICAL),
            ChildOrder::Explicit => Some(ChildTracksOrdering::EXPLICIT),
        };
        d.child_ordering = order.map(EnumOrUnknown::new);
        if let Some(rank) = t.rank {
            d.set_sibling_order_rank(rank);
        }
        let mut p = TracePacket::new();
        p.set_track_descriptor(d);
        self.packet(p)
    }

    /// The name's and category's iids, interning them (into `interned`) on first use.
    fn name_and_category(
        &mut self,
        op: &layout::Op,
        plan: &Plan,
        interned: &mut Option<InternedData>,
    ) -> (u64, u64) {
        let n = op.name as usize;
        if !self.names_defined[n] {
            self.names_defined[n] = true;
            let mut en = EventName::new();
            en.set_iid(n as u64 + 1);
            en.set_name(plan.names[n].clone());
            interned.get_or_insert_default().event_names.push(en);
        }
        let c = op.cat as usize;
        if !self.cats_defined[c] {
            self.cats_defined[c] = true;
            let mut ec = EventCategory::new();
            ec.set_iid(c as u64 + 1);
            ec.set_name(layout::CATEGORIES[c].into());
            interned.get_or_insert_default().event_categories.push(ec);
        }
        (n as u64 + 1, c as u64 + 1)
    }

    /// An argument name's iid, interning it (into `interned`) on first use.
    fn arg_name(&mut self, name: &'static str, interned: &mut Option<InternedData>) -> u64 {
        let i = match self.arg_names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                self.arg_names.push(name);
                let mut an = DebugAnnotationName::new();
                an.set_iid(self.arg_names.len() as u64);
                an.set_name(name.into());
                interned
                    .get_or_insert_default()
                    .debug_annotation_names
                    .push(an);
                self.arg_names.len() - 1
            }
        };
        i as u64 + 1
    }

    fn event(&mut self, op: &layout::Op, plan: &Plan) -> Result<(), PerfettoError> {
        // Most events define nothing new: no InternedData is built for them.
        let mut interned = None;
        let (kind, counter) = match op.kind() {
            OpKind::Begin => (Type::TYPE_SLICE_BEGIN, None),
            OpKind::Instant => (Type::TYPE_INSTANT, None),
            OpKind::End => (Type::TYPE_SLICE_END, None),
            OpKind::Counter(v) => (Type::TYPE_COUNTER, Some(v)),
        };
        let named = matches!(op.kind(), OpKind::Begin | OpKind::Instant)
            .then(|| self.name_and_category(op, plan, &mut interned));
        let flow = match op.flow() {
            Flow::None => None,
            Flow::Step(id) => Some((id, false)),
            Flow::Last(id) => Some((id, true)),
        };
        let mut annotations = Vec::new();
        if op.args > 0 {
            for (name, value) in &plan.args[op.args as usize - 1] {
                let mut a = DebugAnnotation::new();
                a.set_name_iid(self.arg_name(name, &mut interned));
                match value {
                    Arg::Int(v) => a.set_int_value(*v),
                    Arg::Str(s) => a.set_string_value(s.clone()),
                    Arg::Ints(v) => a.array_values = v.iter().map(|&v| int_value(v)).collect(),
                    Arg::Strs(v) => {
                        a.array_values = v.iter().map(|s| string_value(s.clone())).collect()
                    }
                }
                annotations.push(a);
            }
        }
        let delta_ns = op.ts.checked_sub(self.clock_ns).expect("ops in time order");
        self.clock_ns = op.ts;
        let buf = self.out.buf();
        let before = buf.len();
        self.packets.write_track_event(
            buf,
            &wire::TrackEvent {
                delta_ns,
                sequence: self.sequence,
                kind,
                track_uuid: plan.tracks[op.track() as usize - 1].uuid,
                named,
                counter,
                flow,
                annotations: &annotations,
                interned: interned.as_ref(),
            },
        )?;
        self.summary.packets += 1;
        let token = named.is_some()
            && op.cat == layout::Cat::Token as u8
            && Some(op.name) == self.token_name;
        if token {
            self.summary.token_bytes += (buf.len() - before) as u64;
        }
        Ok(self.out.packet_done()?)
    }
}

fn clock(id: u32, timestamp: u64, incremental: bool) -> Clock {
    let mut c = Clock::new();
    c.set_clock_id(id);
    c.set_timestamp(timestamp);
    if incremental {
        c.set_is_incremental(true);
    }
    c
}

fn int_value(v: i64) -> DebugAnnotation {
    let mut a = DebugAnnotation::new();
    a.set_int_value(v);
    a
}

fn string_value(s: String) -> DebugAnnotation {
    let mut a = DebugAnnotation::new();
    a.set_string_value(s);
    a
}
