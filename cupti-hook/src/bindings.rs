//! Hand-written CUPTI 12.x ABI: the entry points the hook resolves with dlsym and the
//! activity records it reads. tests/layout.rs checks every offset in `RECORD_LAYOUT` and
//! every constant in `CONSTANTS` against the real cupti.h from the nvidia-cuda-cupti-cu12 wheel.
//! Records are `__packed__` + `aligned(8)` in C: mirrored as `repr(C, packed)` and read with
//! `read_unaligned`.

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

pub type CuptiResult = u32;
pub const CUPTI_SUCCESS: CuptiResult = 0;
pub const CUPTI_ERROR_INVALID_PARAMETER: CuptiResult = 1;
pub const CUPTI_ERROR_MAX_LIMIT_REACHED: CuptiResult = 12;
pub const CUPTI_ERROR_NOT_COMPATIBLE: CuptiResult = 14;
pub const CUPTI_ERROR_NOT_INITIALIZED: CuptiResult = 15;
pub const CUPTI_ERROR_NOT_SUPPORTED: CuptiResult = 27;
pub const CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: CuptiResult = 35;
pub const CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: CuptiResult = 39;

pub type ActivityKind = u32;
pub const KIND_MEMCPY: ActivityKind = 1;
pub const KIND_CONCURRENT_KERNEL: ActivityKind = 10;
pub const KIND_MARKER: ActivityKind = 12;
pub const KIND_GRAPH_TRACE: ActivityKind = 51;

pub const FLAG_MARKER_INSTANTANEOUS: u32 = 1 << 0;
pub const FLAG_MARKER_START: u32 = 1 << 1;
pub const FLAG_MARKER_END: u32 = 1 << 2;

/// cuptiActivityFlushAll flag: deliver incomplete buffers too.
pub const FLUSH_FORCED: u32 = 1;

pub type BufferRequestedFn =
    unsafe extern "C" fn(buffer: *mut *mut u8, size: *mut usize, max_num_records: *mut usize);
pub type BufferCompletedFn = unsafe extern "C" fn(
    context: *mut c_void,
    stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid_size: usize,
);
pub type TimestampFn = unsafe extern "C" fn() -> u64;
pub type CallbackFn =
    unsafe extern "C" fn(userdata: *mut c_void, domain: u32, cbid: u32, cbdata: *const c_void);

// Entry-point signatures, as in cupti_activity.h / cupti_callbacks.h / cupti_version.h.
pub type GetVersionFn = unsafe extern "C" fn(version: *mut u32) -> CuptiResult;
pub type GetResultStringFn =
    unsafe extern "C" fn(result: CuptiResult, out: *mut *const c_char) -> CuptiResult;
pub type SubscribeFn = unsafe extern "C" fn(
    subscriber: *mut *mut c_void,
    callback: CallbackFn,
    userdata: *mut c_void,
) -> CuptiResult;
pub type UnsubscribeFn = unsafe extern "C" fn(subscriber: *mut c_void) -> CuptiResult;
pub type ActivityEnableFn = unsafe extern "C" fn(kind: ActivityKind) -> CuptiResult;
pub type ActivityRegisterCallbacksFn =
    unsafe extern "C" fn(requested: BufferRequestedFn, completed: BufferCompletedFn) -> CuptiResult;
pub type ActivityRegisterTimestampCallbackFn =
    unsafe extern "C" fn(timestamp: TimestampFn) -> CuptiResult;
pub type ActivityGetNextRecordFn =
    unsafe extern "C" fn(buffer: *mut u8, valid_size: usize, record: *mut *mut u8) -> CuptiResult;
pub type ActivityFlushAllFn = unsafe extern "C" fn(flag: u32) -> CuptiResult;
pub type ActivityFlushPeriodFn = unsafe extern "C" fn(time_ms: u32) -> CuptiResult;
pub type ActivityGetNumDroppedRecordsFn =
    unsafe extern "C" fn(context: *mut c_void, stream_id: u32, dropped: *mut usize) -> CuptiResult;
pub type GetTimestampFn = unsafe extern "C" fn(timestamp: *mut u64) -> CuptiResult;

