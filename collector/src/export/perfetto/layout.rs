//! The stitched timeline -> tracks and time-ordered events (not yet encoded).
//! Slices are nested per track here: a slice that would straddle its parent's
//! end is cut at that end (its real length stays in its arguments), so begin/end
//! always balance and nest whatever the data looks like.

use std::collections::{BTreeMap, HashMap};

use crate::gpu::StepKind;
use crate::ingest::model::{event::Body, GpuActivityKind, NvmlSample};
use crate::ingest::record::FileHeader;
use crate::ingest::Event;
use crate::stitch::chain::{self, End};
use crate::stitch::conn::{Connection, Exchange, Role};
use crate::stitch::{PointKind, Request, Timeline};

/// Interned categories, by index (iid = index + 1).
pub(crate) const CATEGORIES: [&str; 7] = [
    "request",
    "stage",
    "token",
    "connection",
    "gpu",
    "kernel",
    "nvtx",
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
    pub(crate) uuid: u64,
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

#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub(crate) ts: u64,
    pub(crate) track: u64,
    pub(crate) kind: OpKind,
    pub(crate) name: u32,
    pub(crate) cat: u8,
    pub(crate) flow: Flow,
    /// 0: none, else index + 1 into `Plan::args`.
    pub(crate) args: u32,
}

pub(crate) enum Arg {
    Int(i64),
    Str(String),
}

pub(crate) struct Plan {
    pub(crate) start_ns: u64,
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
    name_ids: HashMap<String, u32>,
    processes: BTreeMap<u32, u64>,
}

pub(crate) fn plan(header: &FileHeader, events: &[Event], tl: &Timeline) -> Plan {
    let first_event = events.iter().map(|e| e.ts_ns).min().unwrap_or(0);
    let start_ns = match header.start_monotonic_ns {
        0 => first_event,
        s => s.min(first_event.max(1)),
    };
    let mut b = Builder {
        plan: Plan {
            start_ns,
            start_realtime_ns: header.start_realtime_ns,
            tracks: Vec::new(),
            ops: Vec::new(),
            names: Vec::new(),
            args: Vec::new(),
            request_tracks: 0,
            token_instants: 0,
            gpu_steps: 0,
            flows: 0,
        },
        name_ids: HashMap::new(),
        processes: BTreeMap::new(),
    };
    b.requests(tl);
    b.connections(&tl.connections);
    b.gpu_steps(tl);
    b.cupti(events);
    b.nvml(events);
    b.derived_counters(header, tl, start_ns, events);
    // Stable: each track's events were pushed in begin/end order.
    b.plan.ops.sort_by_key(|op| op.ts);
    b.plan
}

impl Builder {
    fn track(&mut self, parent: Option<u64>, name: String, kind: TrackKind) -> u64 {
        let uuid = self.plan.tracks.len() as u64 + 1;
        self.plan.tracks.push(Track {
            uuid,
            parent,
            name,
            kind,
            children: ChildOrder::Default,
            rank: None,
        });
        uuid
    }

    fn process(&mut self, pid: u32, comm: &str) -> Option<u64> {
        if pid == 0 {
            return None;
        }
        if let Some(&u) = self.processes.get(&pid) {
            return Some(u);
        }
        let u = self.track(None, comm.to_string(), TrackKind::Process { pid });
        self.plan.tracks[u as usize - 1].children = ChildOrder::Chronological;
        self.processes.insert(pid, u);
        Some(u)
    }

    fn name(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.name_ids.get(s) {
            return i;
        }
        let i = self.plan.names.len() as u32;
        self.plan.names.push(s.to_string());
        self.name_ids.insert(s.to_string(), i);
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
        let end_op = |ts| Op {
            ts,
            track,
            kind: OpKind::End,
            name: 0,
            cat: 0,
            flow: Flow::None,
            args: 0,
        };
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
            ops.push(Op {
                ts: it.start,
                track,
                kind,
                name: it.name,
                cat: it.cat as u8,
                flow: it.flow,
                args: it.args,
            });
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
        self.plan.ops.push(Op {
            ts,
            track,
            kind: OpKind::Counter(value),
            name: 0,
            cat: 0,
            flow: Flow::None,
            args: 0,
        });
    }

