//! A request as `report --json` lists it by default: every figure of it (points with
//! their TTFT, stages, GPU, flags), its per-token series summed up (each point's token
//! count and ITL p50/p99/max, each hop's forward delay p50/p99/max, how many of its
//! gaps a prefill stalled), and no per-token arrays: under 2 KB a request (one line
//! each) however long its stream, where the arrays cost ~20 bytes a token (`report
//! --json --tokens` keeps them). Stages that do not apply are left out, not null.

mod json;

use json::Obj;

use crate::analyze::percentiles_in_place;
use crate::ingest::hosts::split_pid;
use crate::stitch::attribution::GpuShare;
use crate::stitch::request::{Forward, Stages};
use crate::stitch::{Point, PointKind, Request};

/// `r` without its per-token arrays, with their summaries in their place, as JSON (keys
/// sorted at every level).
///
/// Written by hand (`json::Obj`) from views whose fields are declared, and written, in
/// key order (what a `serde_json::Value`'s sorted maps give, byte for byte:
/// `summary_value` below is the reference the tests hold it to). Each view takes its
/// type apart field by field, with no `..`: a field added to `Request` or to a part of
/// it does not build until the summary says what it writes for it.
pub fn summary(r: Request) -> Vec<u8> {
    let mut series = Vec::new();
    let view = View::of(&r, &mut series);
    let mut out = Vec::with_capacity(2048);
    view.write(&mut out);
    out
}

/// What a summary's points and hops write beside `json::Obj`'s plain values.
impl Obj<'_> {
    fn kind(&mut self, key: &'static str, kind: PointKind) {
        serde_json::to_writer(self.key(key), &kind).expect("a kind serializes");
    }

    /// null when None.
    fn brief(&mut self, key: &'static str, b: &Option<Brief>) {
        let out = self.key(key);
        match b {
            Some(b) => b.write(out),
            None => out.extend_from_slice(b"null"),
        }
    }
}

/// A request's summary, its keys in order.
struct View<'a> {
    api: Option<&'static str>,
    attached_mid: bool,
    body_bytes: Option<u64>,
    chunk_mismatches: u32,
    client_addr: &'a str,
    client_comm: &'a str,
    client_pid: u32,
    coalesced: bool,
    connection_requests: usize,
    encrypted: bool,
    end_ns: Option<u64>,
    engine_received_ns: Option<u64>,
    events_dropped: bool,
    first_byte_ns: u64,
    forward: Vec<HopView>,
    gpu: Option<GpuView>,
    host: Option<&'a str>,
    http2: bool,
    id: usize,
    join: Option<&'static str>,
    method: &'a str,
    new_connection: bool,
    path: &'a str,
    points: Vec<PointView<'a>>,
    reasoning_tokens: u32,
    stages: StagesView,
    start_ns: u64,
    status: Option<u32>,
    tls: bool,
    tool_tokens: u32,
    trace_parent: Option<&'a str>,
    truncated: bool,
}

impl View<'_> {
    /// Every key in order; those marked "left out" are written only when set.
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Obj::new(out);
        if let Some(api) = self.api {
            o.str("api", api); // left out
        }
        o.bool("attached_mid", self.attached_mid);
        o.opt_u64("body_bytes", self.body_bytes);
        o.u64("chunk_mismatches", self.chunk_mismatches);
        o.str("client_addr", self.client_addr);
        o.str("client_comm", self.client_comm);
        o.u64("client_pid", self.client_pid);
        o.bool("coalesced", self.coalesced);
        o.u64("connection_requests", self.connection_requests as u64);
        o.bool("encrypted", self.encrypted);
        o.opt_u64("end_ns", self.end_ns);
        o.opt_u64("engine_received_ns", self.engine_received_ns);
        o.bool("events_dropped", self.events_dropped);
        o.u64("first_byte_ns", self.first_byte_ns);
        o.array("forward", &self.forward, HopView::write);
        match &self.gpu {
            Some(g) => g.write(o.key("gpu")),
            None => o.key("gpu").extend_from_slice(b"null"),
        }
        o.opt_str("host", self.host);
        o.bool("http2", self.http2);
        o.u64("id", self.id as u64);
        if let Some(join) = self.join {
            o.str("join", join); // left out
        }
        o.str("method", self.method);
        o.bool("new_connection", self.new_connection);
        o.str("path", self.path);
        o.array("points", &self.points, PointView::write);
        if self.reasoning_tokens != 0 {
            o.u64("reasoning_tokens", self.reasoning_tokens); // left out
        }
        self.stages.write(o.key("stages"));
        o.u64("start_ns", self.start_ns);
        o.opt_u64("status", self.status);
        o.bool("tls", self.tls);
        if self.tool_tokens != 0 {
            o.u64("tool_tokens", self.tool_tokens); // left out
        }
        if let Some(trace_parent) = self.trace_parent {
            o.str("trace_parent", trace_parent); // left out
        }
        o.bool("truncated", self.truncated);
        o.end();
    }
}

