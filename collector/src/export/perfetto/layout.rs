//! One window of the pipeline's output -> tracks and time-ordered events (not yet
//! encoded).
//! Slices are nested per track here: a slice that would straddle its parent's
//! end is cut at that end (its real length stays in its arguments), so begin/end
//! always balance and nest whatever the data looks like.

use std::collections::{BTreeMap, HashMap};

mod connections;
mod counters;
mod diagnoses;
mod flows;
mod gpu;
mod halves;
mod requests;
mod trace;

pub(crate) use counters::Running;
pub(crate) use diagnoses::Cites;
use flows::FlowIds;
pub(crate) use trace::{Conn, Trace};

/// Interned categories, by index (iid = index + 1).
pub(crate) const CATEGORIES: [&str; 9] = [
    "request",
    "stage",
    "token",
    "connection",
    "gpu",
    "kernel",
    "nvtx",
    "diagnosis",
    "gpu_device",
];
#[derive(Clone, Copy)]
#[repr(u8)]
pub(crate) enum Cat {
    Request = 0,
    Stage = 1,
    Token = 2,
    Connection = 3,
    Gpu = 4,
    Kernel = 5,
    Nvtx = 6,
    Diagnosis = 7,
    /// A GPU-timed step in device time, beside its stream's kernels.
    DeviceStep = 8,
}

/// Tokens/s counters count tokens in windows of this width.
const RATE_WINDOW_NS: u64 = 1_000_000_000;

pub(crate) enum TrackKind {
    Process {
        pid: u32,
    },
    Plain,
    /// `unit`: a unit name, or a plain count.
    Counter {
        unit: Option<&'static str>,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildOrder {
    Default,
    /// By first event (requests under their process).
    Chronological,
    /// By `rank` (observation points: client first).
    Explicit,
}

pub(crate) struct Track {
    /// See `Uuids`.
    pub(crate) uuid: u64,
    /// The parent's uuid.
    pub(crate) parent: Option<u64>,
    pub(crate) name: String,
    pub(crate) kind: TrackKind,
    pub(crate) children: ChildOrder,
    pub(crate) rank: Option<i32>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum OpKind {
    Begin,
    End,
    Instant,
    Counter(f64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    None,
    /// The flow starts or passes here.
    Step(u64),
    /// The flow ends here.
    Last(u64),
}

/// One event, packed (32 bytes): a long recording holds millions until they are
/// sorted by time and written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) ts: u64,
    /// The flow id, or a counter's value (f64 bits).
    aux: u64,
    track: u32,
    pub(crate) name: u32,
    /// 0: none, else index + 1 into `Plan::args`.
    pub(crate) args: u32,
    /// Kind in bits 0-1, flow in bits 2-3.
    tag: u8,
    pub(crate) cat: u8,
}

const _: () = assert!(std::mem::size_of::<Op>() == 32);

impl Op {
    fn new(ts: u64, track: u64, kind: OpKind, name: u32, cat: u8, flow: Flow, args: u32) -> Op {
        let (k, aux) = match kind {
            OpKind::Begin => (0, 0),
            OpKind::End => (1, 0),
            OpKind::Instant => (2, 0),
            OpKind::Counter(v) => (3, v.to_bits()),
        };
        let (f, aux) = match flow {
            Flow::None => (0, aux),
            Flow::Step(id) => (1, id),
            Flow::Last(id) => (2, id),
        };
        Op {
            ts,
            aux,
            track: u32::try_from(track).expect("fewer than 2^32 tracks"),
            name,
            args,
            tag: k | (f << 2),
            cat,
        }
    }

    pub(crate) fn track(&self) -> u64 {
        u64::from(self.track)
    }

    pub(crate) fn kind(&self) -> OpKind {
        match self.tag & 3 {
            0 => OpKind::Begin,
            1 => OpKind::End,
            2 => OpKind::Instant,
            _ => OpKind::Counter(f64::from_bits(self.aux)),
        }
    }