    fn requests(&mut self, tl: &Timeline) {
        let links = chain::link(&tl.connections);
        let chains = chain::chains(&tl.connections, &links);
        for r in &tl.requests {
            let parent = self.process(r.client_pid, &r.client_comm);
            let title = format!("{} {}", r.method, r.route());
            let track = self.track(
                parent,
                format!("request {} {title}", r.id),
                TrackKind::Plain,
            );
            self.plan.request_tracks += 1;
            // The chain this request was built from (stitch numbers requests by chain).
            let ch = chains.get(r.id).filter(|ch| {
                tl.connections[ch[0].0].exchanges[ch[0].1].request_start_ns == r.first_byte_ns
            });
            let mut items = self.stages(r, ch.map(|c| c.as_slice()), &tl.connections, &links);
            let end = request_end(r).max(items.iter().filter_map(|i| i.end).max().unwrap_or(0));
            let mut a = vec![("request_id", Arg::Int(r.id as i64))];
            if let Some(s) = r.status {
                a.push(("status", Arg::Int(i64::from(s))));
            }
            a.push(("tokens", Arg::Int(r.tokens() as i64)));
            if let Some(t) = r.first_point().and_then(|p| p.ttft_ns) {
                a.push(("ttft_ns", Arg::Int(t as i64)));
            }
            a.push((
                "client",
                Arg::Str(format!("{} {}", r.client_comm, r.client_addr)),
            ));
            let args = self.args(a);
            let mut root = self.slice(r.start_ns, end, &title, Cat::Request, args);
            root.depth = 0;
            items.push(root);
            self.nest(track, items);
            self.plan.tracks[track as usize - 1].children = ChildOrder::Explicit;
            self.points(r, track);
        }
    }

    /// Stages as slices on the request's own track.
    fn stages(
        &mut self,
        r: &Request,
        ch: Option<&[End]>,
        conns: &[Connection],
        links: &chain::Links,
    ) -> Vec<Item> {
        let mut items = Vec::new();
        let st = &r.stages;
        let x = |e: End| -> &Exchange { &conns[e.0].exchanges[e.1] };
        match ch {
            Some(ch) => {
                let rc = &conns[ch[0].0];
                let rx = x(ch[0]);
                if r.new_connection {
                    if let Some((a, b)) = rc.handshake() {
                        items.push(self.slice(a, b, "connect", Cat::Stage, 0));
                    }
                    if let Some(t) = &rc.tls {
                        if let (Some(a), Some(b)) = (t.client_hello_ns, t.client_first_app_ns) {
                            items.push(self.slice(a, b, "tls", Cat::Stage, 0));
                        }
                    }
                }
                if rc.role == Role::Client {
                    if let Some(e) = rx.request_end_ns {
                        items.push(self.slice(rx.request_start_ns, e, "upload", Cat::Stage, 0));
                    }
                }
                if let Some((i, &inbound)) = ch
                    .iter()
                    .enumerate()
                    .find(|(_, e)| links.upstream.contains_key(e))
                {
                    let out = ch.get(i + 1).copied().unwrap_or(links.upstream[&inbound]);
                    let (a, b) = (x(inbound).request_start_ns, x(out).request_start_ns);
                    items.push(self.slice(a, b, "gateway", Cat::Stage, 0));
                    for &s in links.subrequests.get(&inbound).into_iter().flatten() {
                        let sx = x(s);
                        let end = sx.response_end_ns.unwrap_or(sx.request_start_ns);
                        let name = format!("subrequest {}", sx.path);
                        let mut sub = self.slice(sx.request_start_ns, end, &name, Cat::Stage, 0);
                        sub.depth = 2;
                        items.push(sub);
                    }
                }
            }
            None => {
                if let Some(c) = st.connect_ns {
                    items.push(self.slice(r.start_ns, r.start_ns + c, "connect", Cat::Stage, 0));
                }
                if let Some(u) = st.upload_ns {
                    let a = r.first_byte_ns;
                    items.push(self.slice(a, a + u, "upload", Cat::Stage, 0));
                }
            }
        }
        let engine = r.point(PointKind::EngineWrite);
        let first = engine.and_then(|p| p.token_ns.first().copied());
        if let (Some(received), Some(first)) = (r.engine_received_ns, first) {
            match r.gpu.as_ref().and_then(|g| Some((g, g.queue_ns?))) {
                Some((g, q)) => {
                    let queued = (received + q).min(first);
                    items.push(self.slice(received, queued, "queue", Cat::Stage, 0));
                    let args = self.args(vec![
                        ("prefill_steps", Arg::Int(i64::from(g.prefill_steps))),
                        ("prefill_gpu_ns", Arg::Int(g.prefill_ns as i64)),
                    ]);
                    items.push(self.slice(queued, first, "prefill", Cat::Stage, args));
                }
                None => items.push(self.slice(received, first, "queue + prefill", Cat::Stage, 0)),
            }
        }
        if let Some(p) = engine.filter(|p| p.token_ns.len() > 1) {
            let (a, b) = (p.token_ns[0], p.token_ns[p.token_ns.len() - 1]);
            let mut v = vec![("tokens", Arg::Int(p.token_ns.len() as i64))];
            if let Some(g) = &r.gpu {
                v.push(("decode_steps", Arg::Int(i64::from(g.decode_steps))));
                v.push(("stalled_gaps", Arg::Int(g.stalled_by.len() as i64)));
            }
            let args = self.args(v);
            items.push(self.slice(a, b, "decode", Cat::Stage, args));
        }
        items
    }

