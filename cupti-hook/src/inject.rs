//! What CUDA_INJECTION64_PATH runs: InitializeInjection dlopens libcupti, claims the CUPTI
//! subscriber slot, enables activity kinds and wires the buffers to the socket thread.
//! Every failure is one stderr line (and a HookError on the socket); the host always runs on.

use std::alloc::{self, Layout};
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::unix::net::UnixStream;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::bindings::{self as b, CuptiResult};
use crate::parse::BufferParser;
use crate::sender::ActivitySender;
use crate::wire::{self, hook_message::Body};

/// Path of the collector's Unix socket (`HookListener::bind`).
pub const ENV_SOCKET: &str = "TOKENSCOPE_CUPTI_SOCKET";
/// libcupti to dlopen instead of the normal search for libcupti.so.12 / libcupti.so.
pub const ENV_CUPTI_LIB: &str = "TOKENSCOPE_CUPTI_LIB";
/// Records the queue holds before the hook drops (default `DEFAULT_QUEUE_RECORDS`).
pub const ENV_QUEUE_RECORDS: &str = "TOKENSCOPE_CUPTI_QUEUE";
pub const DEFAULT_QUEUE_RECORDS: usize = 65_536;
/// "kernel" (default: kernels, memcpy, NVTX; graph traces if CUPTI combines them) or "graph"
/// (graph launches and NVTX first; kernels and memcpy if CUPTI combines them).
pub const ENV_MODE: &str = "TOKENSCOPE_CUPTI_MODE";
/// Activity buffer handed to CUPTI (CUPTI's samples use 8 MiB; 4 MiB ~ 20k kernels).
const BUFFER_BYTES: usize = 4 << 20;
const BUFFER_ALIGN: usize = 8;
/// Longest the host's exit waits for the last records to leave.
const EXIT_FLUSH: Duration = Duration::from_secs(2);
const LOG_PREFIX: &str = "tokenscope-cupti-hook";
/// cuptiGetVersion values whose record layouts bindings.rs is meant for: CUDA 12.0 (19)
/// through 12.9 Update 1 (28, the headers tests/layout.rs checks against).
const CHECKED_CUPTI_VERSIONS: std::ops::RangeInclusive<u32> = 19..=28;

/// Every CUPTI entry point the hook looks up (tests check libcupti.so.12 exports them all).
pub const CUPTI_SYMBOLS: &[&str] = &[
    "cuptiGetVersion",
    "cuptiGetResultString",
    "cuptiSubscribe",
    "cuptiUnsubscribe",
    "cuptiActivityEnable",
    "cuptiActivityRegisterCallbacks",
    "cuptiActivityRegisterTimestampCallback",
    "cuptiGetTimestamp",
    "cuptiActivityGetNextRecord",
    "cuptiActivityFlushAll",
    "cuptiActivityGetNumDroppedRecords",
    "cuptiActivityFlushPeriod",
];

/// How often CUPTI's worker hands over buffers: without it a 4 MiB buffer arrives when full
/// (minutes on a decode loop) or at exit, and a live recording sees no GPU time until then.
const FLUSH_PERIOD_MS: u32 = 200;

struct CuptiApi {
    activity_get_next_record: b::ActivityGetNextRecordFn,
    activity_flush_all: b::ActivityFlushAllFn,
    activity_get_num_dropped_records: Option<b::ActivityGetNumDroppedRecordsFn>,
}

struct Hook {
    sender: ActivitySender,
    parser: Mutex<BufferParser>,
}

/// Set once the socket thread runs; CUPTI's entry points once resolved, before any
/// callback is registered, so no completed buffer can find either missing.
static HOOK: OnceLock<Hook> = OnceLock::new();
static API: OnceLock<CuptiApi> = OnceLock::new();
static STARTED: AtomicBool = AtomicBool::new(false);

