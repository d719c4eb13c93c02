//! Completed CUPTI buffers -> compact wire records, on CUPTI's thread: no I/O, no blocking.

use std::collections::HashMap;
use std::ffi::{c_char, CStr};
use std::ptr;
use std::sync::Arc;

use crate::bindings::{self as b, ActivityGetNextRecordFn};
use crate::wire::{self, activity::Record};

/// A record on its way to the socket thread. Kernel names travel as a shared `Arc<str>`
/// so a record costs no allocation; the socket thread sends each name once.
pub(crate) enum QueuedRecord {
    Kernel(wire::KernelRecord, Arc<str>),
    Other(Record),
}

/// Unpaired NVTX range starts survive across buffers until their end arrives.
struct OpenRange {
    start_ns: u64,
    name: String,
    domain: String,
}

pub(crate) struct BufferParser {
    /// Added to every CUPTI timestamp: 0 with the timestamp callback, the paired-readings
    /// offset (CLOCK_MONOTONIC - cuptiGetTimestamp) otherwise.
    offset_ns: i64,
    /// Kernel names by the pointer CUPTI hands out (stable for the module's lifetime).
    names: HashMap<usize, (u64, Arc<str>)>,
    open_ranges: HashMap<u32, OpenRange>,
}

impl BufferParser {
    pub(crate) fn new(offset_ns: i64) -> Self {
        BufferParser {
            offset_ns,
            names: HashMap::new(),
            open_ranges: HashMap::new(),
        }
    }

    pub(crate) fn set_offset(&mut self, offset_ns: i64) {
        self.offset_ns = offset_ns;
    }

    fn ts(&self, t: u64) -> u64 {
        t.saturating_add_signed(self.offset_ns)
    }

    /// Walks `buffer[..valid]` with cuptiActivityGetNextRecord and hands each record to `emit`.
    ///
    /// # Safety
    /// `buffer` must be a buffer CUPTI completed with `valid` bytes of records.
    pub(crate) unsafe fn parse(
        &mut self,
        next_record: ActivityGetNextRecordFn,
        buffer: *mut u8,
        valid: usize,
        emit: &mut dyn FnMut(QueuedRecord),
    ) {
        let mut record: *mut u8 = ptr::null_mut();
        // SAFETY: `buffer[..valid]` is a completed CUPTI buffer (the caller's contract);
        // `record` is an out-pointer CUPTI sets to the next record in it.
        while unsafe { next_record(buffer, valid, &mut record) } == b::CUPTI_SUCCESS
            && !record.is_null()
        {
            // SAFETY: `record` points at a whole record CUPTI wrote, starting with its kind.
            let kind = unsafe { ptr::read_unaligned(record as *const u32) };
            match kind {
                b::KIND_CONCURRENT_KERNEL => {
                    // SAFETY: a whole record of the kind this struct mirrors.
                    let k = unsafe { ptr::read_unaligned(record as *const b::ActivityKernel9) };
                    let (name_hash, name) = self.kernel_name(k.name);
                    let kernel = wire::KernelRecord {
                        start_ns: self.ts(k.start),
                        end_ns: self.ts(k.end),
                        device_id: k.device_id,
                        context_id: k.context_id,
                        stream_id: k.stream_id,
                        correlation_id: k.correlation_id,
                        grid_block: [k.grid, k.block].concat(),
                        name_hash,
                        name: String::new(),
                        graph_id: k.graph_id,
                    };
                    emit(QueuedRecord::Kernel(kernel, name));
                }
                b::KIND_MEMCPY => {
                    // SAFETY: a whole record of the kind this struct mirrors.
                    let m = unsafe { ptr::read_unaligned(record as *const b::ActivityMemcpy6) };
                    emit(QueuedRecord::Other(Record::Memcpy(wire::MemcpyRecord {
                        start_ns: self.ts(m.start),
                        end_ns: self.ts(m.end),
                        copy_kind: u32::from(m.copy_kind),
                        bytes: m.bytes,
                        device_id: m.device_id,
                        stream_id: m.stream_id,
                        correlation_id: m.correlation_id,
                        graph_id: m.graph_id,
                    })));
                }
                b::KIND_GRAPH_TRACE => {
                    // SAFETY: a whole record of the kind this struct mirrors.
                    let g = unsafe { ptr::read_unaligned(record as *const b::ActivityGraphTrace2) };
                    emit(QueuedRecord::Other(Record::Graph(wire::GraphRecord {
                        start_ns: self.ts(g.start),
                        end_ns: self.ts(g.end),
                        graph_id: g.graph_id,
                        device_id: g.device_id,
                        stream_id: g.stream_id,
                        correlation_id: g.correlation_id,
                    })));
                }
                b::KIND_MARKER => {
                    // SAFETY: a whole record of the kind this struct mirrors.
                    let m = unsafe { ptr::read_unaligned(record as *const b::ActivityMarker2) };
                    if let Some(done) = self.marker(&m) {
                        emit(QueuedRecord::Other(Record::Marker(done)));
                    }
                }
                _ => {} // kinds we did not enable (CUPTI may add its own): skip.
            }
        }
    }

    fn kernel_name(&mut self, name: *const c_char) -> (u64, Arc<str>) {
        let (hash, name) = self.names.entry(name as usize).or_insert_with(|| {
            let text = cstr(name);
            (wire::name_hash(text.as_bytes()), Arc::from(text))
        });
        (*hash, name.clone())
    }

    fn marker(&mut self, m: &b::ActivityMarker2) -> Option<wire::MarkerRecord> {
        let at = self.ts(m.timestamp);
        let (flags, id) = (m.flags, m.id);
        if flags & b::FLAG_MARKER_INSTANTANEOUS != 0 {
            return Some(wire::MarkerRecord {
                start_ns: at,
                end_ns: at,
                name: cstr(m.name),
                domain: cstr(m.domain),
                id,
            });
        }
        if flags & b::FLAG_MARKER_START != 0 {
            let open = OpenRange {
                start_ns: at,
                name: cstr(m.name),
                domain: cstr(m.domain),
            };
            self.open_ranges.insert(id, open);
            return None;
        }
        if flags & b::FLAG_MARKER_END != 0 {
            let open = self.open_ranges.remove(&id)?;
            return Some(wire::MarkerRecord {
                start_ns: open.start_ns,
                end_ns: at,
                name: open.name,
                domain: open.domain,
                id,
            });
        }
        None
    }
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: CUPTI hands out NUL-terminated names that live as long as the module.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