    /// A child track per observation point, an instant per token, flows from the engine to the client.
    fn points(&mut self, r: &Request, request_track: u64) {
        let linked = if r.points.len() > 1 {
            r.points.iter().map(|p| p.token_ns.len()).min().unwrap_or(0)
        } else {
            0
        };
        self.plan.flows += linked;
        for (j, p) in r.points.iter().enumerate() {
            let name = format!("{} ({} {})", p.kind.label(), p.comm, p.pid);
            let t = self.track(Some(request_track), name, TrackKind::Plain);
            self.plan.tracks[t as usize - 1].rank = Some(j as i32);
            let mut items = Vec::with_capacity(p.token_ns.len() + p.record_ns.len());
            for (k, &ts) in p.token_ns.iter().enumerate() {
                let flow = if k >= linked {
                    Flow::None
                } else if j == 0 {
                    Flow::Last(flow_id(r.id, k))
                } else {
                    Flow::Step(flow_id(r.id, k))
                };
                items.push(self.instant(ts, "token", Cat::Token, flow));
            }
            self.plan.token_instants += p.token_ns.len();
            for &ts in &p.record_ns {
                items.push(self.instant(ts, "tls record", Cat::Token, Flow::None));
            }
            self.nest(t, items);
        }
    }

    fn connections(&mut self, conns: &[Connection]) {
        for c in conns {
            let parent = self.process(c.pid, &c.comm);
            let role = match c.role {
                Role::Client => "client",
                Role::Server => "server",
                Role::Unknown => "socket",
            };
            let name = format!("{role} {} -> {}", c.local, c.remote);
            let track = self.track(parent, name, TrackKind::Plain);
            let mut items = Vec::new();
            let mut end = c.last_ns.max(c.close_ns.unwrap_or(0));
            if let Some((a, b)) = c.handshake() {
                items.push(self.slice(a, b, "tcp handshake", Cat::Connection, 0));
            }
            if let Some(t) = &c.tls {
                if let (Some(a), Some(b)) = (t.client_hello_ns, t.client_first_app_ns) {
                    items.push(self.slice(a, b, "tls handshake", Cat::Connection, 0));
                }
            }
            for x in &c.exchanges {
                let x_end = exchange_end(x);
                end = end.max(x_end);
                let name = if x.encrypted {
                    "(encrypted exchange)".to_string()
                } else {
                    format!("{} {}", x.method, x.path)
                };
                let args = self.args(vec![
                    ("request_bytes", Arg::Int(x.request_bytes as i64)),
                    ("response_ios", Arg::Int(i64::from(x.response_ios))),
                ]);
                items.push(self.slice(x.request_start_ns, x_end, &name, Cat::Connection, args));
                if let Some(e) = x.request_end_ns {
                    let mut s = self.slice(x.request_start_ns, e, "request", Cat::Connection, 0);
                    s.depth = 2;
                    items.push(s);
                }
                if let Some(f) = x.response_first_ns {
                    let mut s = self.slice(f, x_end, "response", Cat::Connection, 0);
                    s.depth = 2;
                    items.push(s);
                }
            }
            for &ts in &c.retransmits {
                items.push(self.instant(ts, "retransmit", Cat::Connection, Flow::None));
            }
            let args = self.args(vec![
                ("bytes_sent", Arg::Int(c.bytes_sent as i64)),
                ("bytes_received", Arg::Int(c.bytes_recv as i64)),
            ]);
            let mut root = self.slice(c.first_ns, end, "connection", Cat::Connection, args);
            root.depth = 0;
            items.push(root);
            self.nest(track, items);
        }
    }