impl<'a> View<'a> {
    /// `series`: room for the per-token series summed up, kept from one to the next.
    fn of(r: &'a Request, series: &mut Vec<u64>) -> View<'a> {
        let Request {
            id,
            method,
            path,
            host,
            trace_parent,
            status,
            api,
            reasoning_tokens,
            tool_tokens,
            client_pid,
            client_comm,
            client_addr,
            start_ns,
            first_byte_ns,
            end_ns,
            new_connection,
            connection_requests,
            tls,
            encrypted,
            http2,
            attached_mid,
            join,
            coalesced,
            truncated,
            events_dropped,
            chunk_mismatches,
            stages,
            engine_received_ns,
            body_bytes,
            prefix_prints: _,
            connections: _,
            connection_close_ns: _,
            retransmit_ns: _,
            order: _,
            spans: _,
            gpu,
            points,
            forward,
        } = r;
        View {
            api: *api,
            attached_mid: *attached_mid,
            body_bytes: *body_bytes,
            chunk_mismatches: *chunk_mismatches,
            client_addr,
            client_comm,
            client_pid: split_pid(*client_pid).1,
            coalesced: *coalesced,
            connection_requests: *connection_requests,
            encrypted: *encrypted,
            end_ns: *end_ns,
            engine_received_ns: *engine_received_ns,
            events_dropped: *events_dropped,
            first_byte_ns: *first_byte_ns,
            forward: forward
                .iter()
                .map(|hop| HopView::of(hop, points, series))
                .collect(),
            gpu: gpu.as_ref().map(GpuView::of),
            host: host.as_deref(),
            http2: *http2,
            id: *id,
            join: *join,
            method,
            new_connection: *new_connection,
            path,
            points: points.iter().map(|p| PointView::of(p, series)).collect(),
            reasoning_tokens: *reasoning_tokens,
            stages: StagesView::of(stages),
            start_ns: *start_ns,
            status: *status,
            tls: *tls,
            tool_tokens: *tool_tokens,
            trace_parent: trace_parent.as_deref(),
            truncated: *truncated,
        }
    }
}

/// A point with its token count and ITL summary in place of its arrays.
struct PointView<'a> {
    comm: &'a str,
    compressed: bool,
    done: bool,
    host: u32,
    ios: u32,
    itl: Option<Brief>,
    kind: PointKind,
    max_tokens_per_io: u32,
    pid: u32,
    records: usize,
    tokens: usize,
    ttft_ns: Option<u64>,
}

impl PointView<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Obj::new(out);
        o.str("comm", self.comm);
        o.bool("compressed", self.compressed);
        o.bool("done", self.done);
        if self.host != 0 {
            o.u64("host", self.host); // left out
        }
        o.u64("ios", self.ios);
        o.brief("itl", &self.itl);
        o.kind("kind", self.kind);
        o.u64("max_tokens_per_io", self.max_tokens_per_io);
        o.u64("pid", self.pid);
        if self.records != 0 {
            o.u64("records", self.records as u64); // left out
        }
        o.u64("tokens", self.tokens as u64);
        o.opt_u64("ttft_ns", self.ttft_ns);
        o.end();
    }
}

