//! Track-event packets encoded field by field, as Perfetto's own protozero writers
//! encode them: building and dropping perfetto_protos' TracePacket, TrackEvent and
//! InternedData structs for each of millions of events was a quarter of an export's
//! time. Field numbers are those of trace_packet.proto and track_event.proto; the tests
//! decode what this writes with perfetto_protos, and the end-to-end test with Google's
//! bindings. Interned data and debug annotations (first uses, slices' arguments) are
//! rare and still encoded by perfetto_protos.

use perfetto_protos::debug_annotation::DebugAnnotation;
use perfetto_protos::interned_data::InternedData;
use perfetto_protos::trace_packet::trace_packet::SequenceFlags;
use perfetto_protos::track_event::track_event::Type;
use protobuf::Message;

/// TracePacket fields.
const TIMESTAMP: u32 = 8;
const TRUSTED_PACKET_SEQUENCE_ID: u32 = 10;
const TRACK_EVENT: u32 = 11;
const INTERNED_DATA: u32 = 12;
const SEQUENCE_FLAGS: u32 = 13;
/// TrackEvent fields.
const CATEGORY_IIDS: u32 = 3;
const DEBUG_ANNOTATIONS: u32 = 4;
const TYPE: u32 = 9;
const NAME_IID: u32 = 10;
const TRACK_UUID: u32 = 11;
const COUNTER_VALUE: u32 = 30;
const DOUBLE_COUNTER_VALUE: u32 = 44;
/// The varint twins of `flow_ids` (47) and `terminating_flow_ids` (48): deprecated in
/// track_event.proto, but trace processor reads either the same way (one flow id space),
/// and a small id costs a byte or two as a varint where fixed64 costs 8. Every token
/// event carries one (see `layout::FlowIds`: an id is reused once its flow has ended).
const FLOW_IDS_OLD: u32 = 36;
const TERMINATING_FLOW_IDS_OLD: u32 = 42;

/// Up to here every integer is an f64 exactly.
const MAX_EXACT: f64 = (1u64 << 53) as f64;

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
pub(super) const LENGTH_DELIMITED: u32 = 2;

/// One track event, as `Packets::track_event` writes it.
pub(super) struct TrackEvent<'a> {
    /// Nanoseconds since the sequence's previous timed packet (the incremental clock).
    pub(super) delta_ns: u64,
    pub(super) sequence: u32,
    pub(super) kind: Type,
    pub(super) track_uuid: u64,
    /// Interned (name, category) iids.
    pub(super) named: Option<(u64, u64)>,
    pub(super) counter: Option<f64>,
    /// The flow id, and whether it ends here.
    pub(super) flow: Option<(u64, bool)>,
    pub(super) annotations: &'a [DebugAnnotation],
    pub(super) interned: Option<&'a InternedData>,
}

/// Scratch buffers, reused from packet to packet.
#[derive(Default)]
pub(super) struct Packets {
    event: Vec<u8>,
    packet: Vec<u8>,
}

impl Packets {
    /// The event as the Trace's next packet (field 1) at the end of `out`. An event
    /// with no arguments or interned data (nearly all: tokens, ends, counters) is
    /// encoded in arrays on the stack and copied once: through `track_event`'s two
    /// vectors, checking capacity at each byte, it was ~470 instructions an event.
    pub(super) fn write_track_event(
        &mut self,
        out: &mut Vec<u8>,
        e: &TrackEvent,
    ) -> Result<(), protobuf::Error> {
        if !e.annotations.is_empty() || e.interned.is_some() {
            let packet = self.track_event(e)?;
            bytes(out, 1, packet);
            return Ok(());
        }
        let mut event = Small::<EVENT_MAX>::default();
        event_fields(&mut event, e)?;
        let mut packet = Small::<PACKET_MAX>::default();
        packet_fields(&mut packet, e, event.bytes())?;
        bytes(out, 1, packet.bytes());
        Ok(())
    }

    /// The encoded TracePacket (without the Trace's field tag and length).
    pub(super) fn track_event(&mut self, e: &TrackEvent) -> Result<&[u8], protobuf::Error> {
        let Packets { event, packet } = self;
        event.clear();
        event_fields(event, e)?;
        packet.clear();
        packet_fields(packet, e, event)?;
        Ok(packet)
    }
}