    fn gpu_steps(&mut self, tl: &Timeline) {
        let mut by_thread: BTreeMap<(u32, u32), Vec<&crate::gpu::GpuStep>> = BTreeMap::new();
        for s in &tl.steps {
            by_thread.entry((s.pid, s.tid)).or_default().push(s);
        }
        for ((pid, tid), steps) in by_thread {
            let parent = self.process(pid, &steps[0].comm);
            let track = self.track(
                parent,
                format!("GPU steps (thread {tid})"),
                TrackKind::Plain,
            );
            let mut items = Vec::with_capacity(steps.len());
            for s in steps {
                let kind = match s.kind {
                    StepKind::Prefill => "prefill",
                    StepKind::Decode => "decode",
                    StepKind::Mixed => "mixed",
                };
                let args = self.args(vec![
                    ("kernel_launches", Arg::Int(i64::from(s.kernel_launches))),
                    ("graph_launches", Arg::Int(i64::from(s.graph_launches))),
                ]);
                items.push(self.slice(s.start_ns, s.end_ns, kind, Cat::Gpu, args));
                self.plan.gpu_steps += 1;
            }
            self.nest(track, items);
        }
    }

    /// CUPTI spans: a track per (process, device, stream), NVTX ranges on their own.
    fn cupti(&mut self, events: &[Event]) {
        let mut by_stream: BTreeMap<(u32, u32, u32, bool), Vec<Item>> = BTreeMap::new();
        let mut comms: HashMap<u32, &str> = HashMap::new();
        for ev in events {
            let Some(Body::Gpu(a)) = &ev.body else {
                continue;
            };
            comms.entry(ev.pid).or_insert(&ev.comm);
            let kind = a.kind();
            let (label, cat) = match kind {
                GpuActivityKind::Kernel => ("kernel", Cat::Kernel),
                GpuActivityKind::Memcpy => ("memcpy", Cat::Kernel),
                GpuActivityKind::Graph => ("graph", Cat::Kernel),
                GpuActivityKind::Marker => ("nvtx", Cat::Nvtx),
                GpuActivityKind::Unknown => ("gpu activity", Cat::Kernel),
            };
            let name = if a.name.is_empty() { label } else { &a.name };
            let marker = kind == GpuActivityKind::Marker;
            let item = self.slice(a.start_ns, a.end_ns, name, cat, 0);
            by_stream
                .entry((ev.pid, a.device, if marker { 0 } else { a.stream }, marker))
                .or_default()
                .push(item);
        }
        for ((pid, device, stream, marker), items) in by_stream {
            let parent = self.process(pid, comms.get(&pid).copied().unwrap_or(""));
            let name = if marker {
                format!("NVTX (GPU {device})")
            } else {
                format!("GPU {device} stream {stream}")
            };
            let track = self.track(parent, name, TrackKind::Plain);
            self.nest(track, items);
        }
    }

    /// NVML series: a counter track per device and field, grouped per device.
    fn nvml(&mut self, events: &[Event]) {
        type Field = (
            &'static str,
            Option<&'static str>,
            fn(&NvmlSample) -> Option<f64>,
        );
        const FIELDS: [Field; 10] = [
            ("GPU utilization", Some("%"), |s| {
                s.gpu_util_pct.map(f64::from)
            }),
            ("memory utilization", Some("%"), |s| {
                s.mem_util_pct.map(f64::from)
            }),
            ("SM clock", Some("MHz"), |s| s.sm_clock_mhz.map(f64::from)),
            ("memory clock", Some("MHz"), |s| {
                s.mem_clock_mhz.map(f64::from)
            }),
            ("memory used", Some("bytes"), |s| {
                s.mem_used_bytes.map(|v| v as f64)
            }),
            ("power", Some("mW"), |s| s.power_mw.map(f64::from)),
            ("temperature", Some("C"), |s| s.temperature_c.map(f64::from)),
            ("throttle reasons", None, |s| {
                s.throttle_reasons.map(|v| v as f64)
            }),
            ("PCIe tx", Some("KB/s"), |s| s.pcie_tx_kbps.map(f64::from)),
            ("PCIe rx", Some("KB/s"), |s| s.pcie_rx_kbps.map(f64::from)),
        ];
        let mut samples: Vec<(u64, &NvmlSample)> = events
            .iter()
            .filter_map(|e| match &e.body {
                Some(Body::Nvml(s)) => Some((e.ts_ns, s)),
                _ => None,
            })
            .collect();
        samples.sort_by_key(|(ts, _)| *ts);
        let mut tracks: HashMap<(u32, usize), u64> = HashMap::new();
        let mut groups: BTreeMap<u32, u64> = BTreeMap::new();
        for (ts, s) in samples {
            for (f, (name, unit, get)) in FIELDS.iter().enumerate() {
                let Some(v) = get(s) else { continue };
                let track = match tracks.get(&(s.device, f)) {
                    Some(&t) => t,
                    None => {
                        let group = match groups.get(&s.device) {
                            Some(&g) => g,
                            None => {
                                let g = self.track(
                                    None,
                                    format!("GPU {} (NVML)", s.device),
                                    TrackKind::Plain,
                                );
                                groups.insert(s.device, g);
                                g
                            }
                        };
                        let t = self.track(
                            Some(group),
                            format!("GPU {} {name}", s.device),
                            TrackKind::Counter { unit: *unit },
                        );
                        tracks.insert((s.device, f), t);
                        t
                    }
                };
                self.counter(track, ts, v);
            }
        }
    }

