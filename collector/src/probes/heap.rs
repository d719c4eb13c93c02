//! The loader's memory: aya parses the kernel's BTF while the probes load, the
//! largest heap `record` and `top` ever hold; what it takes is given back before the
//! ring buffer is mapped.

/// While the probes load, every allocation of 128 KiB or more is a mapping of its own
/// (glibc's `M_MMAP_THRESHOLD`, fixed): the BTF's type table grows by `realloc`, which
/// for a mapping is `mremap` (the table moved, never held twice), and each such block
/// goes back to the kernel when freed. With glibc's dynamic threshold the loader's
/// heap peaked at 24.7 MB of anonymous memory and `record`'s RSS at 31.2 MB before
/// the first event, most of issue 17's 32 MB; with this, 24.8-25.0 MB (the ring and
/// the binary, mapped after the load). After loading the threshold is left where the
/// dynamic one had risen to by then (freed blocks raise it; the BTF's were ~9 MB) and
/// the trim threshold at twice that, so the recorder runs with the allocation pattern
/// it was measured with.
pub(super) struct LoadingAllocations;

#[cfg(target_env = "gnu")]
const MMAP_THRESHOLD_LOADING: i32 = 128 << 10;
#[cfg(target_env = "gnu")]
const MMAP_THRESHOLD_AFTER: i32 = 8 << 20;

impl LoadingAllocations {
    pub(super) fn start() -> LoadingAllocations {
        #[cfg(target_env = "gnu")]
        // SAFETY: mallopt only changes glibc's policy for later allocations.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_LOADING);
        }
        LoadingAllocations
    }
}

impl Drop for LoadingAllocations {
    fn drop(&mut self) {
        #[cfg(target_env = "gnu")]
        // SAFETY: as in `start`.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_AFTER);
            // Fixing one threshold stops glibc moving the other: the trim threshold as
            // the dynamic rule sets it (twice the mmap threshold), not its 128 KiB start.
            libc::mallopt(libc::M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_AFTER);
        }
    }
}

/// Returns free heap pages to the kernel: glibc keeps what is not at the top of a
/// heap mapped. After loading (aya's loader parses the kernel's BTF, 19 MB of heap for
/// a 5.5 MB vmlinux, to relocate the probes), before the ring is mapped; `top` after
/// each pass (what a pass built over the window, in its thread's arena).
pub fn give_back_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; no pointer changes.
    unsafe {
        libc::malloc_trim(0);
    }
}
