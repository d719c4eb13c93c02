"""Decodes a tokenscope Perfetto trace with Google's own bindings (PyPI `perfetto`),
each bundle of compressed_packets inflated and read in its place as trace processor
reads it, and checks what Perfetto needs of it: non-zero sequence ids, each sequence's first
packet clears incremental state, packets timed on MONOTONIC or on the sequence's
incremental clock (each timestamp the distance from the sequence's previous one on
that clock, the first from a snapshot that ties it to MONOTONIC; such packets need
the sequence's state), a track described again only as it was, interned ids defined
once and before use, timestamps never going back per sequence (or per track),
begin/end balanced and nested per track, every flow started and ended (flow ids
followed as trace processor follows them: an id is free again once its flow ends)
and passing each track once; and the diagnoses: a slice per diagnosis on a row of
the top-level "tokenscope diagnoses" track, named after its row, with its finding,
scope, fix and cited request ids, each cited request's track holding an instant that
cites it. Prints the counts it saw as JSON (and the sum of the token instants'
times, mod 2^64); exits 1 with the first broken invariant.

usage: perfetto_check.py TRACE
"""

import json
import re
import sys
import zlib

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

MONOTONIC = 3
INCREMENTAL = 64  # collector::export::perfetto::INCREMENTAL_CLOCK
CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS_STATE = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
TE = pb.TrackEvent
DIAGNOSES_TRACK = "tokenscope diagnoses"  # collector::export::perfetto::DIAGNOSES_TRACK
DIAGNOSIS_NAME = re.compile(r"^(\[(\d+)\] [^:]+): (saves ~.+|saving not estimated)$")


def fail(msg):
    print(f"perfetto_check: {msg}", file=sys.stderr)
    sys.exit(1)