impl<'a> PointView<'a> {
    fn of(p: &'a Point, series: &mut Vec<u64>) -> PointView<'a> {
        let Point {
            kind,
            pid,
            host,
            comm,
            ttft_ns,
            token_ns,
            head_ns: _,
            ios,
            max_tokens_per_io,
            done,
            compressed,
            record_ns,
            token_choice: _,
        } = p;
        series.clear();
        p.itl_into(series);
        PointView {
            comm,
            compressed: *compressed,
            done: *done,
            host: *host,
            ios: *ios,
            itl: brief(series),
            kind: *kind,
            max_tokens_per_io: *max_tokens_per_io,
            pid: split_pid(*pid).1,
            records: record_ns.len(),
            tokens: token_ns.len(),
            ttft_ns: *ttft_ns,
        }
    }
}

/// A hop with its delay summary in place of the per-token delays.
struct HopView {
    between_hosts: bool,
    delay: Option<Brief>,
    from: PointKind,
    to: PointKind,
}

impl HopView {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Obj::new(out);
        if self.between_hosts {
            o.bool("between_hosts", true); // left out
        }
        o.brief("delay", &self.delay);
        o.kind("from", self.from);
        o.kind("to", self.to);
        o.end();
    }

    fn of(hop: &Forward, points: &[Point], series: &mut Vec<u64>) -> HopView {
        let Forward {
            from,
            to,
            between_hosts,
            to_point: _,
        } = hop;
        series.clear();
        series.extend(hop.delays(points));
        HopView {
            between_hosts: *between_hosts,
            delay: brief(series),
            from: *from,
            to: *to,
        }
    }
}

/// The stages that apply (those that do not are left out, not null).
struct StagesView {
    connect_ns: Option<u64>,
    gateway_ns: Option<u64>,
    gateway_ttft_ns: Option<u64>,
    subrequest_ns: Option<u64>,
    tls_ns: Option<u64>,
    upload_ns: Option<u64>,
    upstream_wait_ns: Option<u64>,
}

impl StagesView {
    /// Each left out when None.
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Obj::new(out);
        for (key, v) in [
            ("connect_ns", self.connect_ns),
            ("gateway_ns", self.gateway_ns),
            ("gateway_ttft_ns", self.gateway_ttft_ns),
            ("subrequest_ns", self.subrequest_ns),
            ("tls_ns", self.tls_ns),
            ("upload_ns", self.upload_ns),
            ("upstream_wait_ns", self.upstream_wait_ns),
        ] {
            if let Some(v) = v {
                o.u64(key, v);
            }
        }
        o.end();
    }

    fn of(s: &Stages) -> StagesView {
        let Stages {
            connect_ns,
            tls_ns,
            upload_ns,
            gateway_ns,
            subrequest_ns,
            upstream_wait_ns,
            gateway_ttft_ns,
        } = *s;
        StagesView {
            connect_ns,
            gateway_ns,
            gateway_ttft_ns,
            subrequest_ns,
            tls_ns,
            upload_ns,
            upstream_wait_ns,
        }
    }
}

/// The GPU's share with the count of stalled gaps in place of their list.
struct GpuView {
    decode_gpu_ns: Option<u64>,
    decode_steps: u32,
    prefill_gpu_ns: Option<u64>,
    prefill_ns: u64,
    prefill_steps: u32,
    queue_ns: Option<u64>,
    stalls: usize,
}

