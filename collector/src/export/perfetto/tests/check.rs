//! The trace checker the tests share: a decoded trace (perfetto_protos' Trace) put on
//! MONOTONIC (the incremental clock rebuilt) and checked for what Perfetto needs,
//! counting what it shows.

use std::collections::{BTreeSet, HashMap};

use perfetto_protos::trace::Trace;
use perfetto_protos::trace_packet::trace_packet::SequenceFlags;
use perfetto_protos::track_event::track_event::Type;

use super::super::*;

/// What a trace shows, counted while checking it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) request_tracks: usize,
    pub(super) token_instants: usize,
    pub(super) gpu_steps: usize,
    pub(super) device_steps: usize,
    pub(super) flows: usize,
    pub(super) kernels: usize,
    pub(super) counter_tracks: usize,
    pub(super) diagnoses: usize,
}

/// The trace with every timestamp on MONOTONIC, as Perfetto reads it: a packet is timed
/// on its own clock, else its sequence's default (`TracePacketDefaults`, reset with the
/// sequence's incremental state); on the incremental clock its timestamp is the distance
/// from the sequence's previous packet on that clock, the first one's from the value in
/// the snapshot that declared it, which must also say where MONOTONIC was then.
pub(super) fn on_monotonic(trace: &Trace) -> Result<Trace, String> {
    /// A sequence's state: its default clock, and the incremental clock's value and
    /// offset to MONOTONIC once a snapshot declared it.
    #[derive(Default)]
    struct Seq {
        default_clock: Option<u32>,
        incremental: Option<(u64, i128)>,
    }
    let mut seqs: HashMap<u32, Seq> = HashMap::new();
    let mut out = trace.clone();
    for (i, p) in out.packet.iter_mut().enumerate() {
        let id = p.trusted_packet_sequence_id();
        if id == 0 {
            return Err(format!("packet {i} has no sequence id"));
        }
        let cleared = p.sequence_flags() & SequenceFlags::SEQ_INCREMENTAL_STATE_CLEARED as u32 != 0;
        if !seqs.contains_key(&id) && !cleared {
            return Err(format!(
                "the first packet of sequence {id} does not clear incremental state"
            ));
        }
        let seq = seqs.entry(id).or_default();
        if cleared {
            *seq = Seq::default();
        }
        if let Some(d) = p.trace_packet_defaults.as_ref() {
            seq.default_clock = d.has_timestamp_clock_id().then(|| d.timestamp_clock_id());
        }
        if p.has_clock_snapshot() {
            let snap = p.clock_snapshot();
            let at = |id: u32| snap.clocks.iter().find(|c| c.clock_id() == id);
            if let Some(c) = at(INCREMENTAL_CLOCK) {
                if !c.is_incremental() {
                    return Err(format!(
                        "packet {i}: clock {INCREMENTAL_CLOCK} is not incremental"
                    ));
                }
                let mono = at(CLOCK_MONOTONIC).ok_or(format!(
                    "packet {i}: the snapshot does not say where MONOTONIC is"
                ))?;
                let offset = i128::from(mono.timestamp()) - i128::from(c.timestamp());
                seq.incremental = Some((c.timestamp(), offset));
            }
        }
        if !p.has_timestamp() {
            continue;
        }
        let clock = if p.has_timestamp_clock_id() {
            Some(p.timestamp_clock_id())
        } else {
            seq.default_clock
        };
        let ts = match clock {
            Some(CLOCK_MONOTONIC) => p.timestamp(),
            Some(INCREMENTAL_CLOCK) => {
                if p.sequence_flags() & SequenceFlags::SEQ_NEEDS_INCREMENTAL_STATE as u32 == 0 {
                    return Err(format!(
                        "packet {i} uses the incremental clock without SEQ_NEEDS_INCREMENTAL_STATE"
                    ));
                }
                let (value, offset) = seq.incremental.as_mut().ok_or(format!(
                    "packet {i} uses the incremental clock before a snapshot declares it"
                ))?;
                *value = value
                    .checked_add(p.timestamp())
                    .ok_or("the clock overflows")?;
                u64::try_from(i128::from(*value) + *offset)
                    .map_err(|_| format!("packet {i} is before MONOTONIC's zero"))?
            }
            other => {
                return Err(format!(
                    "packet {i} is timed on clock {other:?}, not MONOTONIC or the incremental clock"
                ))
            }
        };
        p.set_timestamp(ts);
        p.set_timestamp_clock_id(CLOCK_MONOTONIC);
    }
    Ok(out)
}