/// CUpti_ActivityKernel9 (CONCURRENT_KERNEL records since CUDA 12.0).
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct ActivityKernel9 {
    pub kind: u32,
    pub cache_config: u8,
    pub shared_memory_config: u8,
    pub registers_per_thread: u16,
    pub partitioned_global_cache_requested: u32,
    pub partitioned_global_cache_executed: u32,
    pub start: u64,
    pub end: u64,
    pub completed: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub static_shared_memory: i32,
    pub dynamic_shared_memory: i32,
    pub local_memory_per_thread: u32,
    pub local_memory_total: u32,
    pub correlation_id: u32,
    pub grid_id: i64,
    pub name: *const c_char,
    pub reserved0: *mut c_void,
    pub queued: u64,
    pub submitted: u64,
    pub launch_type: u8,
    pub is_shared_memory_carveout_requested: u8,
    pub shared_memory_carveout_requested: u8,
    pub padding: u8,
    pub shared_memory_executed: u32,
    pub graph_node_id: u64,
    pub shmem_limit_config: u32,
    pub graph_id: u32,
    pub p_access_policy_window: *mut c_void,
    pub channel_id: u32,
    pub channel_type: u32,
    pub cluster: [u32; 3],
    pub cluster_scheduling_policy: u32,
    pub local_memory_total_v2: u64,
    pub max_potential_cluster_size: u32,
    pub max_active_clusters: u32,
}
const _: () = assert!(size_of::<ActivityKernel9>() == 208);

/// CUpti_ActivityMemcpy6.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct ActivityMemcpy6 {
    pub kind: u32,
    pub copy_kind: u8,
    pub src_kind: u8,
    pub dst_kind: u8,
    pub flags: u8,
    pub bytes: u64,
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub runtime_correlation_id: u32,
    pub pad: u32,
    pub reserved0: *mut c_void,
    pub graph_node_id: u64,
    pub graph_id: u32,
    pub channel_id: u32,
    pub channel_type: u32,
    pub pad2: u32,
    pub copy_count: u64,
}
const _: () = assert!(size_of::<ActivityMemcpy6>() == 96);

/// CUpti_ActivityGraphTrace2 (not packed in C: natural layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ActivityGraphTrace2 {
    pub kind: u32,
    pub correlation_id: u32,
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub graph_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub reserved: *mut c_void,
    pub end_device_id: u32,
    pub end_context_id: u32,
}
const _: () = assert!(size_of::<ActivityGraphTrace2>() == 56);

/// CUpti_ActivityMarker2 (NVTX). Range start and end arrive as two records sharing `id`;
/// only the start carries name and domain.
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct ActivityMarker2 {
    pub kind: u32,
    pub flags: u32,
    pub timestamp: u64,
    pub id: u32,
    pub object_kind: u32,
    pub object_id: [u32; 3],
    pub pad: u32,
    pub name: *const c_char,
    pub domain: *const c_char,
}
const _: () = assert!(size_of::<ActivityMarker2>() == 56);

/// (C struct.field, Rust offset) for every field the hook reads, plus sizes.
pub const RECORD_LAYOUT: &[(&str, usize)] = &[
    ("CUpti_ActivityKernel9.sizeof", size_of::<ActivityKernel9>()),
    (
        "CUpti_ActivityKernel9.kind",
        offset_of!(ActivityKernel9, kind),
    ),
    (
        "CUpti_ActivityKernel9.start",
        offset_of!(ActivityKernel9, start),
    ),
    (
        "CUpti_ActivityKernel9.end",
        offset_of!(ActivityKernel9, end),
    ),
    (
        "CUpti_ActivityKernel9.deviceId",
        offset_of!(ActivityKernel9, device_id),
    ),
    (
        "CUpti_ActivityKernel9.contextId",
        offset_of!(ActivityKernel9, context_id),
    ),
    (
        "CUpti_ActivityKernel9.streamId",
        offset_of!(ActivityKernel9, stream_id),
    ),
    (
        "CUpti_ActivityKernel9.gridX",
        offset_of!(ActivityKernel9, grid),
    ),
    (
        "CUpti_ActivityKernel9.blockX",
        offset_of!(ActivityKernel9, block),
    ),
    (
        "CUpti_ActivityKernel9.correlationId",
        offset_of!(ActivityKernel9, correlation_id),
    ),
    (
        "CUpti_ActivityKernel9.name",
        offset_of!(ActivityKernel9, name),
    ),
    (
        "CUpti_ActivityKernel9.graphId",
        offset_of!(ActivityKernel9, graph_id),
    ),
    (
        "CUpti_ActivityKernel9.clusterX",
        offset_of!(ActivityKernel9, cluster),
    ),
    (
        "CUpti_ActivityKernel9.maxActiveClusters",
        offset_of!(ActivityKernel9, max_active_clusters),
    ),
    ("CUpti_ActivityMemcpy6.sizeof", size_of::<ActivityMemcpy6>()),
    (
        "CUpti_ActivityMemcpy6.copyKind",
        offset_of!(ActivityMemcpy6, copy_kind),
    ),
    (
        "CUpti_ActivityMemcpy6.bytes",
        offset_of!(ActivityMemcpy6, bytes),
    ),
    (
        "CUpti_ActivityMemcpy6.start",
        offset_of!(ActivityMemcpy6, start),
    ),
    (
        "CUpti_ActivityMemcpy6.end",
        offset_of!(ActivityMemcpy6, end),
    ),
    (
        "CUpti_ActivityMemcpy6.deviceId",
        offset_of!(ActivityMemcpy6, device_id),
    ),
    (
        "CUpti_ActivityMemcpy6.streamId",
        offset_of!(ActivityMemcpy6, stream_id),
    ),
    (
        "CUpti_ActivityMemcpy6.correlationId",
        offset_of!(ActivityMemcpy6, correlation_id),
    ),
    (
        "CUpti_ActivityMemcpy6.graphId",
        offset_of!(ActivityMemcpy6, graph_id),
    ),
    (
        "CUpti_ActivityMemcpy6.copyCount",
        offset_of!(ActivityMemcpy6, copy_count),
    ),
    (
        "CUpti_ActivityGraphTrace2.sizeof",
        size_of::<ActivityGraphTrace2>(),
    ),
    (
        "CUpti_ActivityGraphTrace2.correlationId",
        offset_of!(ActivityGraphTrace2, correlation_id),
    ),
    (
        "CUpti_ActivityGraphTrace2.start",
        offset_of!(ActivityGraphTrace2, start),
    ),
    (
        "CUpti_ActivityGraphTrace2.end",
        offset_of!(ActivityGraphTrace2, end),
    ),
    (
        "CUpti_ActivityGraphTrace2.deviceId",
        offset_of!(ActivityGraphTrace2, device_id),
    ),
    (
        "CUpti_ActivityGraphTrace2.graphId",
        offset_of!(ActivityGraphTrace2, graph_id),
    ),
    (
        "CUpti_ActivityGraphTrace2.streamId",
        offset_of!(ActivityGraphTrace2, stream_id),
    ),
    ("CUpti_ActivityMarker2.sizeof", size_of::<ActivityMarker2>()),
    (
        "CUpti_ActivityMarker2.flags",
        offset_of!(ActivityMarker2, flags),
    ),
    (
        "CUpti_ActivityMarker2.timestamp",
        offset_of!(ActivityMarker2, timestamp),
    ),
    ("CUpti_ActivityMarker2.id", offset_of!(ActivityMarker2, id)),
    (
        "CUpti_ActivityMarker2.name",
        offset_of!(ActivityMarker2, name),
    ),
    (
        "CUpti_ActivityMarker2.domain",
        offset_of!(ActivityMarker2, domain),
    ),
];