impl GpuView {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Obj::new(out);
        if let Some(v) = self.decode_gpu_ns {
            o.u64("decode_gpu_ns", v); // left out
        }
        o.u64("decode_steps", self.decode_steps);
        if let Some(v) = self.prefill_gpu_ns {
            o.u64("prefill_gpu_ns", v); // left out
        }
        o.u64("prefill_ns", self.prefill_ns);
        o.u64("prefill_steps", self.prefill_steps);
        o.opt_u64("queue_ns", self.queue_ns);
        o.u64("stalls", self.stalls as u64);
        o.end();
    }

    fn of(g: &GpuShare) -> GpuView {
        let GpuShare {
            queue_ns,
            prefill_steps,
            prefill_ns,
            decode_steps,
            prefill_gpu_ns,
            decode_gpu_ns,
            stalled_by,
        } = g;
        GpuView {
            decode_gpu_ns: *decode_gpu_ns,
            decode_steps: *decode_steps,
            prefill_gpu_ns: *prefill_gpu_ns,
            prefill_ns: *prefill_ns,
            prefill_steps: *prefill_steps,
            queue_ns: *queue_ns,
            stalls: stalled_by.len(),
        }
    }
}

/// p50, p99 and max of a series (null when empty; its count is the point's tokens).
struct Brief {
    max_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
}

impl Brief {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Obj::new(out);
        o.u64("max_ns", self.max_ns);
        o.u64("p50_ns", self.p50_ns);
        o.u64("p99_ns", self.p99_ns);
        o.end();
    }
}

/// By selection, not a sort (seven series a request: their sorts were 2% of a
/// report's instructions); the figures `summarize` gives. Reorders `v`.
fn brief(v: &mut [u64]) -> Option<Brief> {
    let max_ns = *v.iter().max()?;
    let [p50_ns, p99_ns] = percentiles_in_place(v, [500, 990]);
    Some(Brief {
        max_ns,
        p50_ns,
        p99_ns,
    })
}

