//! Trace ids: the one the request carried (`traceparent`), else one made from the
//! request's identity and a salt drawn at start, so the Prometheus exemplar and the
//! OTLP trace of a request name the same trace.

use collector::stitch::Request;

/// A random salt for this agent's run (the trace ids of two runs never collide).
pub fn salt() -> u64 {
    u64::from_le_bytes(crate::otlp::ids::random())
}

/// The 16-byte trace id of a request's spans.
pub fn trace_id(r: &Request, salt: u64) -> [u8; 16] {
    if let Some(id) = r.trace_parent.as_deref().and_then(parent_trace_id) {
        return id;
    }
    let (start, conn, exchange) = r.order;
    let a = mix(salt ^ start);
    let b = mix(a ^ ((conn as u64) << 32 | exchange as u64) ^ r.start_ns.rotate_left(17));
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&a.to_be_bytes());
    id[8..].copy_from_slice(&b.to_be_bytes());
    if id == [0; 16] {
        id[15] = 1;
    }
    id
}

/// The trace id of a W3C `traceparent` value (checked as the OTLP export checks it).
pub fn parent_trace_id(tp: &str) -> Option<[u8; 16]> {
    crate::otlp::ids::parse_traceparent(tp).map(|t| t.trace_id)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// splitmix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use collector::stitch::PointKind;

    #[test]
    fn a_carried_traceparent_names_the_trace_and_others_differ_per_request() {
        let mut a = Request::at_point(0, PointKind::ClientRead, 1, "c", vec![1, 2]);
        let mut b = a.clone();
        b.order = (1, 0, 1);
        assert_ne!(trace_id(&a, 7), trace_id(&b, 7));
        assert_ne!(trace_id(&a, 7), trace_id(&a, 8));
        a.trace_parent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
        assert_eq!(hex(&trace_id(&a, 7)), "4bf92f3577b34da6a3ce929d0e0e4736");
    }
}