/// A TrackEvent's fields.
fn event_fields(o: &mut impl Out, e: &TrackEvent) -> Result<(), protobuf::Error> {
    if let Some((_, cat)) = e.named {
        o.uint(CATEGORY_IIDS, cat);
    }
    for a in e.annotations {
        o.bytes(DEBUG_ANNOTATIONS, &a.write_to_bytes()?);
    }
    o.uint(TYPE, e.kind as u64);
    if let Some((name, _)) = e.named {
        o.uint(NAME_IID, name);
    }
    o.uint(TRACK_UUID, e.track_uuid);
    match e.counter {
        // Counts (requests in flight, tokens/s, drops) as a varint, 2-5 B where
        // the double is 10: trace processor reads either (TrackEventTokenizer).
        Some(v) if v.fract() == 0.0 && (0.0..MAX_EXACT).contains(&v) => {
            o.uint(COUNTER_VALUE, v as u64)
        }
        Some(v) => o.fixed64(DOUBLE_COUNTER_VALUE, v.to_bits()),
        None => {}
    }
    match e.flow {
        Some((id, false)) => o.uint(FLOW_IDS_OLD, id),
        Some((id, true)) => o.uint(TERMINATING_FLOW_IDS_OLD, id),
        None => {}
    }
    Ok(())
}

/// A TracePacket's fields around its encoded `event`.
fn packet_fields(o: &mut impl Out, e: &TrackEvent, event: &[u8]) -> Result<(), protobuf::Error> {
    o.uint(TIMESTAMP, e.delta_ns);
    o.uint(TRUSTED_PACKET_SEQUENCE_ID, u64::from(e.sequence));
    o.bytes(TRACK_EVENT, event);
    if let Some(d) = e.interned {
        o.bytes(INTERNED_DATA, &d.write_to_bytes()?);
    }
    // Every event needs the sequence's clock; named ones its interning too.
    let needs = SequenceFlags::SEQ_NEEDS_INCREMENTAL_STATE as u64;
    o.uint(SEQUENCE_FLAGS, needs);
    Ok(())
}

/// A plain event's fields: four varint fields (11 B each at most), a counter's value
/// and a flow id (12 B each at most).
const EVENT_MAX: usize = 4 * 11 + 2 * 12;
/// Its packet: time (11 B), sequence (6 B), the event's key and length (3 B) and
/// flags (2 B) around it.
const PACKET_MAX: usize = EVENT_MAX + 22;

/// Where encoded fields go: a vector, or `Small` on the stack.
trait Out {
    fn put(&mut self, b: &[u8]);
    fn byte(&mut self, b: u8);

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.byte(v as u8 | 0x80);
            v >>= 7;
        }
        self.byte(v as u8);
    }

    fn key(&mut self, field: u32, wire: u32) {
        self.varint(u64::from(field << 3 | wire));
    }

    fn uint(&mut self, field: u32, v: u64) {
        self.key(field, VARINT);
        self.varint(v);
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, FIXED64);
        self.put(&v.to_le_bytes());
    }

    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, LENGTH_DELIMITED);
        self.varint(b.len() as u64);
        self.put(b);
    }
}

impl Out for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }

    fn byte(&mut self, b: u8) {
        self.push(b);
    }
}

/// Bytes of a message short enough to be bounded, on the stack.
struct Small<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Default for Small<N> {
    fn default() -> Self {
        Small {
            buf: [0; N],
            len: 0,
        }
    }
}

impl<const N: usize> Small<N> {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl<const N: usize> Out for Small<N> {
    fn put(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    fn byte(&mut self, b: u8) {
        self.buf[self.len] = b;
        self.len += 1;
    }
}

pub(super) fn varint(out: &mut Vec<u8>, v: u64) {
    Out::varint(out, v);
}

pub(super) fn key(out: &mut Vec<u8>, field: u32, wire: u32) {
    Out::key(out, field, wire);
}

pub(super) fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    Out::bytes(out, field, b);
}

#[cfg(test)]
mod tests {
    use super::*;
    use perfetto_protos::trace::Trace;