/// The summary as it was made before: `r` through a serde_json `Value`, edited there,
/// its series summed up by `analyze::summarize`. What `summary` must write, byte for
/// byte.
#[cfg(test)]
pub(super) fn summary_value(mut r: Request) -> serde_json::Value {
    use serde_json::{json, Value};
    let brief = |series: Vec<u64>| match crate::analyze::summarize(&series) {
        Some(s) => json!({"max_ns": s.max_ns, "p50_ns": s.p50_ns, "p99_ns": s.p99_ns}),
        None => Value::Null,
    };
    let points: Vec<_> = r
        .points
        .iter()
        .map(|p| (p.token_ns.len(), p.record_ns.len(), brief(p.itl_ns())))
        .collect();
    let delays: Vec<_> = r
        .forward
        .iter()
        .map(|hop| brief(hop.delay_ns(&r.points)))
        .collect();
    let stalls = r.gpu.as_ref().map(|g| g.stalled_by.len());
    for p in &mut r.points {
        p.token_ns.clear();
        p.record_ns.clear();
        p.token_choice.clear();
    }
    let mut v = serde_json::to_value(&r).expect("a request serializes");
    if let Some(listed) = v.get_mut("points").and_then(Value::as_array_mut) {
        for (p, (tokens, records, itl)) in listed.iter_mut().zip(points) {
            let Some(o) = p.as_object_mut() else { continue };
            o.remove("token_ns");
            o.remove("token_choice");
            o.remove("record_ns");
            o.insert("tokens".into(), json!(tokens));
            if records != 0 {
                o.insert("records".into(), json!(records));
            }
            o.insert("itl".into(), itl);
        }
    }
    if let Some(hops) = v.get_mut("forward").and_then(Value::as_array_mut) {
        for (h, delay) in hops.iter_mut().zip(delays) {
            let Some(o) = h.as_object_mut() else { continue };
            o.remove("delay_ns");
            o.insert("delay".into(), delay);
        }
    }
    if let Some(stages) = v.get_mut("stages").and_then(Value::as_object_mut) {
        stages.retain(|_, s| !s.is_null());
    }
    if let (Some(g), Some(stalls)) = (v.get_mut("gpu").and_then(Value::as_object_mut), stalls) {
        g.remove("stalled_by");
        g.insert("stalls".into(), json!(stalls));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analyze::summarize;

    /// A request with every part a summary can write set (and one with none), byte
    /// for byte as through a `Value`: keys in order, each left out or null as there.
    #[test]
    fn a_summary_writes_what_a_sorted_value_gives() {
        use crate::gpu::StepKind;
        use crate::stitch::attribution::Stall;

        let host2 = |pid: u32| pid | 2 << crate::ingest::hosts::PID_HOST_SHIFT;
        let mut r = Request::at_point(
            7,
            PointKind::ClientRead,
            host2(4242),
            "cu\"rl\t",
            vec![100, 250, 260, 900, 1_000],
        );
        // Strings that need escaping, and one that does not but is not ASCII.
        r.path = "/v1/chat\\completions?q=\u{1}é".into();
        r.method = "POST".into();
        r.host = Some("api.example:443".into());
        r.trace_parent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
        r.status = Some(200);
        r.api = Some("openai-chat");
        r.reasoning_tokens = 2;
        r.tool_tokens = 1;
        r.tls = true;
        r.http2 = true;
        r.attached_mid = true;
        r.join = Some("by-tokens");
        r.coalesced = true;
        r.truncated = true;
        r.events_dropped = true;
        r.chunk_mismatches = 3;
        r.engine_received_ns = Some(40);
        r.body_bytes = Some(298);
        r.stages = Stages {
            connect_ns: Some(1),
            tls_ns: Some(2),
            upload_ns: Some(0),
            gateway_ns: Some(4),
            subrequest_ns: Some(5),
            upstream_wait_ns: Some(6),
            gateway_ttft_ns: Some(7),
        };
        r.gpu = Some(GpuShare {
            queue_ns: Some(11),
            prefill_steps: 1,
            prefill_ns: 12,
            decode_steps: 4,
            prefill_gpu_ns: Some(13),
            decode_gpu_ns: Some(14),
            stalled_by: vec![Stall {
                token: 2,
                gap_ns: 640,
                step_kind: StepKind::Mixed,
                step_ns: 600,
                requests: vec![8],
            }],
        });
        let mut engine = r.points[0].clone();
        engine.kind = PointKind::EngineWrite;
        engine.pid = 17;
        engine.host = 0;
        engine.ttft_ns = Some(90);
        engine.token_ns = vec![90, 240, 255, 880, 990];
        engine.token_choice = vec![0, 1, 0, 1, 0];
        engine.record_ns = vec![91, 241];
        r.points[0].ttft_ns = Some(100);
        r.points.push(engine);
        r.forward = vec![Forward::between(&r.points, 0)];
        assert!(r.forward[0].between_hosts, "a hop across hosts");
        let bytes = summary(r.clone());
        let want = serde_json::to_vec(&summary_value(r.clone())).expect("JSON");
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&want)
        );
        let text = String::from_utf8(bytes).expect("UTF-8");
        for part in [
            "\"comm\":\"cu\\\"rl\\t\"",
            "\"path\":\"/v1/chat\\\\completions?q=\\u0001é\"",
            "\"stalls\":1",
            "\"records\":2",
            "\"host\":2",
            "\"between_hosts\":true",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }

        let bare = Request::at_point(1, PointKind::EngineWrite, 9, "engine", Vec::new());
        let want = serde_json::to_vec(&summary_value(bare.clone())).expect("JSON");
        assert_eq!(
            String::from_utf8_lossy(&summary(bare)),
            String::from_utf8_lossy(&want)
        );
    }

    #[test]
    fn a_brief_gives_what_the_sorted_summary_gives() {
        let mut state = 11u64;
        for len in [1usize, 2, 3, 63, 64, 65, 200, 1000] {
            let v: Vec<u64> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 40) % 50_000
                        + if state.is_multiple_of(17) {
                            7_000_000
                        } else {
                            0
                        }
                })
                .collect();
            let (got, want) = (
                brief(&mut v.clone()).expect("samples"),
                summarize(&v).expect("samples"),
            );
            assert_eq!(
                (got.p50_ns, got.p99_ns, got.max_ns),
                (want.p50_ns, want.p99_ns, want.max_ns),
                "{len} samples"
            );
        }
        assert!(brief(&mut []).is_none(), "no samples: null");
    }
}