/// The entry point CUDA calls after loading CUDA_INJECTION64_PATH. Returns 1 always: a
/// profiler that cannot start must not fail the engine's CUDA init.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> i32 {
    if STARTED.swap(true, Ordering::SeqCst) {
        return 1;
    }
    if std::panic::catch_unwind(initialize).is_err() {
        eprintln!("{LOG_PREFIX}: internal error during start; GPU activity will not be recorded");
    }
    1
}

fn initialize() {
    let Some(path) = std::env::var_os(ENV_SOCKET) else {
        eprintln!("{LOG_PREFIX}: {ENV_SOCKET} is not set; hook idle, GPU activity not recorded");
        return;
    };
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "{LOG_PREFIX}: cannot connect to collector at {}: {e}; hook idle",
                path.to_string_lossy()
            );
            return;
        }
    };
    let capacity = std::env::var(ENV_QUEUE_RECORDS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_QUEUE_RECORDS);
    let sender = match ActivitySender::start(stream, capacity) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{LOG_PREFIX}: cannot start its socket thread: {e}; hook idle");
            return;
        }
    };
    let hook = HOOK.get_or_init(|| Hook {
        sender,
        parser: Mutex::new(BufferParser::new(0)),
    });
    match start_cupti(hook) {
        Ok(hello) => {
            hook.sender.control(Body::Hello(hello), EXIT_FLUSH);
            // SAFETY: at_exit is a plain extern "C" fn with no captured state.
            unsafe { libc::atexit(at_exit) };
        }
        Err(err) => {
            eprintln!("{}", err.message);
            hook.sender.control(Body::Error(err), EXIT_FLUSH);
            hook.sender.flush(EXIT_FLUSH);
        }
    }
}