    #[test]
    fn a_hand_encoded_packet_decodes_as_perfetto_protos_reads_it() {
        let mut interned = InternedData::new();
        let mut name = perfetto_protos::track_event::EventName::new();
        name.set_iid(3);
        name.set_name("token".into());
        interned.event_names.push(name);
        let mut a = DebugAnnotation::new();
        a.set_name_iid(2);
        a.set_int_value(-7);
        let annotations = [a];
        let mut packets = Packets::default();
        let mut decode = |e: &TrackEvent| {
            let mut written = Vec::new();
            packets.write_track_event(&mut written, e).expect("encoded");
            let mut through_vectors = Vec::new();
            bytes(
                &mut through_vectors,
                1,
                packets.track_event(e).expect("encoded"),
            );
            assert_eq!(written, through_vectors, "the same bytes either way");
            let trace = Trace::parse_from_bytes(&written).expect("decodes");
            assert_eq!(trace.packet.len(), 1, "one packet");
            trace.packet[0].clone()
        };
        let p = decode(&TrackEvent {
            delta_ns: 1 << 40,
            sequence: 9,
            kind: Type::TYPE_INSTANT,
            track_uuid: 300,
            named: Some((3, 5)),
            counter: None,
            flow: Some((u64::MAX, true)),
            annotations: &annotations,
            interned: Some(&interned),
        });
        let e = p.track_event();
        assert_eq!(
            (
                p.timestamp(),
                p.trusted_packet_sequence_id(),
                p.sequence_flags()
            ),
            (
                1 << 40,
                9,
                SequenceFlags::SEQ_NEEDS_INCREMENTAL_STATE as u32
            )
        );
        assert_eq!(
            (
                e.type_(),
                e.track_uuid(),
                e.name_iid(),
                e.category_iids.clone()
            ),
            (Type::TYPE_INSTANT, 300, 3, vec![5])
        );
        assert_eq!(
            (e.flow_ids_old.clone(), e.terminating_flow_ids_old.clone()),
            (vec![], vec![u64::MAX])
        );
        assert_eq!(e.debug_annotations.as_slice(), &annotations);
        assert_eq!(p.interned_data.as_ref(), Some(&interned));

        let p = decode(&TrackEvent {
            delta_ns: 0,
            sequence: 1,
            kind: Type::TYPE_COUNTER,
            track_uuid: 1,
            named: None,
            counter: Some(2.5),
            flow: Some((42, false)),
            annotations: &[],
            interned: None,
        });
        let e = p.track_event();
        assert!(
            p.has_timestamp() && p.timestamp() == 0,
            "a zero delta is written"
        );
        assert_eq!(
            (e.type_(), e.double_counter_value(), e.has_name_iid()),
            (Type::TYPE_COUNTER, 2.5, false)
        );
        assert_eq!(e.flow_ids_old, vec![42]);
        assert!(p.interned_data.is_none() && e.category_iids.is_empty());

        // Every field at its widest: the stack arrays hold it.
        let p = decode(&TrackEvent {
            delta_ns: u64::MAX,
            sequence: u32::MAX,
            kind: Type::TYPE_COUNTER,
            track_uuid: u64::MAX,
            named: Some((u64::MAX, u64::MAX)),
            counter: Some(f64::MIN),
            flow: Some((u64::MAX, false)),
            annotations: &[],
            interned: None,
        });
        let e = p.track_event();
        assert_eq!(
            (
                p.timestamp(),
                e.track_uuid(),
                e.name_iid(),
                e.flow_ids_old.clone()
            ),
            (u64::MAX, u64::MAX, u64::MAX, vec![u64::MAX])
        );
        let mut counter = |v: f64| {
            let p = decode(&TrackEvent {
                delta_ns: 0,
                sequence: 1,
                kind: Type::TYPE_COUNTER,
                track_uuid: 1,
                named: None,
                counter: Some(v),
                flow: None,
                annotations: &[],
                interned: None,
            });
            let e = p.track_event();
            let int = e.has_counter_value().then(|| e.counter_value());
            let double = e
                .has_double_counter_value()
                .then(|| e.double_counter_value());
            (int, double)
        };
        assert_eq!(counter(3.0), (Some(3), None), "a count is a varint");
        assert_eq!(counter(0.0), (Some(0), None));
        for v in [-1.0, 0.5, MAX_EXACT, f64::NAN] {
            let (int, double) = counter(v);
            assert!(
                int.is_none() && double.is_some_and(|d| d.to_bits() == v.to_bits()),
                "{v} stays a double"
            );
        }
    }
}