def expand(packets):
    """The packets as trace processor reads them: a packet with compressed_packets (a
    zlib-deflated Trace) is replaced by the packets it holds, in its place."""
    out = []
    for i, p in enumerate(packets):
        if not p.HasField("compressed_packets"):
            out.append(p)
            continue
        if p.ListFields() != [(pb.TracePacket.DESCRIPTOR.fields_by_name["compressed_packets"],
                               p.compressed_packets)]:
            fail(f"packet {i}: a bundle with other fields (trace processor reads none of them)")
        inner = pb.Trace()
        try:
            inner.ParseFromString(zlib.decompress(p.compressed_packets))
        except zlib.error as e:
            fail(f"packet {i}: the bundle does not inflate: {e}")
        if any(q.HasField("compressed_packets") for q in inner.packet):
            fail(f"packet {i}: a bundle inside a bundle")
        out.extend(inner.packet)
    return out


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    bundles = sum(1 for p in trace.packet if p.HasField("compressed_packets"))
    packets = expand(trace.packet)
    if not packets:
        fail("no packets")
    default_clock = {}  # per sequence, from its TracePacketDefaults
    incremental = {}  # per sequence: [the incremental clock's value, its offset to MONOTONIC]

    names, cats, arg_names = {}, {}, {}
    last_ts, track_ts = {}, {}
    tracks, parents, counter_tracks = {}, {}, set()
    diagnoses, cites = [], {}
    open_slices = {}
    flow_events = []  # (time, packet, track, flow id, whether it ends there)
    token_ns_sum = 0
    counts = dict(request_tracks=0, token_instants=0, gpu_steps=0, flows=0,
                  kernels=0, counter_tracks=0, diagnoses=0, diagnosis_cites=0,
                  packets=len(packets), bundles=bundles)
    for i, p in enumerate(packets):
        seq = p.trusted_packet_sequence_id
        if seq == 0:
            fail(f"packet {i} has no trusted_packet_sequence_id")
        if seq not in default_clock and not p.sequence_flags & CLEARED:
            fail(f"the first packet of sequence {seq} does not clear incremental state")
        if i == 0 and not (p.HasField("clock_snapshot")
                           and p.clock_snapshot.primary_trace_clock == MONOTONIC):
            fail("the first packet does not make MONOTONIC the trace clock")
        if p.sequence_flags & CLEARED:
            default_clock[seq] = None
            incremental.pop(seq, None)
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            default_clock[seq] = d.timestamp_clock_id if d.HasField("timestamp_clock_id") else None
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            if INCREMENTAL in clocks:
                if not clocks[INCREMENTAL].is_incremental:
                    fail(f"packet {i}: clock {INCREMENTAL} is not incremental")
                if MONOTONIC not in clocks:
                    fail(f"packet {i}: the snapshot does not say where MONOTONIC is")
                at = clocks[INCREMENTAL].timestamp
                incremental[seq] = [at, clocks[MONOTONIC].timestamp - at]
        ts = None  # the packet's time on MONOTONIC
        if p.HasField("timestamp"):
            clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else default_clock[seq]
            if clock == MONOTONIC:
                ts = p.timestamp
            elif clock == INCREMENTAL:
                if seq not in incremental:
                    fail(f"packet {i} uses the incremental clock before a snapshot declares it")
                if not p.sequence_flags & NEEDS_STATE:
                    fail(f"packet {i} uses the incremental clock without SEQ_NEEDS_INCREMENTAL_STATE")
                incremental[seq][0] += p.timestamp
                ts = sum(incremental[seq])
            else:
                fail(f"packet {i} is timed on clock {clock}, not MONOTONIC (3) or the incremental clock")
            if ts < last_ts.get(seq, 0):
                fail(f"packet {i}: time goes back on sequence {seq}")
            last_ts[seq] = ts
        if p.HasField("interned_data"):
            for n in p.interned_data.event_names:
                if (seq, n.iid) in names:
                    fail(f"packet {i}: event name iid {n.iid} defined twice")
                names[(seq, n.iid)] = n.name
            for n in p.interned_data.event_categories:
                if (seq, n.iid) in cats:
                    fail(f"packet {i}: category iid {n.iid} defined twice")
                cats[(seq, n.iid)] = n.name
            for n in p.interned_data.debug_annotation_names:
                if (seq, n.iid) in arg_names:
                    fail(f"packet {i}: argument name iid {n.iid} defined twice")
                arg_names[(seq, n.iid)] = n.name
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("parent_uuid") and d.parent_uuid not in tracks:
                fail(f"track {d.uuid} is described before its parent")
            name = d.process.process_name if d.HasField("process") else d.name
            parent = d.parent_uuid if d.HasField("parent_uuid") else None
            if d.uuid in tracks:
                # Each window (packet sequence) describes the tracks it uses again.
                if (tracks[d.uuid], parents[d.uuid]) != (name, parent) and not d.HasField("process"):
                    fail(f"track {d.uuid} described twice, differently")
                continue
            tracks[d.uuid] = name
            parents[d.uuid] = d.parent_uuid if d.HasField("parent_uuid") else None
            if d.HasField("counter"):
                counter_tracks.add(d.uuid)
                counts["counter_tracks"] += 1
            if name.startswith("request ") and not d.HasField("process"):
                counts["request_tracks"] += 1
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        if ts is None:
            fail(f"packet {i}: a track event without a timestamp")
        track = e.track_uuid
        if track not in tracks:
            fail(f"packet {i}: event on undescribed track {track}")
        if ts < track_ts.get(track, 0):
            fail(f"packet {i}: time goes back on track {tracks[track]!r}")
        track_ts[track] = ts
        name = e.name
        if e.HasField("name_iid"):
            if (seq, e.name_iid) not in names:
                fail(f"packet {i}: name iid {e.name_iid} used before it is defined")
            name = names[(seq, e.name_iid)]
        cat = ""
        for iid in e.category_iids:
            if (seq, iid) not in cats:
                fail(f"packet {i}: category iid {iid} used before it is defined")
            cat = cats[(seq, iid)]
        for a in e.debug_annotations:
            if a.HasField("name_iid") and (seq, a.name_iid) not in arg_names:
                fail(f"packet {i}: argument name iid {a.name_iid} used before it is defined")
        uses_iids = any(a.HasField("name_iid") for a in e.debug_annotations)
        if (e.HasField("name_iid") or e.category_iids or uses_iids) and not p.sequence_flags & NEEDS_STATE:
            fail(f"packet {i} uses interned data without SEQ_NEEDS_INCREMENTAL_STATE")
        stack = open_slices.setdefault(track, [])
        if e.type == TE.TYPE_SLICE_BEGIN:
            stack.append(ts)
            parent = parents.get(track)
            if parent is not None and tracks[parent] == DIAGNOSES_TRACK and parents[parent] is None:
                diagnoses.append(dict(track=track, name=name, begin=ts,
                                      args=annotations(e, arg_names, seq)))
            counts["gpu_steps"] += cat == "gpu"
            counts["kernels"] += cat == "kernel"
        elif e.type == TE.TYPE_SLICE_END:
            if not stack:
                fail(f"packet {i}: end without a begin on track {tracks[track]!r}")
            if ts < stack.pop():
                fail(f"packet {i}: a slice ends before it begins")
        elif e.type == TE.TYPE_INSTANT:
            if name == "token":
                counts["token_instants"] += 1
                token_ns_sum += ts
            if name.startswith("cited by ") and tracks[track].startswith("request "):
                request_id = int(tracks[track].split()[1])
                cites.setdefault(request_id, []).append(name)
        elif e.type == TE.TYPE_COUNTER:
            if track not in counter_tracks:
                fail(f"packet {i}: a counter value on a slice track")
            if e.HasField("counter_value") == e.HasField("double_counter_value"):
                fail(f"packet {i}: a counter event without one value")
        else:
            fail(f"packet {i}: track event without a type")
        # The exporter writes the varint twins (flow_ids_old, terminating_flow_ids_old):
        # trace processor reads both forms as one flow id space.
        for f in list(e.flow_ids) + list(e.flow_ids_old):
            flow_events.append((ts, i, track, f, False))
        for f in list(e.terminating_flow_ids) + list(e.terminating_flow_ids_old):
            flow_events.append((ts, i, track, f, True))
    for track, stack in open_slices.items():
        if stack:
            fail(f"track {tracks[track]!r}: {len(stack)} slices never end")
    counts["flows"] = follow_flows(flow_events)
    # The token instants' times on MONOTONIC, summed (mod 2^64): the recorded ones'.
    counts["token_ns_sum"] = token_ns_sum % (1 << 64)
    check_diagnoses(diagnoses, cites, tracks)
    counts["diagnoses"] = len(diagnoses)
    counts["diagnosis_cites"] = sum(len(v) for v in cites.values())
    print(json.dumps(counts))