/// Sets CUPTI up; on the first refusal returns the one line to report.
fn start_cupti(hook: &Hook) -> Result<wire::Hello, wire::HookError> {
    let lib = open_libcupti()?;
    let sym = |name: &str| lib.symbol(name);
    macro_rules! need {
        ($name:literal, $ty:ty) => {
            match sym($name) {
                // SAFETY: the symbol is CUPTI's entry point with this signature (bindings.rs).
                Some(p) => unsafe { std::mem::transmute::<*mut c_void, $ty>(p) },
                None => return Err(missing_symbol($name, &lib.path)),
            }
        };
    }
    macro_rules! want {
        ($name:literal, $ty:ty) => {
            // SAFETY: as above; absent in older CUPTI versions.
            sym($name).map(|p| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
        };
    }
    let get_version = need!("cuptiGetVersion", b::GetVersionFn);
    let get_result_string = want!("cuptiGetResultString", b::GetResultStringFn);
    let subscribe = need!("cuptiSubscribe", b::SubscribeFn);
    let unsubscribe = need!("cuptiUnsubscribe", b::UnsubscribeFn);
    let activity_enable = need!("cuptiActivityEnable", b::ActivityEnableFn);
    let register_callbacks = need!(
        "cuptiActivityRegisterCallbacks",
        b::ActivityRegisterCallbacksFn
    );
    let register_timestamp = want!(
        "cuptiActivityRegisterTimestampCallback",
        b::ActivityRegisterTimestampCallbackFn
    );
    let get_timestamp = need!("cuptiGetTimestamp", b::GetTimestampFn);
    let flush_period = want!("cuptiActivityFlushPeriod", b::ActivityFlushPeriodFn);
    let api = CuptiApi {
        activity_get_next_record: need!("cuptiActivityGetNextRecord", b::ActivityGetNextRecordFn),
        activity_flush_all: need!("cuptiActivityFlushAll", b::ActivityFlushAllFn),
        activity_get_num_dropped_records: want!(
            "cuptiActivityGetNumDroppedRecords",
            b::ActivityGetNumDroppedRecordsFn
        ),
    };
    let refused = |call: &str, r: CuptiResult| cupti_error(call, r, get_result_string);

    let mut version = 0u32;
    // SAFETY: CUPTI entry points called with valid out-pointers, as documented.
    unsafe {
        let r = get_version(&mut version);
        if r != b::CUPTI_SUCCESS {
            return Err(refused("cuptiGetVersion", r));
        }
        // Claims the one subscriber slot CUPTI allows per process, so a conflict shows here.
        let mut subscriber: *mut c_void = ptr::null_mut();
        let r = subscribe(&mut subscriber, no_op_callback, ptr::null_mut());
        if r != b::CUPTI_SUCCESS {
            return Err(refused("cuptiSubscribe", r));
        }
        let fail = |call: &str, r: CuptiResult| {
            unsubscribe(subscriber);
            refused(call, r)
        };
        let (clock_source, offset_ns) = match register_timestamp.map(|f| f(monotonic_ns)) {
            Some(b::CUPTI_SUCCESS) => ("timestamp-callback", 0),
            _ => ("paired-readings", paired_offset(get_timestamp)),
        };
        if let Ok(mut parser) = hook.parser.lock() {
            parser.set_offset(offset_ns);
        }
        let _ = API.set(api);
        let r = register_callbacks(buffer_requested, buffer_completed);
        if r != b::CUPTI_SUCCESS {
            return Err(fail("cuptiActivityRegisterCallbacks", r));
        }
        let mut enabled = Vec::new();
        let mut notes = Vec::new();
        let (required, optional) = activity_plan();
        for &kind in required {
            let r = activity_enable(kind);
            if r != b::CUPTI_SUCCESS {
                let call = format!("cuptiActivityEnable({})", kind_name(kind));
                return Err(fail(&call, r));
            }
            enabled.push(kind);
        }
        for &kind in optional {
            match activity_enable(kind) {
                b::CUPTI_SUCCESS => enabled.push(kind),
                r => notes.push(format!(
                    "{} not enabled ({}){}",
                    kind_name(kind),
                    b::result_name(r),
                    if kind == b::KIND_GRAPH_TRACE {
                        "; graph kernels carry graph_id"
                    } else {
                        ""
                    }
                )),
            }
        }
        match flush_period.map(|f| f(FLUSH_PERIOD_MS)) {
            Some(b::CUPTI_SUCCESS) => {}
            Some(r) => notes.push(format!(
                "cuptiActivityFlushPeriod refused ({}): records arrive when a buffer fills",
                b::result_name(r)
            )),
            None => notes.push(
                "no cuptiActivityFlushPeriod: records arrive when a buffer fills".to_string(),
            ),
        }
        if !(CHECKED_CUPTI_VERSIONS).contains(&version) {
            notes.push(format!(
                "CUPTI API version {version} is outside the layouts checked ({}..={}, CUDA 12.x); records may be misread",
                CHECKED_CUPTI_VERSIONS.start(),
                CHECKED_CUPTI_VERSIONS.end()
            ));
        }
        let cupti_path = loaded_path(get_version as *const c_void).unwrap_or(lib.path.clone());
        if std::env::var_os(ENV_NVTX_INJECTION).is_none_or(|v| v.is_empty()) {
            notes.push(format!(
                "NVTX ranges need {ENV_NVTX_INJECTION}={cupti_path} in the engine's environment"
            ));
        }
        let hello = wire::Hello {
            wire_version: wire::WIRE_VERSION,
            pid: std::process::id(),
            clock: wire::CLOCK_MONOTONIC_NAME.into(),
            clock_source: clock_source.into(),
            cupti_version: version,
            enabled_kinds: enabled,
            notes,
            cupti_path,
        };
        std::mem::forget(lib); // CUPTI stays loaded for the life of the process.
        Ok(hello)
    }
}

/// (must enable, try to enable). Graph-level traces (CUPTI 11.7+) may refuse to combine with
/// kernel records (CUPTI_ERROR_NOT_COMPATIBLE); `TOKENSCOPE_CUPTI_MODE=graph` puts them first.
fn activity_plan() -> (&'static [b::ActivityKind], &'static [b::ActivityKind]) {
    match std::env::var(ENV_MODE).as_deref() {
        Ok("graph") => (
            &[b::KIND_GRAPH_TRACE, b::KIND_MARKER],
            &[b::KIND_CONCURRENT_KERNEL, b::KIND_MEMCPY],
        ),
        _ => (
            &[b::KIND_CONCURRENT_KERNEL, b::KIND_MEMCPY, b::KIND_MARKER],
            &[b::KIND_GRAPH_TRACE],
        ),
    }
}

fn kind_name(kind: b::ActivityKind) -> &'static str {
    match kind {
        b::KIND_CONCURRENT_KERNEL => "CONCURRENT_KERNEL",
        b::KIND_MEMCPY => "MEMCPY",
        b::KIND_MARKER => "MARKER",
        b::KIND_GRAPH_TRACE => "GRAPH_TRACE",
        _ => "?",
    }
}