/// A counter event's value, an integer (`counter_value`) or not.
pub(super) fn counter_value(e: &perfetto_protos::track_event::TrackEvent) -> f64 {
    if e.has_counter_value() {
        e.counter_value() as f64
    } else {
        e.double_counter_value()
    }
}

/// Checks every invariant; the first broken one is the error.
pub(super) fn check(trace: &Trace) -> Result<Counts, String> {
    let first = trace.packet.first().ok_or("no packets")?;
    let primary = first
        .has_clock_snapshot()
        .then(|| first.clock_snapshot().primary_trace_clock())
        .map(|c| c as u32);
    // The trace's first window chooses the trace clock (a later one, checked alone, has no say).
    let whole = first.trusted_packet_sequence_id() == SEQUENCE_ID;
    if whole && primary != Some(CLOCK_MONOTONIC) {
        return Err(format!(
            "the first packet makes {primary:?} the trace clock, not MONOTONIC"
        ));
    }
    let trace = &on_monotonic(trace)?;
    let mut c = Counts::default();
    let mut names: HashMap<(u32, u64), String> = HashMap::new();
    let mut cats: HashMap<(u32, u64), String> = HashMap::new();
    let mut arg_names: HashMap<(u32, u64), String> = HashMap::new();
    let mut last_ts: HashMap<u32, u64> = HashMap::new();
    let mut tracks: HashMap<u64, String> = HashMap::new();
    let mut counter_tracks: BTreeSet<u64> = BTreeSet::new();
    let mut open: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut track_ts: HashMap<u64, u64> = HashMap::new();
    for (i, p) in trace.packet.iter().enumerate() {
        let seq = p.trusted_packet_sequence_id();
        if p.has_timestamp() {
            let prev = last_ts.insert(seq, p.timestamp()).unwrap_or(0);
            if p.timestamp() < prev {
                return Err(format!(
                    "packet {i}: time goes back on sequence {seq}: {} < {prev}",
                    p.timestamp()
                ));
            }
        }
        if let Some(d) = p.interned_data.as_ref() {
            for n in &d.event_names {
                if names.insert((seq, n.iid()), n.name().into()).is_some() {
                    return Err(format!(
                        "packet {i}: event name iid {} defined twice",
                        n.iid()
                    ));
                }
            }
            for n in &d.event_categories {
                if cats.insert((seq, n.iid()), n.name().into()).is_some() {
                    return Err(format!(
                        "packet {i}: category iid {} defined twice",
                        n.iid()
                    ));
                }
            }
            for n in &d.debug_annotation_names {
                if arg_names.insert((seq, n.iid()), n.name().into()).is_some() {
                    return Err(format!(
                        "packet {i}: argument name iid {} defined twice",
                        n.iid()
                    ));
                }
            }
        }
        if p.has_track_descriptor() {
            let d = p.track_descriptor();
            let name = d
                .process
                .as_ref()
                .map_or(d.name().to_string(), |pd| pd.process_name().to_string());
            if d.has_parent_uuid() && !tracks.contains_key(&d.parent_uuid()) {
                return Err(format!("track {} comes before its parent", d.uuid()));
            }
            if tracks.insert(d.uuid(), name.clone()).is_some() {
                return Err(format!("track uuid {} described twice", d.uuid()));
            }
            if d.counter.is_some() {
                counter_tracks.insert(d.uuid());
                c.counter_tracks += 1;
            }
            if name.starts_with("request ") && d.process.is_none() {
                c.request_tracks += 1;
            }
        }
        if !p.has_track_event() {
            continue;
        }
        let e = p.track_event();
        let track = e.track_uuid();
        if !tracks.contains_key(&track) {
            return Err(format!("packet {i}: event on undescribed track {track}"));
        }
        let prev = track_ts.insert(track, p.timestamp()).unwrap_or(0);
        if p.timestamp() < prev {
            return Err(format!("packet {i}: time goes back on track {track}"));
        }
        let name = if e.has_name_iid() {
            names.get(&(seq, e.name_iid())).cloned().ok_or(format!(
                "packet {i}: name iid {} used before it is defined",
                e.name_iid()
            ))?
        } else {
            e.name().to_string()
        };
        let mut cat = String::new();
        for iid in &e.category_iids {
            cat = cats.get(&(seq, *iid)).cloned().ok_or(format!(
                "packet {i}: category iid {iid} used before it is defined"
            ))?;
        }
        for a in &e.debug_annotations {
            if a.has_name_iid() && !arg_names.contains_key(&(seq, a.name_iid())) {
                return Err(format!(
                    "packet {i}: argument name iid {} used before it is defined",
                    a.name_iid()
                ));
            }
        }
        let uses_state = e.has_name_iid()
            || !e.category_iids.is_empty()
            || e.debug_annotations.iter().any(|a| a.has_name_iid());
        if uses_state && p.sequence_flags() & SequenceFlags::SEQ_NEEDS_INCREMENTAL_STATE as u32 == 0
        {
            return Err(format!(
                "packet {i} uses interned data without SEQ_NEEDS_INCREMENTAL_STATE"
            ));
        }
        let stack = open.entry(track).or_default();
        match e.type_() {
            Type::TYPE_SLICE_BEGIN => {
                stack.push(p.timestamp());
                if cat == "gpu" {
                    c.gpu_steps += 1;
                }
                if cat == "kernel" {
                    c.kernels += 1;
                }
                if cat == "gpu_device" {
                    c.device_steps += 1;
                }
                if cat == "diagnosis" {
                    c.diagnoses += 1;
                }
            }
            Type::TYPE_SLICE_END => {
                let begin = stack
                    .pop()
                    .ok_or(format!("packet {i}: end without a begin on track {track}"))?;
                if p.timestamp() < begin {
                    return Err(format!("packet {i}: slice ends before it begins"));
                }
            }
            Type::TYPE_INSTANT => {
                if name == "token" {
                    c.token_instants += 1;
                }
            }
            Type::TYPE_COUNTER => {
                if !counter_tracks.contains(&track) {
                    return Err(format!("packet {i}: counter value on a slice track"));
                }
                if e.has_counter_value() == e.has_double_counter_value() {
                    return Err(format!("packet {i}: a counter event without one value"));
                }
            }
            Type::TYPE_UNSPECIFIED => return Err(format!("packet {i}: event without a type")),
        }
    }
    for (track, stack) in &open {
        if !stack.is_empty() {
            return Err(format!("track {track}: {} slices never end", stack.len()));
        }
    }
    c.flows = flows(trace)?;
    Ok(c)
}