/// (C enumerator, value) for every constant above that CUPTI defines.
pub const CONSTANTS: &[(&str, u32)] = &[
    ("CUPTI_SUCCESS", CUPTI_SUCCESS),
    (
        "CUPTI_ERROR_INVALID_PARAMETER",
        CUPTI_ERROR_INVALID_PARAMETER,
    ),
    (
        "CUPTI_ERROR_MAX_LIMIT_REACHED",
        CUPTI_ERROR_MAX_LIMIT_REACHED,
    ),
    ("CUPTI_ERROR_NOT_COMPATIBLE", CUPTI_ERROR_NOT_COMPATIBLE),
    ("CUPTI_ERROR_NOT_INITIALIZED", CUPTI_ERROR_NOT_INITIALIZED),
    ("CUPTI_ERROR_NOT_SUPPORTED", CUPTI_ERROR_NOT_SUPPORTED),
    (
        "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
        CUPTI_ERROR_INSUFFICIENT_PRIVILEGES,
    ),
    (
        "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
        CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
    ),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", KIND_MEMCPY),
    (
        "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
        KIND_CONCURRENT_KERNEL,
    ),
    ("CUPTI_ACTIVITY_KIND_MARKER", KIND_MARKER),
    ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", KIND_GRAPH_TRACE),
    (
        "CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS",
        FLAG_MARKER_INSTANTANEOUS,
    ),
    ("CUPTI_ACTIVITY_FLAG_MARKER_START", FLAG_MARKER_START),
    ("CUPTI_ACTIVITY_FLAG_MARKER_END", FLAG_MARKER_END),
];

/// Names CUPTI's own headers use for the results the hook reports, for the one-line errors.
pub fn result_name(result: CuptiResult) -> &'static str {
    match result {
        CUPTI_SUCCESS => "CUPTI_SUCCESS",
        CUPTI_ERROR_INVALID_PARAMETER => "CUPTI_ERROR_INVALID_PARAMETER",
        CUPTI_ERROR_MAX_LIMIT_REACHED => "CUPTI_ERROR_MAX_LIMIT_REACHED",
        CUPTI_ERROR_NOT_COMPATIBLE => "CUPTI_ERROR_NOT_COMPATIBLE",
        CUPTI_ERROR_NOT_INITIALIZED => "CUPTI_ERROR_NOT_INITIALIZED",
        CUPTI_ERROR_NOT_SUPPORTED => "CUPTI_ERROR_NOT_SUPPORTED",
        CUPTI_ERROR_INSUFFICIENT_PRIVILEGES => "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
        CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => {
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
        }
        _ => "CUPTI error",
    }
}
