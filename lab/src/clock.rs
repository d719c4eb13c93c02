//! CLOCK_MONOTONIC nanoseconds, the one clock of tokenscope (bpf_ktime_get_ns reads it too).

/// Current CLOCK_MONOTONIC time in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds as fractional milliseconds, for reports.
pub fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}
