//! `tokenscope export`: a recording as a Perfetto trace (protobuf, written with
//! perfetto_protos), request-centred: a track per request with its stages and the
//! tokens at every observation point linked by flows, connections, GPU steps and
//! kernels, counter tracks, and the diagnoses (a "tokenscope diagnoses" track, and
//! an instant on each request a diagnosis cites). One packet sequence, packets in time order, event
//! names and categories interned on first use, clock MONOTONIC (3).

mod layout;
#[cfg(test)]
mod tests;

use std::io::Write;

use perfetto_protos::builtin_clock::BuiltinClock;
use perfetto_protos::clock_snapshot::{clock_snapshot::Clock, ClockSnapshot};
use perfetto_protos::counter_descriptor::{counter_descriptor::Unit, CounterDescriptor};
use perfetto_protos::debug_annotation::DebugAnnotation;
use perfetto_protos::interned_data::InternedData;
use perfetto_protos::process_descriptor::ProcessDescriptor;
use perfetto_protos::trace_packet::{trace_packet::SequenceFlags, TracePacket};
use perfetto_protos::trace_packet_defaults::TracePacketDefaults;
use perfetto_protos::track_descriptor::{track_descriptor::ChildTracksOrdering, TrackDescriptor};
use perfetto_protos::track_event::{track_event::Type, EventCategory, EventName, TrackEvent};
use protobuf::rt::WireType;
use protobuf::{CodedOutputStream, EnumOrUnknown, MessageField};

use crate::ingest::record::FileHeader;
use crate::ingest::Event;

use layout::{Arg, ChildOrder, Flow, OpKind, Plan, TrackKind};

/// The one packet sequence this writer uses (0 is reserved by Perfetto).
pub const SEQUENCE_ID: u32 = 1;
/// Perfetto's builtin clock id for CLOCK_MONOTONIC.
pub const CLOCK_MONOTONIC: u32 = 3;
/// The top-level track whose rows are the diagnoses, one slice each.
pub const DIAGNOSES_TRACK: &str = "tokenscope diagnoses";

