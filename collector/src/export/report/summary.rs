//! A request as `report --json` lists it by default: every figure of it (points with
//! their TTFT, stages, GPU, flags), its per-token series summed up (each point's token
//! count and ITL p50/p99/max, each hop's forward delay p50/p99/max, how many of its
//! gaps a prefill stalled), and no per-token arrays: under 2 KB a request (one line
//! each) however long its stream, where the arrays cost ~20 bytes a token (`report
//! --json --tokens` keeps them). Stages that do not apply are left out, not null.

use serde::Serialize;

use crate::analyze::percentiles_in_place;
use crate::ingest::hosts::split_pid;
use crate::stitch::attribution::GpuShare;
use crate::stitch::request::{Forward, Stages};
use crate::stitch::{Point, PointKind, Request};

/// `r` without its per-token arrays, with their summaries in their place, as JSON (keys
/// sorted at every level).
///
/// Written straight from views whose fields are declared in key order (what a
/// `serde_json::Value`'s sorted maps give, byte for byte: `summary_value` below is the
/// reference the tests hold it to). Each view takes its type apart field by field, with
/// no `..`: a field added to `Request` or to a part of it does not build until the
/// summary says what it writes for it.
pub fn summary(r: Request) -> Vec<u8> {
    let mut series = Vec::new();
    let view = View::of(&r, &mut series);
    let mut out = Vec::with_capacity(2048);
    serde_json::to_writer(&mut out, &view).expect("a summary serializes");
    out
}

/// A request's summary, its keys in order.
#[derive(Serialize)]
struct View<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    join: Option<&'static str>,
    method: &'a str,
    new_connection: bool,
    path: &'a str,
    points: Vec<PointView<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    reasoning_tokens: u32,
    stages: StagesView,
    start_ns: u64,
    status: Option<u32>,
    tls: bool,
    #[serde(skip_serializing_if = "is_zero")]
    tool_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_parent: Option<&'a str>,
    truncated: bool,
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
#[derive(Serialize)]
struct PointView<'a> {
    comm: &'a str,
    compressed: bool,
    done: bool,
    #[serde(skip_serializing_if = "is_zero")]
    host: u32,
    ios: u32,
    itl: Option<Brief>,
    kind: PointKind,
    max_tokens_per_io: u32,
    pid: u32,
    #[serde(skip_serializing_if = "is_zero")]
    records: usize,
    tokens: usize,
    ttft_ns: Option<u64>,
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
#[derive(Serialize)]
struct HopView {
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    between_hosts: bool,
    delay: Option<Brief>,
    from: PointKind,
    to: PointKind,
}

impl HopView {
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
#[derive(Serialize)]
struct StagesView {
    #[serde(skip_serializing_if = "Option::is_none")]
    connect_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway_ttft_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subrequest_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upload_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_wait_ns: Option<u64>,
}

impl StagesView {
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
#[derive(Serialize)]
struct GpuView {
    #[serde(skip_serializing_if = "Option::is_none")]
    decode_gpu_ns: Option<u64>,
    decode_steps: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefill_gpu_ns: Option<u64>,
    prefill_ns: u64,
    prefill_steps: u32,
    queue_ns: Option<u64>,
    stalls: usize,
}

impl GpuView {
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

fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

/// p50, p99 and max of a series (null when empty; its count is the point's tokens).
#[derive(Serialize)]
struct Brief {
    max_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
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
            "curl",
            vec![100, 250, 260, 900, 1_000],
        );
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