    /// The flow id, if the op is on a flow.
    fn flow_id(&self) -> Option<u64> {
        (self.tag >> 2 != 0).then_some(self.aux)
    }

    pub(crate) fn flow(&self) -> Flow {
        match self.tag >> 2 {
            1 => Flow::Step(self.aux),
            2 => Flow::Last(self.aux),
            _ => Flow::None,
        }
    }
}

pub(crate) enum Arg {
    Int(i64),
    Str(String),
    /// An array annotation (`name[0]`, `name[1]` in the trace processor's args).
    Ints(Vec<i64>),
    Strs(Vec<String>),
}

pub(crate) struct Plan {
    /// The earliest of the recording's start and its first event (CLOCK_MONOTONIC).
    pub(crate) start_ns: u64,
    /// The recording's start on CLOCK_MONOTONIC and CLOCK_REALTIME (0: unknown).
    pub(crate) start_monotonic_ns: u64,
    pub(crate) start_realtime_ns: u64,
    pub(crate) tracks: Vec<Track>,
    /// Every event, ordered by time (per track in begin/end order).
    pub(crate) ops: Vec<Op>,
    pub(crate) names: Vec<String>,
    pub(crate) args: Vec<Vec<(&'static str, Arg)>>,
    pub(crate) request_tracks: usize,
    pub(crate) token_instants: usize,
    pub(crate) gpu_steps: usize,
    pub(crate) flows: usize,
    pub(crate) diagnoses: usize,
}

/// A slice (or an instant when `end` is None) before nesting.
struct Item {
    start: u64,
    end: Option<u64>,
    name: u32,
    cat: Cat,
    flow: Flow,
    args: u32,
    /// Breaks ties between slices with the same start and end: 0 outermost.
    depth: u8,
}

struct Builder {
    plan: Plan,
    uuids: Uuids,
    /// Flow ids handed out in this window (1, 2, ...), renumbered for the wire by
    /// `number_flows`.
    flows_handed: u64,
    name_ids: HashMap<String, u32>,
    /// The name `name` gave last.
    last_name: u32,
    processes: BTreeMap<u32, u64>,
}

/// The plan of one window (all of what `trace` holds), its tracks numbered by the
/// export's `uuids`.
pub(crate) fn plan(trace: &Trace, uuids: &mut Uuids) -> Plan {
    /// Fewer requests are laid out on one thread: not worth a second.
    const ALONE: usize = 256;
    plan_split(trace, uuids, ALONE)
}

/// `plan`, its requests laid out in two halves at once where there are `alone` or more.
pub(crate) fn plan_split(trace: &Trace, uuids: &mut Uuids, alone: usize) -> Plan {
    let mut b = Builder::new(trace.start_ns);
    b.uuids = std::mem::take(uuids);
    b.plan.start_monotonic_ns = trace.start_monotonic_ns;
    b.plan.start_realtime_ns = trace.start_realtime_ns;
    b.diagnoses(&trace.diagnoses);
    if trace.requests.len() < alone.max(2) {
        b.requests(&trace.requests, &trace.cites);
    } else {
        b.requests_in_two(&trace.requests, &trace.cites);
    }
    b.connections(&trace.connections);
    b.gpu_steps(&trace.steps);
    b.cupti(&trace.cupti);
    b.nvml(&trace.nvml);
    b.derived_counters(&trace.counters);
    sort_by_time(&mut b.plan.ops);
    b.number_flows();
    *uuids = b.uuids;
    b.plan
}

/// Orders ops by time, keeping their order among equal times (each track's events
/// were pushed in begin/end order). Few ops: a stable sort. Many: a least significant
/// digit radix sort of their times (`radix`), where the stable comparison sort merged
/// its runs of ops ~18 times over and was ~600 instructions an op (18% of an export's
/// main thread). A window's worth (`HALVES` ops or more) is first dealt stably into
/// those before and those from a time near the middle, and each part sorted on a
/// thread of its own: the radix sort is memory-bound (17-20 ms for the bench
/// recording's window on one core, while the other idled). Scratch: as many ops again.
fn sort_by_time(ops: &mut Vec<Op>) {
    const SMALL: usize = 4096;
    const HALVES: usize = 1 << 16;
    if ops.len() <= SMALL {
        ops.sort_by_key(|op| op.ts);
        return;
    }
    let (min, max) = ops
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), op| (lo.min(op.ts), hi.max(op.ts)));
    if min == max {
        return;
    }
    if ops.len() < HALVES {
        let mut scratch = ops.clone();
        radix(ops, &mut scratch, min);
        return;
    }
    let middle = middle_time(ops, min, max);
    let mut dealt = Vec::with_capacity(ops.len());
    dealt.extend(ops.iter().filter(|op| op.ts < middle));
    let before = dealt.len();
    dealt.extend(ops.iter().filter(|op| op.ts >= middle));
    // `ops` is now the scratch of both parts.
    let sorted_later = std::thread::scope(|s| {
        let (early, late) = dealt.split_at_mut(before);
        let (early_scratch, late_scratch) = ops.split_at_mut(before);
        let other = std::thread::Builder::new()
            .name("tokenscope-sort".into())
            .spawn_scoped(s, move || radix(late, late_scratch, middle));
        radix(early, early_scratch, min);
        other.map(|t| {
            t.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    });
    if sorted_later.is_err() {
        // No thread to be had: sorted here.
        radix(&mut dealt[before..], &mut ops[before..], middle);
    }
    *ops = dealt;
}

/// A time with about half the ops before it (from a histogram of their times' top
/// 12 bits), above `min`.
fn middle_time(ops: &[Op], min: u64, max: u64) -> u64 {
    const BUCKETS: usize = 4096;
    let bits = 64 - (max - min).leading_zeros();
    let shift = bits.saturating_sub(BUCKETS.ilog2());
    let mut counts = vec![0usize; BUCKETS];
    for op in ops {
        counts[((op.ts - min) >> shift) as usize] += 1;
    }
    let mut seen = 0;
    for (b, n) in counts.iter().enumerate() {
        seen += n;
        if seen * 2 >= ops.len() {
            // The next bucket's start: at least half the ops are before it. (Past the
            // last bucket, max + 1 at most: saturated, every op is before it.)
            return (b as u64 + 1)
                .checked_shl(shift)
                .filter(|&d| d >> shift == b as u64 + 1)
                .map_or(u64::MAX, |d| min.saturating_add(d));
        }
    }
    max
}

/// `ops` (every time at or above `min`) sorted by time, stably, by an LSD radix sort:
/// a window's ops span about 2^36 ns, so three passes of 12-bit digits, each a
/// scatter between `ops` and `scratch` (as long); the result ends in `ops`.
fn radix(ops: &mut [Op], scratch: &mut [Op], min: u64) {
    const DIGIT_BITS: u32 = 11;
    let Some(max) = ops.iter().map(|op| op.ts).max() else {
        return;
    };
    let bits = 64 - (max - min).leading_zeros();
    if bits == 0 {
        return;
    }
    let passes = bits.div_ceil(DIGIT_BITS);
    let width = bits.div_ceil(passes);
    let buckets = 1usize << width;
    let mask = (buckets - 1) as u64;
    let digit = |ts: u64, pass: u32| ((ts - min) >> (pass * width) & mask) as usize;
    // Every pass's histogram in one read of the ops.
    let mut counts = vec![0usize; buckets * passes as usize];
    for op in ops.iter() {
        for pass in 0..passes {
            counts[pass as usize * buckets + digit(op.ts, pass)] += 1;
        }
    }
    let (mut from, mut to) = (ops, scratch);
    let mut swapped = false;
    for (pass, starts) in (0..passes).zip(counts.chunks_exact_mut(buckets)) {
        // A digit every op shares leaves the order as it is.
        if starts.contains(&from.len()) {
            continue;
        }
        let mut at = 0;
        for n in starts.iter_mut() {
            (*n, at) = (at, at + *n);
        }
        for op in from.iter() {
            let d = digit(op.ts, pass);
            to[starts[d]] = *op;
            starts[d] += 1;
        }
        std::mem::swap(&mut from, &mut to);
        swapped = !swapped;
    }
    if swapped {
        // The sorted ops are in the scratch: back where the caller holds them.
        to.copy_from_slice(from);
    }
}

impl Builder {
    fn new(start_ns: u64) -> Builder {
        Builder {
            plan: Plan {
                start_ns,
                start_monotonic_ns: 0,
                start_realtime_ns: 0,
                tracks: Vec::new(),
                ops: Vec::new(),
                names: Vec::new(),
                args: Vec::new(),
                request_tracks: 0,
                token_instants: 0,
                gpu_steps: 0,
                flows: 0,
                diagnoses: 0,
            },
            uuids: Uuids::default(),
            flows_handed: 0,
            name_ids: HashMap::new(),
            last_name: 0,
            processes: BTreeMap::new(),
        }
    }
}

/// FNV-1a, for track uuids that are the same in every window of an export.
fn fnv(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Track uuids of one export: small numbers, so that an event's track costs a varint
/// of a byte or two, not the nine or ten of a hash. A track that a later window
/// describes again (a GPU thread or stream, a counter) keeps its number, found by a
/// hash of its parent, kind and name: the map holds what the traced system has, not
/// what the recording's length brings. One that only one window describes (a request,
/// its points, a connection, a diagnosis row) takes the next number. Processes, which
/// carry no events but come and go with the clients, keep their hash, above 2^62
/// where no number reaches.
#[derive(Default)]
pub(crate) struct Uuids {
    last: u64,
    stable: HashMap<u64, u64>,
    flows: FlowIds,
}

const PROCESS_UUID: u64 = 1 << 62;

impl Uuids {
    fn next(&mut self) -> u64 {
        self.last += 1;
        assert!(self.last < PROCESS_UUID, "fewer than 2^62 tracks");
        self.last
    }

    fn stable(&mut self, hash: u64) -> u64 {
        if let Some(&u) = self.stable.get(&hash) {
            return u;
        }
        let u = self.next();
        self.stable.insert(hash, u);
        u
    }
}

impl Builder {
    /// A new track; returns its handle (index + 1) for `nest`, `counter` and child tracks.
    /// The same parent, kind and name in a later window is the same track (same uuid).
    fn track(&mut self, parent: Option<u64>, name: String, kind: TrackKind) -> u64 {
        let parent_uuid = parent.map(|h| self.plan.tracks[h as usize - 1].uuid);
        let tag: u64 = match kind {
            TrackKind::Process { pid } => 1 << 32 | u64::from(pid),
            TrackKind::Plain => 2 << 32,
            TrackKind::Counter { .. } => 3 << 32,
        };
        let mut hash = fnv(
            0xcbf2_9ce4_8422_2325,
            &parent_uuid.unwrap_or(0).to_le_bytes(),
        );
        hash = fnv(hash, &tag.to_le_bytes());
        let uuid = if let TrackKind::Process { .. } = kind {
            hash >> 2 | PROCESS_UUID
        } else {
            self.uuids.stable(fnv(hash, name.as_bytes()))
        };
        self.push_track(parent_uuid, name, kind, uuid)
    }

    /// A track only one window describes: the export's next uuid.
    fn track_once(&mut self, parent: Option<u64>, name: String, kind: TrackKind) -> u64 {
        let parent_uuid = parent.map(|h| self.plan.tracks[h as usize - 1].uuid);
        let uuid = self.uuids.next();
        self.push_track(parent_uuid, name, kind, uuid)
    }

    fn push_track(&mut self, parent: Option<u64>, name: String, kind: TrackKind, uuid: u64) -> u64 {
        self.plan.tracks.push(Track {
            uuid,
            parent,
            name,
            kind,
            children: ChildOrder::Default,
            rank: None,
        });
        self.plan.tracks.len() as u64
    }

    fn process(&mut self, pid: u32, comm: &str) -> Option<u64> {
        if pid == 0 {
            return None;
        }
        if let Some(&u) = self.processes.get(&pid) {
            return Some(u);
        }
        // Joined recordings: the same comm on two hosts, and a pid folded with its host.
        let name = match crate::ingest::hosts::split_pid(pid) {
            (0, _) => comm.to_string(),
            (host, own) => format!("{comm} {own} (host {host})"),
        };
        let u = self.track(None, name, TrackKind::Process { pid });
        self.plan.tracks[u as usize - 1].children = ChildOrder::Chronological;
        self.processes.insert(pid, u);
        Some(u)
    }

    fn name(&mut self, s: &str) -> u32 {
        // A point's tokens ask for one name in a run: no hashing for those.
        let last = self.last_name;
        if self.plan.names.get(last as usize).is_some_and(|n| n == s) {
            return last;
        }
        let i = match self.name_ids.get(s) {
            Some(&i) => i,
            None => {
                let i = self.plan.names.len() as u32;
                self.plan.names.push(s.to_string());
                self.name_ids.insert(s.to_string(), i);
                i
            }
        };
        self.last_name = i;
        i
    }

    fn args(&mut self, a: Vec<(&'static str, Arg)>) -> u32 {
        self.plan.args.push(a);
        self.plan.args.len() as u32
    }

    fn slice(&mut self, start: u64, end: u64, name: &str, cat: Cat, args: u32) -> Item {
        Item {
            start,
            end: Some(end.max(start)),
            name: self.name(name),
            cat,
            flow: Flow::None,
            args,
            depth: 1,
        }
    }

    fn instant(&mut self, ts: u64, name: &str, cat: Cat, flow: Flow) -> Item {
        Item {
            start: ts,
            end: None,
            name: self.name(name),
            cat,
            flow,
            args: 0,
            depth: 3,
        }
    }

    /// Emits one track's items as properly nested begin/end/instant events.
    fn nest(&mut self, track: u64, mut items: Vec<Item>) {
        // Outer slices first: earlier start, then later end, then shallower.
        items.sort_by_key(|i| {
            (
                i.start,
                std::cmp::Reverse(i.end.map_or(0, |e| e + 1)),
                i.depth,
            )
        });
        let mut open: Vec<u64> = Vec::new();
        let ops = &mut self.plan.ops;
        let end_op = |ts| Op::new(ts, track, OpKind::End, 0, 0, Flow::None, 0);
        for it in items {
            while let Some(&e) = open.last().filter(|&&e| e <= it.start) {
                open.pop();
                ops.push(end_op(e));
            }
            let kind = if it.end.is_some() {
                OpKind::Begin
            } else {
                OpKind::Instant
            };
            ops.push(Op::new(
                it.start,
                track,
                kind,
                it.name,
                it.cat as u8,
                it.flow,
                it.args,
            ));
            if let Some(end) = it.end {
                // Cut at the parent's end so that slices always nest.
                open.push(open.last().map_or(end, |&p| end.min(p)));
            }
        }
        while let Some(e) = open.pop() {
            ops.push(end_op(e));
        }
    }

    fn counter(&mut self, track: u64, ts: u64, value: f64) {
        let op = Op::new(ts, track, OpKind::Counter(value), 0, 0, Flow::None, 0);
        self.plan.ops.push(op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: &Builder) -> Vec<(u64, &'static str, String)> {
        b.plan
            .ops
            .iter()
            .map(|op| {
                let kind = match op.kind() {
                    OpKind::Begin => "B",
                    OpKind::End => "E",
                    OpKind::Instant => "I",
                    OpKind::Counter(_) => "C",
                };
                let name = match op.kind() {
                    OpKind::End => String::new(),
                    _ => b.plan.names[op.name as usize].clone(),
                };
                (op.ts, kind, name)
            })
            .collect()
    }

    #[test]
    fn a_slice_that_overruns_its_parent_is_cut_at_the_parents_end() {
        let mut b = Builder::new(0);
        let mut root = b.slice(10, 100, "root", Cat::Request, 0);
        root.depth = 0;
        let items = vec![
            b.slice(20, 150, "overruns", Cat::Stage, 0),
            b.instant(30, "token", Cat::Token, Flow::None),
            b.slice(100, 120, "after", Cat::Stage, 0),
            root,
            b.slice(10, 100, "same span, deeper", Cat::Stage, 0),
        ];
        b.nest(1, items);
        let got = shape(&b);
        let want: Vec<(u64, &str, String)> = vec![
            (10, "B", "root".into()),
            (10, "B", "same span, deeper".into()),
            (20, "B", "overruns".into()),
            (30, "I", "token".into()),
            (100, "E", String::new()),
            (100, "E", String::new()),
            (100, "E", String::new()),
            (100, "B", "after".into()),
            (120, "E", String::new()),
        ];
        assert_eq!(got, want, "nested, cut at 100, siblings after the end");
    }

    #[test]
    fn ops_sort_by_time_keeping_their_order_at_equal_times() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        // Few ops (the comparison sort); many over few times (ties), over a window's
        // span of times (three digits), over any u64 (six), and already in order.
        // Past 2^16 ops, in two parts on two threads; most ops at the top of u64's range
        // (the middle saturates), span 1 below.
        for (n, span) in [
            (3_000, 300),
            (20_000, 300),
            (20_000, 60_000_000_000),
            (20_000, u64::MAX),
            (20_000, 0),
            (100_000, 300),
            (100_000, 60_000_000_000),
            (100_000, u64::MAX),
            (100_000, 0),
            (100_000, 1),
        ] {
            let mut ops: Vec<Op> = (0..n)
                .map(|k| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let ts = match span {
                        0 => u64::from(k) * 3,
                        1 if rng.is_multiple_of(5) => (1 << 63) + rng % (1 << 62),
                        1 => u64::MAX - rng % 3,
                        u64::MAX => rng,
                        span => 5_000 + rng % span,
                    };
                    // The name records the push order.
                    Op::new(ts, 1, OpKind::Instant, k, 0, Flow::None, 0)
                })
                .collect();
            let mut want = ops.clone();
            want.sort_by_key(|op| op.ts);
            sort_by_time(&mut ops);
            let key = |ops: &[Op]| ops.iter().map(|op| (op.ts, op.name)).collect::<Vec<_>>();
            assert!(
                key(&ops) == key(&want),
                "{n} ops over {span} ns: as a stable sort by time orders them"
            );
        }
    }

    #[test]
    fn ops_pack_kind_flow_and_counter_values() {
        let op = Op::new(5, 7, OpKind::Counter(2.5), 0, 0, Flow::None, 0);
        assert_eq!(
            (op.kind(), op.flow(), op.track()),
            (OpKind::Counter(2.5), Flow::None, 7)
        );
        let op = Op::new(5, 7, OpKind::Instant, 3, 2, Flow::Last(1 << 40), 9);
        assert_eq!(
            (op.kind(), op.flow()),
            (OpKind::Instant, Flow::Last(1 << 40))
        );
        let op = Op::new(5, 7, OpKind::Begin, 3, 2, Flow::Step(4), 9);
        assert_eq!((op.kind(), op.flow()), (OpKind::Begin, Flow::Step(4)));
    }
}
