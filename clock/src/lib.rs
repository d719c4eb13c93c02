//! CLOCK_MONOTONIC nanoseconds, the one clock of tokenscope: bpf_ktime_get_ns reads it,
//! and the collector, the NVML sampler, the CUPTI hook and the lab stamp with it too
//! (DESIGN.md section 7), so their events line up without conversion.

/// Now on CLOCK_MONOTONIC, in nanoseconds (what bpf_ktime_get_ns returns).
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Now on CLOCK_REALTIME, in nanoseconds: read once beside `monotonic_ns` so a
/// recording's start can be shown as wall time.
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clocks always exist on Linux.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime({clock}) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_never_goes_back_and_realtime_is_past_2020() {
        let (a, b) = (monotonic_ns(), monotonic_ns());
        assert!(b >= a, "CLOCK_MONOTONIC went back: {a} then {b}");
        assert!(
            realtime_ns() > 1_577_836_800 * 1_000_000_000,
            "CLOCK_REALTIME reads a time after 2020-01-01"
        );
    }
}
