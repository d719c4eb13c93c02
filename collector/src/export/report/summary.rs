//! A request as `report --json` lists it by default: every figure of it (points with
//! their TTFT, stages, GPU, flags), its per-token series summed up (each point's token
//! count and ITL p50/p99/max, each hop's forward delay p50/p99/max, how many of its
//! gaps a prefill stalled), and no per-token arrays: under 2 KB a request (one line
//! each) however long its stream, where the arrays cost ~20 bytes a token (`report
//! --json --tokens` keeps them). Stages that do not apply are left out, not null.

use serde::Serialize;

use super::sorted;
use crate::analyze::percentile_in_place;
use crate::stitch::Request;

/// `r` without its per-token arrays, with their summaries in their place, as JSON (keys
/// sorted at every level). The arrays are summed up first and taken out before `r` is
/// serialized.
pub fn summary(mut r: Request) -> Vec<u8> {
    let (points, delays, stalls) = sum_up(&mut r);
    let (mut points, mut delays) = (points.into_iter(), delays.into_iter());
    sorted::to_vec(&r, |o| {
        if o.under("points") {
            let Some((tokens, records, itl)) = points.next() else {
                return Ok(());
            };
            o.remove("token_ns");
            o.remove("token_choice");
            o.remove("record_ns");
            o.insert("tokens", &tokens)?;
            if records != 0 {
                o.insert("records", &records)?;
            }
            o.insert("itl", &itl)?;
        } else if o.under("forward") {
            if let Some(delay) = delays.next() {
                o.remove("delay_ns");
                o.insert("delay", &delay)?;
            }
        } else if o.under("stages") {
            o.retain(|_, v| v != b"null");
        } else if let (true, Some(stalls)) = (o.under("gpu"), stalls) {
            o.remove("stalled_by");
            o.insert("stalls", &stalls)?;
        }
        Ok(())
    })
    .expect("a request serializes")
}

/// Each point's (tokens, records, ITL), each hop's delay and the GPU's stalls, then
/// `r`'s per-token arrays emptied.
type Sums = (
    Vec<(usize, usize, Option<Brief>)>,
    Vec<Option<Brief>>,
    Option<usize>,
);

fn sum_up(r: &mut Request) -> Sums {
    let points = r
        .points
        .iter()
        .map(|p| (p.token_ns.len(), p.record_ns.len(), brief(p.itl_ns())))
        .collect();
    let delays = r
        .forward
        .iter()
        .map(|hop| brief(hop.delay_ns(&r.points)))
        .collect();
    let stalls = r
        .gpu
        .as_mut()
        .map(|g| std::mem::take(&mut g.stalled_by).len());
    for p in &mut r.points {
        p.token_ns = Vec::new();
        p.record_ns = Vec::new();
        p.token_choice = Vec::new();
    }
    (points, delays, stalls)
}

/// p50, p99 and max of a series (null when empty; its count is the point's tokens).
#[derive(Serialize)]
struct Brief {
    max_ns: u64,
    p50_ns: u64,
    p99_ns: u64,
}

/// By selection, not a sort (seven series a request: their sorts were 2% of a
/// report's instructions); the figures `summarize` gives.
fn brief(mut v: Vec<u64>) -> Option<Brief> {
    let max_ns = *v.iter().max()?;
    let p99_ns = percentile_in_place(&mut v, 990);
    let p50_ns = percentile_in_place(&mut v, 500);
    Some(Brief {
        max_ns,
        p50_ns,
        p99_ns,
    })
}

/// The summary as it was made before: `r` through a serde_json `Value`, edited there.
/// What `summary` must write, byte for byte.
#[cfg(test)]
pub(super) fn summary_value(mut r: Request) -> serde_json::Value {
    use serde_json::{json, Value};
    let (points, delays, stalls) = sum_up(&mut r);
    let brief = |b: Option<Brief>| serde_json::to_value(b).expect("a brief");
    let mut v = serde_json::to_value(&r).expect("a request serializes");
    if let Some(listed) = v.get_mut("points").and_then(Value::as_array_mut) {
        for (p, (tokens, records, itl)) in listed.iter_mut().zip(points) {
            let itl = brief(itl);
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
            o.insert("delay".into(), brief(delay));
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
                brief(v.clone()).expect("samples"),
                summarize(&v).expect("samples"),
            );
            assert_eq!(
                (got.p50_ns, got.p99_ns, got.max_ns),
                (want.p50_ns, want.p99_ns, want.max_ns),
                "{len} samples"
            );
        }
        assert!(brief(Vec::new()).is_none(), "no samples: null");
    }
}