/// The flows of a trace of several sequences (windows), checked as `check` checks
/// one's: how many there are.
pub(super) fn flows_across(trace: &Trace) -> Result<usize, String> {
    flows(&on_monotonic(trace)?)
}

/// Follows the flows of a trace on MONOTONIC as trace processor does (TrackEventEventImporter::
/// MaybeParseTrackEventFlows over packets sorted by time, ties in file order): an id
/// not in flight begins a flow, one in flight steps it, a terminating id ends it and
/// frees the id for a later flow. Each flow must end, and pass each track once (two
/// flows in flight on one id would merge into one that does not); returns how many
/// there are.
fn flows(trace: &Trace) -> Result<usize, String> {
    // (time, packet, track, flow id, whether it ends there)
    let mut events: Vec<(u64, usize, u64, u64, bool)> = Vec::new();
    for (i, p) in trace.packet.iter().enumerate() {
        let e = p.track_event();
        let (ts, track) = (p.timestamp(), e.track_uuid());
        for id in e.flow_ids.iter().chain(&e.flow_ids_old) {
            events.push((ts, i, track, *id, false));
        }
        let ending = e.terminating_flow_ids.iter();
        for id in ending.chain(&e.terminating_flow_ids_old) {
            events.push((ts, i, track, *id, true));
        }
    }
    events.sort_unstable_by_key(|&(ts, i, ..)| (ts, i));
    let mut in_flight: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut n = 0;
    for (_, i, track, id, ends) in events {
        let passed = match in_flight.get_mut(&id) {
            Some(tracks) => tracks,
            None if ends => return Err(format!("packet {i}: flow {id} ends without a start")),
            None => {
                n += 1;
                in_flight.entry(id).or_default()
            }
        };
        if passed.contains(&track) {
            return Err(format!("packet {i}: flow {id} passes track {track} twice"));
        }
        passed.push(track);
        if ends {
            in_flight.remove(&id);
        }
    }
    if let Some(id) = in_flight.keys().next() {
        return Err(format!("flow {id} starts but never ends"));
    }
    Ok(n)
}
