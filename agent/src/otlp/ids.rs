//! Trace and span ids: the W3C `traceparent` a request carried, else random ones.

/// The trace a request's spans belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TraceContext {
    pub(crate) trace_id: [u8; 16],
    /// The caller's span (the application's own), when the request carried one.
    pub(crate) parent: Option<[u8; 8]>,
    /// W3C trace flags (bit 0: sampled).
    pub(crate) flags: u8,
}

impl TraceContext {
    /// The trace of `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), else a new one.
    pub(crate) fn of(traceparent: Option<&str>) -> TraceContext {
        traceparent
            .and_then(parse_traceparent)
            .unwrap_or_else(|| TraceContext::fresh(random()))
    }

    /// Trace `trace_id` (one the agent chose, e.g. to name it in a metric's exemplar),
    /// under the caller's span when `traceparent` names the same trace.
    pub(crate) fn given(trace_id: [u8; 16], traceparent: Option<&str>) -> TraceContext {
        match traceparent.and_then(parse_traceparent) {
            Some(t) if t.trace_id == trace_id => t,
            _ => TraceContext::fresh(trace_id),
        }
    }

    fn fresh(trace_id: [u8; 16]) -> TraceContext {
        TraceContext {
            trace_id,
            parent: None,
            // Sampled: tokenscope exports every request it stitched.
            flags: 1,
        }
    }
}

/// The collector keeps only values of this shape; checked again here so a hand-built
/// request cannot put a malformed id on the wire (all-zero ids are invalid).
pub(crate) fn parse_traceparent(v: &str) -> Option<TraceContext> {
    let mut parts = v.split('-');
    let version = parts.next()?;
    let (trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?);
    // Version 00 has exactly four fields; later versions may append more.
    if version.len() != 2
        || version.eq_ignore_ascii_case("ff")
        || (version == "00" && parts.next().is_some())
    {
        return None;
    }
    let trace_id: [u8; 16] = hex(trace)?;
    let parent: [u8; 8] = hex(parent)?;
    let [flags] = hex::<1>(flags)?;
    (trace_id != [0; 16] && parent != [0; 8]).then_some(TraceContext {
        trace_id,
        parent: Some(parent),
        flags,
    })
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// `N` random bytes, never all zero (a zero trace or span id is invalid in OTLP).
pub(crate) fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    fill_random(&mut b);
    if b.iter().all(|&x| x == 0) {
        b[N - 1] = 1;
    }
    b
}

fn fill_random(buf: &mut [u8]) {
    // SAFETY: `buf` is valid for writes of its length; getrandom writes at most that.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(n).is_ok_and(|n| n == buf.len()) {
        return;
    }
    use std::io::Read;
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .is_ok()
    {
        return;
    }
    // Neither source: ids need only be unique, so a counter mixed with the clock does.
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut x =
        collector::clock::monotonic_ns() ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32);
    for chunk in buf.chunks_mut(8) {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_traceparent_gives_its_trace_and_parent() {
        let t = TraceContext::of(Some(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ));
        assert_eq!(
            t.trace_id,
            [
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36
            ]
        );
        assert_eq!(
            t.parent,
            Some([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7])
        );
        assert_eq!(t.flags, 1);
    }

    #[test]
    fn a_malformed_or_zero_traceparent_starts_a_new_trace() {
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
            "garbage",
        ] {
            let t = TraceContext::of(Some(bad));
            assert_eq!(t.parent, None, "{bad} is not joined");
            assert_ne!(t.trace_id, [0; 16], "{bad}: a fresh, non-zero trace id");
        }
    }

    #[test]
    fn a_given_trace_keeps_the_callers_span_only_when_it_is_the_callers_trace() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let carried = TraceContext::of(Some(tp));
        assert_eq!(TraceContext::given(carried.trace_id, Some(tp)), carried);
        let other = TraceContext::given([7; 16], Some(tp));
        assert_eq!((other.trace_id, other.parent), ([7; 16], None));
        assert_eq!(TraceContext::given([7; 16], None).parent, None);
    }

    #[test]
    fn random_ids_are_never_zero_and_differ() {
        let a: [u8; 8] = random();
        let b: [u8; 8] = random();
        assert_ne!(a, [0; 8]);
        assert_ne!(a, b, "two random span ids differ");
    }
}