def follow_flows(events):
    """Follows the flows as trace processor does (TrackEventEventImporter::
    MaybeParseTrackEventFlows over packets sorted by time, ties in file order): an id
    not in flight begins a flow, one in flight steps it, a terminating id ends it and
    frees the id for a later flow. Each flow must end, and pass each track once (two
    flows in flight on one id would merge into one that does not). Returns how many
    flows there are."""
    in_flight = {}  # flow id -> the tracks its flow has passed
    n = 0
    for _, i, track, f, ends in sorted(events, key=lambda e: (e[0], e[1])):
        if f not in in_flight:
            if ends:
                fail(f"packet {i}: flow {f} ends without a start")
            in_flight[f] = set()
            n += 1
        if track in in_flight[f]:
            fail(f"packet {i}: flow {f} passes a track twice")
        in_flight[f].add(track)
        if ends:
            del in_flight[f]
    for f in in_flight:
        fail(f"flow {f} starts but never ends")
    return n


def annotations(e, arg_names, seq):
    """A track event's debug annotations: name (interned or not) -> value (a list for
    arrays)."""
    def value(a):
        if a.array_values:
            return [value(v) for v in a.array_values]
        if a.HasField("string_value"):
            return a.string_value
        return a.int_value
    def name(a):
        return arg_names[(seq, a.name_iid)] if a.HasField("name_iid") else a.name
    return {name(a): value(a) for a in e.debug_annotations}


def check_diagnoses(diagnoses, cites, tracks):
    rows = set()
    for d in diagnoses:
        m = DIAGNOSIS_NAME.match(d["name"])
        if not m:
            fail(f"diagnosis slice {d['name']!r} is not '[rule] fix: saves ...'")
        label = m.group(1)
        if tracks[d["track"]] != label:
            fail(f"diagnosis {label!r} is on the row {tracks[d['track']]!r}")
        if d["track"] in rows:
            fail(f"two diagnoses on the row {label!r}")
        rows.add(d["track"])
        a = d["args"]
        if a.get("rule") != int(m.group(2)):
            fail(f"diagnosis {label!r}: rule argument {a.get('rule')!r}")
        for key in ("finding", "scope", "fix", "request_ids"):
            if key not in a:
                fail(f"diagnosis {label!r} has no {key!r} annotation")
        if not a["finding"] or not a["fix"]:
            fail(f"diagnosis {label!r}: empty finding or fix")
        for request_id in a["request_ids"]:
            if not any(label in c for c in cites.get(request_id, [])):
                fail(f"request {request_id} is cited by {label!r} but its track does not say so")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: perfetto_check.py TRACE")
    main(sys.argv[1])
