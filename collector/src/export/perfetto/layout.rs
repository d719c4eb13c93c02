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
mod sort;
mod trace;

pub(crate) use counters::Running;
pub(crate) use diagnoses::Cites;
use flows::FlowIds;
use sort::sort_by_time;
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