fn cupti_error(
    call: &str,
    r: CuptiResult,
    get_result_string: Option<b::GetResultStringFn>,
) -> wire::HookError {
    let why = match r {
        b::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            "another CUPTI subscriber (a profiler such as Nsight or the PyTorch profiler) holds this process"
        }
        b::CUPTI_ERROR_NOT_INITIALIZED => "the CUDA driver is not available (no driver or no GPU)",
        b::CUPTI_ERROR_INSUFFICIENT_PRIVILEGES => "GPU profiling needs privileges (NVreg_RestrictProfilingToAdminUsers)",
        _ => "CUPTI refused",
    };
    let mut detail = String::new();
    if let Some(f) = get_result_string {
        let mut s: *const c_char = ptr::null();
        // SAFETY: valid out-pointer; CUPTI returns a static string.
        if unsafe { f(r, &mut s) } == b::CUPTI_SUCCESS && !s.is_null() {
            // SAFETY: non-null, and CUPTI's result strings are static and NUL-terminated.
            detail = format!(" [{}]", unsafe { CStr::from_ptr(s) }.to_string_lossy());
        }
    }
    wire::HookError {
        message: format!(
            "{LOG_PREFIX}: {call} returned {} ({r}){detail}: {why}; GPU activity will not be recorded, the process runs on",
            b::result_name(r)
        ),
        cupti_result: r,
        call: call.into(),
    }
}

fn missing_symbol(name: &str, path: &str) -> wire::HookError {
    wire::HookError {
        message: format!("{LOG_PREFIX}: {path} lacks {name}; GPU activity will not be recorded, the process runs on"),
        cupti_result: 0,
        call: "dlsym".into(),
    }
}

/// NVTX hands its calls to the library this names; CUPTI records NVTX only when it is libcupti.
pub const ENV_NVTX_INJECTION: &str = "NVTX_INJECTION64_PATH";

/// The file a loaded symbol came from (dladdr), e.g. the libcupti the search found.
fn loaded_path(symbol: *const c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data (pointers and integers); all zeroes is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address; info is a valid out-pointer.
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

struct Library {
    handle: *mut c_void,
    path: String,
}

impl Library {
    fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let c = CString::new(name).ok()?;
        // SAFETY: handle came from dlopen and is never closed.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

fn open_libcupti() -> Result<Library, wire::HookError> {
    let candidates: Vec<String> = match std::env::var(ENV_CUPTI_LIB) {
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec!["libcupti.so.12".into(), "libcupti.so".into()],
    };
    let mut errors = Vec::new();
    for path in &candidates {
        let c = CString::new(path.as_str()).unwrap_or_default();
        // SAFETY: plain dlopen of a path; RTLD_NOW so a broken library fails here, not later.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            return Ok(Library {
                handle,
                path: path.clone(),
            });
        }
        // SAFETY: dlerror returns a thread-local string or null.
        let e = unsafe { libc::dlerror() };
        if !e.is_null() {
            // SAFETY: non-null: dlerror's NUL-terminated message, read before the next dl call.
            errors.push(unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned());
        }
    }
    Err(wire::HookError {
        message: format!(
            "{LOG_PREFIX}: libcupti not found ({}; set {ENV_CUPTI_LIB}); GPU activity will not be recorded, the process runs on",
            errors.join("; ")
        ),
        cupti_result: 0,
        call: "dlopen".into(),
    })
}

