//! The hook -> collector wire format: length-delimited `HookMessage`s on a Unix stream.
//! First a `Hello`, then `Batch`es; a `HookError` when CUPTI refused us. Hand-written prost
//! messages (no protoc on the build machines); field numbers are the contract.

use prost::{Message, Oneof};

/// Bumped when a field changes meaning; the listener refuses other versions.
pub const WIRE_VERSION: u32 = 1;

/// Clock every timestamp on the wire is in.
pub const CLOCK_MONOTONIC_NAME: &str = "CLOCK_MONOTONIC";

#[derive(Clone, PartialEq, Message)]
pub struct HookMessage {
    #[prost(oneof = "hook_message::Body", tags = "1, 2, 3")]
    pub body: Option<hook_message::Body>,
}

pub mod hook_message {
    use super::*;
    #[derive(Clone, PartialEq, Oneof)]
    pub enum Body {
        #[prost(message, tag = "1")]
        Hello(Hello),
        #[prost(message, tag = "2")]
        Batch(Batch),
        #[prost(message, tag = "3")]
        Error(HookError),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct Hello {
    #[prost(uint32, tag = "1")]
    pub wire_version: u32,
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    /// Always "CLOCK_MONOTONIC": the hook converts at the edge (DESIGN.md section 7).
    #[prost(string, tag = "3")]
    pub clock: String,
    /// "timestamp-callback" or "paired-readings".
    #[prost(string, tag = "4")]
    pub clock_source: String,
    /// cuptiGetVersion(): the CUPTI API version, e.g. 28 for CUDA 12.9.
    #[prost(uint32, tag = "5")]
    pub cupti_version: u32,
    /// Activity kinds enabled, by CUPTI number (10 kernel, 1 memcpy, 12 marker, 51 graph).
    #[prost(uint32, repeated, tag = "6")]
    pub enabled_kinds: Vec<u32>,
    /// One line per kind that could not be enabled, and why.
    #[prost(string, repeated, tag = "7")]
    pub notes: Vec<String>,
    /// The libcupti the hook loaded (for NVTX_INJECTION64_PATH and bug reports).
    #[prost(string, tag = "8")]
    pub cupti_path: String,
}

/// The hook gave up; `message` is the same line it printed on stderr.
#[derive(Clone, PartialEq, Message)]
pub struct HookError {
    #[prost(string, tag = "1")]
    pub message: String,
    /// CUptiResult, 0 when the failure was not a CUPTI call (e.g. libcupti not found).
    #[prost(uint32, tag = "2")]
    pub cupti_result: u32,
    /// The CUPTI call that failed, or "dlopen".
    #[prost(string, tag = "3")]
    pub call: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Batch {
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<Activity>,
    /// Records the hook dropped so far (its queue was full), cumulative.
    #[prost(uint64, tag = "2")]
    pub dropped_total: u64,
    /// Records CUPTI itself reported dropped (cuptiActivityGetNumDroppedRecords), cumulative.
    #[prost(uint64, tag = "3")]
    pub cupti_dropped_total: u64,
    /// The hooked process (also in Hello; here so records never wait on it).
    #[prost(uint32, tag = "4")]
    pub pid: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Activity {
    #[prost(oneof = "activity::Record", tags = "1, 2, 3, 4")]
    pub record: Option<activity::Record>,
}

pub mod activity {
    use super::*;
    #[derive(Clone, PartialEq, Oneof)]
    pub enum Record {
        #[prost(message, tag = "1")]
        Kernel(KernelRecord),
        #[prost(message, tag = "2")]
        Memcpy(MemcpyRecord),
        #[prost(message, tag = "3")]
        Graph(GraphRecord),
        #[prost(message, tag = "4")]
        Marker(MarkerRecord),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct KernelRecord {
    #[prost(uint64, tag = "1")]
    pub start_ns: u64,
    #[prost(uint64, tag = "2")]
    pub end_ns: u64,
    #[prost(uint32, tag = "3")]
    pub device_id: u32,
    #[prost(uint32, tag = "4")]
    pub context_id: u32,
    #[prost(uint32, tag = "5")]
    pub stream_id: u32,
    #[prost(uint32, tag = "6")]
    pub correlation_id: u32,
    /// grid x, y, z then block x, y, z.
    #[prost(int32, repeated, tag = "7")]
    pub grid_block: Vec<i32>,
    /// FNV-1a 64 of the (mangled) kernel name.
    #[prost(fixed64, tag = "8")]
    pub name_hash: u64,
    /// Sent only the first time a hash goes out on a connection; empty afterwards.
    #[prost(string, tag = "9")]
    pub name: String,
    /// Graph the kernel ran in (0 = launched outside a graph).
    #[prost(uint32, tag = "10")]
    pub graph_id: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct MemcpyRecord {
    #[prost(uint64, tag = "1")]
    pub start_ns: u64,
    #[prost(uint64, tag = "2")]
    pub end_ns: u64,
    /// CUpti_ActivityMemcpyKind: 1 HtoD, 2 DtoH, 8 DtoD, ...
    #[prost(uint32, tag = "3")]
    pub copy_kind: u32,
    #[prost(uint64, tag = "4")]
    pub bytes: u64,
    #[prost(uint32, tag = "5")]
    pub device_id: u32,
    #[prost(uint32, tag = "6")]
    pub stream_id: u32,
    #[prost(uint32, tag = "7")]
    pub correlation_id: u32,
    #[prost(uint32, tag = "8")]
    pub graph_id: u32,
}

#[derive(Clone, PartialEq, Message)]
pub struct GraphRecord {
    #[prost(uint64, tag = "1")]
    pub start_ns: u64,
    #[prost(uint64, tag = "2")]
    pub end_ns: u64,
    #[prost(uint32, tag = "3")]
    pub graph_id: u32,
    #[prost(uint32, tag = "4")]
    pub device_id: u32,
    #[prost(uint32, tag = "5")]
    pub stream_id: u32,
    #[prost(uint32, tag = "6")]
    pub correlation_id: u32,
}

/// An NVTX range (start < end) or instantaneous marker (start == end).
#[derive(Clone, PartialEq, Message)]
pub struct MarkerRecord {
    #[prost(uint64, tag = "1")]
    pub start_ns: u64,
    #[prost(uint64, tag = "2")]
    pub end_ns: u64,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub domain: String,
    #[prost(uint32, tag = "5")]
    pub id: u32,
}

/// FNV-1a 64: stable across processes, so the collector can key names by hash.
pub fn name_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub fn encode_message(msg: &HookMessage, out: &mut Vec<u8>) {
    msg.encode_length_delimited(out)
        .expect("a Vec grows to fit any message");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips_length_delimited() {
        let msg = HookMessage {
            body: Some(hook_message::Body::Batch(Batch {
                records: vec![Activity {
                    record: Some(activity::Record::Kernel(KernelRecord {
                        start_ns: 10,
                        end_ns: 20,
                        grid_block: vec![1, 2, 3, 128, 1, 1],
                        name_hash: name_hash(b"k"),
                        name: "k".into(),
                        ..Default::default()
                    })),
                }],
                dropped_total: 3,
                cupti_dropped_total: 0,
                pid: 42,
            })),
        };
        let mut buf = Vec::new();
        encode_message(&msg, &mut buf);
        let back = HookMessage::decode_length_delimited(buf.as_slice()).unwrap();
        assert_eq!(back, msg, "a batch must decode to what was encoded");
    }

    #[test]
    fn fnv_matches_reference_vector() {
        assert_eq!(name_hash(b"a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a 64 of 'a'");
    }
}