    /// Counters computed from the timeline: in-flight requests, engine queue depth,
    /// tokens/s at each observation point, and the recording's ring-buffer drops.
    fn derived_counters(
        &mut self,
        header: &FileHeader,
        tl: &Timeline,
        start: u64,
        events: &[Event],
    ) {
        let group = self.track(None, "tokenscope".into(), TrackKind::Plain);
        let steps = |b: &mut Self, name: &str, mut deltas: Vec<(u64, i64)>| {
            if deltas.is_empty() {
                return;
            }
            deltas.sort();
            let t = b.track(Some(group), name.into(), TrackKind::Counter { unit: None });
            let mut level = 0i64;
            let mut i = 0;
            while i < deltas.len() {
                let ts = deltas[i].0;
                while i < deltas.len() && deltas[i].0 == ts {
                    level += deltas[i].1;
                    i += 1;
                }
                b.counter(t, ts, level as f64);
            }
        };
        let in_flight = tl
            .requests
            .iter()
            .flat_map(|r| [(r.start_ns, 1), (request_end(r), -1)])
            .collect();
        steps(self, "in-flight requests", in_flight);
        let queued = tl
            .requests
            .iter()
            .filter_map(|r| {
                let first = *r.point(PointKind::EngineWrite)?.token_ns.first()?;
                Some([(r.engine_received_ns?, 1), (first, -1)])
            })
            .flatten()
            .collect();
        steps(self, "engine queue depth", queued);
        for kind in [
            PointKind::EngineWrite,
            PointKind::ProxyRead,
            PointKind::ProxyWrite,
            PointKind::ClientRead,
        ] {
            let mut bins: BTreeMap<u64, u64> = BTreeMap::new();
            for t in tl
                .requests
                .iter()
                .filter_map(|r| r.point(kind))
                .flat_map(|p| &p.token_ns)
            {
                *bins
                    .entry(t.saturating_sub(start) / RATE_WINDOW_NS)
                    .or_default() += 1;
            }
            let (Some(&lo), Some(&hi)) = (bins.keys().next(), bins.keys().next_back()) else {
                continue;
            };
            let name = format!("tokens/s at {}", kind.label());
            let t = self.track(Some(group), name, TrackKind::Counter { unit: None });
            for w in lo..=hi + 1 {
                let n = bins.get(&w).copied().unwrap_or(0);
                let per_s = n as f64 * 1e9 / RATE_WINDOW_NS as f64;
                self.counter(t, start + w * RATE_WINDOW_NS, per_s);
            }
        }
        // The ring buffer's drops are counted per recording, not per moment: the
        // total is shown from the end of the recording.
        let dropped = header.counters.map_or(0, |c| c.dropped);
        let last = events.iter().map(|e| e.ts_ns).max().unwrap_or(start);
        let end = header.end_monotonic_ns.max(last).max(start);
        let t = self.track(
            Some(group),
            "ring-buffer drops".into(),
            TrackKind::Counter { unit: None },
        );
        self.counter(t, start, 0.0);
        self.counter(t, end, dropped as f64);
    }
}

/// Unique per (request, token position).
fn flow_id(request: usize, token: usize) -> u64 {
    ((request as u64 + 1) << 24) | token as u64
}

/// The last moment anything of the request was seen.
fn request_end(r: &Request) -> u64 {
    let mut end = r.end_ns.unwrap_or(r.start_ns).max(r.start_ns);
    for p in &r.points {
        end = end
            .max(p.token_ns.last().copied().unwrap_or(0))
            .max(p.record_ns.last().copied().unwrap_or(0));
    }
    end
}

fn exchange_end(x: &Exchange) -> u64 {
    x.response_end_ns
        .or(x.sse.last().map(|e| e.ts_ns))
        .or(x.records_ns.last().copied())
        .or(x.response_first_ns)
        .or(x.request_end_ns)
        .unwrap_or(x.request_start_ns)
        .max(x.request_start_ns)
}