/// CUPTI's timestamp callback: CLOCK_MONOTONIC, the clock every tokenscope source shares.
unsafe extern "C" fn monotonic_ns() -> u64 {
    tokenscope_clock::monotonic_ns()
}

/// CLOCK_MONOTONIC - CUPTI clock, from a CUPTI reading bracketed by two monotonic ones.
fn paired_offset(get_timestamp: b::GetTimestampFn) -> i64 {
    let before = tokenscope_clock::monotonic_ns();
    let mut cupti = 0u64;
    // SAFETY: valid out-pointer.
    unsafe { get_timestamp(&mut cupti) };
    let after = tokenscope_clock::monotonic_ns();
    (before / 2 + after / 2) as i64 - cupti as i64
}

unsafe extern "C" fn no_op_callback(_: *mut c_void, _: u32, _: u32, _: *const c_void) {}

fn buffer_layout() -> Layout {
    Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).expect("constant layout is valid")
}

unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    // SAFETY: the layout has a non-zero size; CUPTI passes three valid out-pointers.
    unsafe {
        let p = alloc::alloc(buffer_layout());
        *buffer = p;
        *size = if p.is_null() { 0 } else { BUFFER_BYTES };
        *max = 0; // as many records as fit
    }
}

unsafe extern "C" fn buffer_completed(
    context: *mut c_void,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid: usize,
) {
    if buffer.is_null() {
        return;
    }
    if let (Some(hook), Some(api)) = (HOOK.get(), API.get()) {
        let result = std::panic::catch_unwind(|| {
            if let Ok(mut parser) = hook.parser.lock() {
                let next = api.activity_get_next_record;
                // SAFETY: CUPTI completed `buffer` with `valid` bytes of records.
                unsafe { parser.parse(next, buffer, valid, &mut |r| hook.sender.push(r)) };
            }
            if let Some(get_dropped) = api.activity_get_num_dropped_records {
                let mut dropped = 0usize;
                // SAFETY: the context and stream CUPTI passed in; a valid out-pointer.
                if unsafe { get_dropped(context, stream_id, &mut dropped) } == b::CUPTI_SUCCESS {
                    hook.sender
                        .counters
                        .cupti_dropped
                        .fetch_add(dropped as u64, Ordering::Relaxed);
                }
            }
        });
        if result.is_err() {
            eprintln!("{LOG_PREFIX}: internal error parsing a CUPTI buffer; records lost");
        }
    }
    if size == BUFFER_BYTES {
        // SAFETY: buffers of this size are the ones buffer_requested allocated with this layout.
        unsafe { alloc::dealloc(buffer, buffer_layout()) };
    }
}

extern "C" fn at_exit() {
    if let (Some(hook), Some(api)) = (HOOK.get(), API.get()) {
        // SAFETY: CUPTI is loaded and initialised (at_exit is registered after enable succeeded).
        unsafe { (api.activity_flush_all)(b::FLUSH_FORCED) };
        hook.sender.flush(EXIT_FLUSH);
    }
}

/// Flushes CUPTI's buffers and the queue now (the engine or a test may call this through
/// dlsym; CUDA never does). Returns 1 when everything queued was written within 2 s.
#[no_mangle]
pub extern "C" fn tokenscope_cupti_flush() -> i32 {
    match (HOOK.get(), API.get()) {
        (Some(hook), Some(api)) => {
            // SAFETY: CUPTI is loaded; flushing before any activity is harmless.
            unsafe { (api.activity_flush_all)(b::FLUSH_FORCED) };
            i32::from(hook.sender.flush(EXIT_FLUSH))
        }
        _ => 0,
    }
}
