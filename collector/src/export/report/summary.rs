//! A request as `report --json` lists it by default: every figure of it (points with
//! their TTFT, stages, GPU, flags), its per-token series summed up (each point's token
//! count and ITL p50/p99/max, each hop's forward delay p50/p99/max, how many of its
//! gaps a prefill stalled), and no per-token arrays: under 2 KB a request (one line
//! each) however long its stream, where the arrays cost ~20 bytes a token (`report
//! --json --tokens` keeps them). Stages that do not apply are left out, not null.

use serde_json::{json, Value};

use crate::analyze::summarize;
use crate::stitch::Request;

/// `r` without its per-token arrays, with their summaries in their place.
pub fn summary(r: &Request) -> Value {
    let mut v = serde_json::to_value(r).expect("a request serializes");
    if let Some(points) = v.get_mut("points").and_then(Value::as_array_mut) {
        for (p, point) in points.iter_mut().zip(&r.points) {
            let Some(o) = p.as_object_mut() else { continue };
            o.remove("token_ns");
            o.remove("token_choice");
            o.remove("record_ns");
            o.insert("tokens".into(), json!(point.token_ns.len()));
            if !point.record_ns.is_empty() {
                o.insert("records".into(), json!(point.record_ns.len()));
            }
            o.insert("itl".into(), brief(&point.itl_ns()));
        }
    }
    if let Some(hops) = v.get_mut("forward").and_then(Value::as_array_mut) {
        for (h, hop) in hops.iter_mut().zip(&r.forward) {
            let Some(o) = h.as_object_mut() else { continue };
            o.remove("delay_ns");
            o.insert("delay".into(), brief(&hop.delay_ns(&r.points)));
        }
    }
    if let Some(stages) = v.get_mut("stages").and_then(Value::as_object_mut) {
        stages.retain(|_, s| !s.is_null());
    }
    if let (Some(g), Some(share)) = (
        v.get_mut("gpu").and_then(Value::as_object_mut),
        r.gpu.as_ref(),
    ) {
        g.remove("stalled_by");
        g.insert("stalls".into(), json!(share.stalled_by.len()));
    }
    v
}

/// p50, p99 and max of a series (null when empty; its count is the point's tokens).
fn brief(v: &[u64]) -> Value {
    match summarize(v) {
        Some(s) => json!({
            "p50_ns": s.p50_ns,
            "p99_ns": s.p99_ns,
            "max_ns": s.max_ns,
        }),
        None => Value::Null,
    }
}