/// What was written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    /// One per stitched request (equals the report's request count).
    pub request_tracks: usize,
    /// Token events, one per token at each observation point.
    pub token_instants: usize,
    pub gpu_steps: usize,
    /// Flows linking a token across observation points.
    pub flows: usize,
    /// Diagnosis slices (the report's diagnoses).
    pub diagnoses: usize,
    pub packets: u64,
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PerfettoError {
    #[error("writing the trace: {0}")]
    Io(#[from] std::io::Error),
    #[error("encoding a trace packet: {0}")]
    Encode(#[from] protobuf::Error),
}

/// Stitches `events` and writes them to `out` as a Perfetto trace, packet by packet.
pub fn write_trace(
    header: &FileHeader,
    events: &[Event],
    mut out: impl Write,
) -> Result<TraceSummary, PerfettoError> {
    let dropped = header.counters.map_or(0, |c| c.dropped);
    let stitched = layout::stitch(events, dropped > 0);
    let plan = layout::plan(header, events, &stitched);
    drop(stitched);
    let mut os = CodedOutputStream::new(&mut out);
    let mut w = Writer {
        os: &mut os,
        packets: 0,
        names_defined: vec![false; plan.names.len()],
        cats_defined: [false; layout::CATEGORIES.len()],
    };
    w.first_packet(&plan)?;
    for t in &plan.tracks {
        w.descriptor(t)?;
    }
    for op in &plan.ops {
        w.event(op, &plan)?;
    }
    let packets = w.packets;
    os.flush()?;
    let bytes = os.total_bytes_written();
    drop(os);
    out.flush()?;
    Ok(TraceSummary {
        request_tracks: plan.request_tracks,
        token_instants: plan.token_instants,
        gpu_steps: plan.gpu_steps,
        flows: plan.flows,
        diagnoses: plan.diagnoses,
        packets,
        bytes,
    })
}

struct Writer<'a, 'b> {
    os: &'a mut CodedOutputStream<'b>,
    packets: u64,
    names_defined: Vec<bool>,
    cats_defined: [bool; layout::CATEGORIES.len()],
}

impl Writer<'_, '_> {
    fn packet(&mut self, mut p: TracePacket) -> Result<(), PerfettoError> {
        p.set_trusted_packet_sequence_id(SEQUENCE_ID);
        // Trace.packet is field 1: the file is a Trace message written one packet at a time.
        self.os.write_tag(1, WireType::LengthDelimited)?;
        self.os.write_message_no_tag(&p)?;
        self.packets += 1;
        Ok(())
    }

    /// Clears incremental state, makes MONOTONIC the trace clock and every
    /// packet's default clock, and ties it to the wall clock of the recording.
    fn first_packet(&mut self, plan: &Plan) -> Result<(), PerfettoError> {
        // No timestamp of its own: spans that began before the recording (CUPTI)
        // come later in the file, and time must not go back on the sequence.
        let mut p = TracePacket::new();
        p.set_sequence_flags(SequenceFlags::SEQ_INCREMENTAL_STATE_CLEARED as u32);
        let mut defaults = TracePacketDefaults::new();
        defaults.set_timestamp_clock_id(CLOCK_MONOTONIC);
        p.trace_packet_defaults = MessageField::some(defaults);
        let mut snap = ClockSnapshot::new();
        let mut mono = Clock::new();
        mono.set_clock_id(BuiltinClock::BUILTIN_CLOCK_MONOTONIC as u32);
        let paired = plan.start_monotonic_ns > 0 && plan.start_realtime_ns > 0;
        mono.set_timestamp(if paired {
            plan.start_monotonic_ns
        } else {
            plan.start_ns
        });
        snap.clocks.push(mono);
        if paired {
            let mut real = Clock::new();
            real.set_clock_id(BuiltinClock::BUILTIN_CLOCK_REALTIME as u32);
            real.set_timestamp(plan.start_realtime_ns);
            snap.clocks.push(real);
        }
        snap.primary_trace_clock = Some(EnumOrUnknown::new(BuiltinClock::BUILTIN_CLOCK_MONOTONIC));
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

    fn event(&mut self, op: &layout::Op, plan: &Plan) -> Result<(), PerfettoError> {
        let mut e = TrackEvent::new();
        e.set_track_uuid(op.track());
        let mut interned = InternedData::new();
        let mut named = |e: &mut TrackEvent, w: &mut Self| {
            let n = op.name as usize;
            if !w.names_defined[n] {
                w.names_defined[n] = true;
                let mut en = EventName::new();
                en.set_iid(n as u64 + 1);
                en.set_name(plan.names[n].clone());
                interned.event_names.push(en);
            }
            e.set_name_iid(n as u64 + 1);
            let c = op.cat as usize;
            if !w.cats_defined[c] {
                w.cats_defined[c] = true;
                let mut ec = EventCategory::new();
                ec.set_iid(c as u64 + 1);
                ec.set_name(layout::CATEGORIES[c].into());
                interned.event_categories.push(ec);
            }
            e.category_iids.push(c as u64 + 1);
        };
        match op.kind() {
            OpKind::Begin => {
                e.type_ = Some(EnumOrUnknown::new(Type::TYPE_SLICE_BEGIN));
                named(&mut e, self);
            }
            OpKind::Instant => {
                e.type_ = Some(EnumOrUnknown::new(Type::TYPE_INSTANT));
                named(&mut e, self);
            }
            OpKind::End => e.type_ = Some(EnumOrUnknown::new(Type::TYPE_SLICE_END)),
            OpKind::Counter(v) => {
                e.type_ = Some(EnumOrUnknown::new(Type::TYPE_COUNTER));
                e.set_double_counter_value(v);
            }
        }
        match op.flow() {
            Flow::None => {}
            Flow::Step(id) => e.flow_ids.push(id),
            Flow::Last(id) => e.terminating_flow_ids.push(id),
        }
        if op.args > 0 {
            for (name, value) in &plan.args[op.args as usize - 1] {
                let mut a = DebugAnnotation::new();
                a.set_name((*name).into());
                match value {
                    Arg::Int(v) => a.set_int_value(*v),
                    Arg::Str(s) => a.set_string_value(s.clone()),
                    Arg::Ints(v) => a.array_values = v.iter().map(|&v| int_value(v)).collect(),
                    Arg::Strs(v) => {
                        a.array_values = v.iter().map(|s| string_value(s.clone())).collect()
                    }
                }
                e.debug_annotations.push(a);
            }
        }
        let mut p = TracePacket::new();
        p.set_timestamp(op.ts);
        let uses_interning = !matches!(op.kind(), OpKind::End | OpKind::Counter(_));
        if !interned.event_names.is_empty() || !interned.event_categories.is_empty() {
            p.interned_data = MessageField::some(interned);
        }
        if uses_interning {
            p.set_sequence_flags(SequenceFlags::SEQ_NEEDS_INCREMENTAL_STATE as u32);
        }
        p.set_track_event(e);
        self.packet(p)
    }
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
