//! Seeds of the binary formats: ring buffer records as the probes write them,
//! recordings as `tokenscope record` writes them, the CUPTI hook's wire, and the
//! duration/SLO parser's text.

use collector::ingest::model::{event::Body, Event};
use collector::ingest::record::{FileHeader, RecordWriter, HEADER_REGION, MAGIC};
use collector::protocol::Decoder;
use probe_ebpf::abi;
use prost::Message;
use tokenscope_cupti_hook::wire::{self, activity::Record, hook_message::Body as Hook};

use super::{chunk, Seeds, CHAT_REQUEST, OPENAI_SSE, SSE_HEAD};

fn as_bytes<T: abi::Plain>(v: &T) -> Vec<u8> {
    // SAFETY: Plain types are repr(C) integers with explicit padding: every byte is initialised.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn ring_header(kind: u32) -> abi::TsHeader {
    let mut comm = [0u8; abi::COMM_LEN];
    comm[..6].copy_from_slice(b"python");
    abi::TsHeader {
        ts_ns: 1_000_000,
        kind,
        pid: 4242,
        tid: 4243,
        cpu: 1,
        comm,
    }
}

fn ring_sock() -> abi::TsSock {
    let mut s = abi::TsSock {
        skaddr: 0xffff_8881_0000_1000,
        family: abi::AF_INET,
        sport: 51000,
        dport: 443,
        ..Default::default()
    };
    s.saddr[..4].copy_from_slice(&[10, 0, 0, 2]);
    s.daddr[..4].copy_from_slice(&[104, 18, 7, 192]);
    s
}

fn io_record(dir: u32, syscall: u32, payload: &[u8], bytes: i64) -> Vec<u8> {
    let head = abi::TsIoEventHead {
        hdr: ring_header(abi::EV_IO),
        sock: ring_sock(),
        dir,
        syscall,
        fd: 7,
        flags: 0,
        bytes,
        payload_len: payload.len() as u32,
        _pad: 0,
    };
    let mut raw = as_bytes(&head);
    raw.extend_from_slice(payload);
    raw
}

fn state_record(old: i32, new: i32) -> Vec<u8> {
    as_bytes(&abi::TsStateEvent {
        hdr: ring_header(abi::EV_STATE),
        sock: ring_sock(),
        oldstate: old,
        newstate: new,
    })
}

fn cuda_record() -> Vec<u8> {
    as_bytes(&abi::TsCudaEvent {
        hdr: ring_header(abi::EV_CUDA),
        call: abi::CU_LAUNCH_KERNEL,
        phase: abi::CUDA_ENTRY,
        stream: 0x7f00_dead_0000,
        bytes: 0,
        result: 0,
    })
}

/// A connection's records: open, request, response, close.
fn ring_conversation() -> Vec<Vec<u8>> {
    let mut resp = SSE_HEAD.as_bytes().to_vec();
    resp.extend(&chunk(OPENAI_SSE.as_bytes(), 170)[..200]);
    vec![
        state_record(7, 2), // CLOSE -> SYN_SENT
        state_record(2, 1), // SYN_SENT -> ESTABLISHED
        io_record(abi::DIR_SEND, abi::SYS_SENDTO, CHAT_REQUEST.as_bytes(), 300),
        io_record(abi::DIR_RECV, abi::SYS_RECVFROM, &resp, 4000),
        io_record(abi::DIR_RECV, abi::SYS_SSL_READ, b"data: [DONE]\n\n", 14),
        cuda_record(),
        state_record(1, 7), // ESTABLISHED -> CLOSE
    ]
}

pub(super) fn ring_record(s: &mut Seeds) {
    let records = ring_conversation();
    for (name, raw) in [
        ("state", &records[1]),
        ("io_request", &records[2]),
        ("io_response", &records[3]),
        ("cuda", &records[5]),
    ] {
        let mut seed = vec![0];
        seed.extend_from_slice(raw);
        s.put("ring_record", name, &seed);
    }
    let mut seq = vec![1];
    for raw in &records {
        seq.extend((raw.len() as u16).to_le_bytes());
        seq.extend_from_slice(raw);
    }
    s.put("ring_record", "conversation", &seq);
}

/// Decoded events of a conversation, as `tokenscope record` writes them.
fn events() -> Vec<Event> {
    let mut decoder = Decoder::new();
    ring_conversation()
        .iter()
        .map(|raw| decoder.decode(raw).expect("the seed records decode"))
        .collect()
}

pub(super) fn record_file(s: &mut Seeds) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("seed.tsrec");
    let header = FileHeader {
        clock: "MONOTONIC".into(),
        host: "gpu-node-1".into(),
        kernel: "6.1.0-25-amd64".into(),
        tokenscope_version: "0.1.0".into(),
        probes: vec!["sock:tcp_sendmsg".into(), "tls:SSL_read".into()],
        start_monotonic_ns: 1_000,
        filter_ports: vec![443],
        payload_cap: 4096,
        io_source: "sock".into(),
        ..Default::default()
    };
    let mut w = RecordWriter::create(&path, header).expect("create the seed recording");
    for e in events() {
        let keep_payload_small = !matches!(e.body, Some(Body::Cuda(_)));
        if keep_payload_small {
            w.push(e).expect("push");
        }
    }
    let counters = collector::ingest::record::Counters {
        submitted: 7,
        delivered: 7,
        ..Default::default()
    };
    w.finish(counters, 9_000)
        .expect("finish the seed recording");
    let file = std::fs::read(&path).expect("read the seed recording back");
    // The compact form (see the target's doc): header length, header, frames.
    let hlen = u32::from_le_bytes(file[8..12].try_into().expect("4 bytes")) as usize;
    let frames = &file[HEADER_REGION as usize..];
    let mut compact = vec![0];
    compact.extend((hlen as u16).to_le_bytes());
    compact.extend_from_slice(&file[12..12 + hlen]);
    compact.extend_from_slice(frames);
    s.put("record_file", "conversation", &compact);
    // The same recording cut mid-frame by a crash, its header still incomplete.
    let mut header = FileHeader::decode(&file[12..12 + hlen]).expect("the header decodes");
    header.complete = false;
    let body = header.encode_to_vec();
    let mut cut = vec![0];
    cut.extend((body.len() as u16).to_le_bytes());
    cut.extend(&body);
    cut.extend_from_slice(&frames[..frames.len() / 2]);
    s.put("record_file", "cut_off", &cut);
    // The raw form: magic and a region too short.
    let mut raw = vec![1];
    raw.extend_from_slice(MAGIC);
    raw.extend([0x10, 0, 0, 0]);
    s.put("record_file", "raw_short", &raw);
    // A batch as a frame holds it once unpacked (format 3: timestamps and prints in
    // columns of their own), for record_batch.
    let batch = collector::ingest::record::EventBatch {
        events: events()
            .into_iter()
            .map(|e| Event { ts_ns: 0, ..e })
            .collect(),
        ts_deltas: vec![1_000, 20_000, 2, 7],
        prints: vec![0x9e37_79b9_7f4a_7c15, 1],
        ..Default::default()
    };
    s.put("record_batch", "conversation", &batch.encode_to_vec());
}

pub(super) fn cupti_wire(s: &mut Seeds) {
    let hello = wire::HookMessage {
        body: Some(Hook::Hello(wire::Hello {
            wire_version: wire::WIRE_VERSION,
            pid: 4242,
            clock: wire::CLOCK_MONOTONIC_NAME.into(),
            clock_source: "timestamp-callback".into(),
            cupti_version: 28,
            enabled_kinds: vec![10, 1, 12, 51],
            notes: vec!["graph: CUPTI_ERROR_NOT_SUPPORTED".into()],
            cupti_path: "/usr/local/cuda/lib64/libcupti.so.12".into(),
        })),
    };
    let kernel = wire::KernelRecord {
        start_ns: 10_000,
        end_ns: 12_500,
        device_id: 0,
        context_id: 1,
        stream_id: 7,
        correlation_id: 99,
        grid_block: vec![128, 1, 1, 256, 1, 1],
        name_hash: wire::name_hash(b"flash_fwd_kernel"),
        name: "flash_fwd_kernel".into(),
        graph_id: 0,
    };
    let batch = wire::HookMessage {
        body: Some(Hook::Batch(wire::Batch {
            records: vec![
                wire::Activity {
                    record: Some(Record::Kernel(kernel.clone())),
                },
                wire::Activity {
                    record: Some(Record::Kernel(wire::KernelRecord {
                        name: String::new(),
                        start_ns: 13_000,
                        end_ns: 14_000,
                        ..kernel
                    })),
                },
                wire::Activity {
                    record: Some(Record::Memcpy(wire::MemcpyRecord {
                        start_ns: 14_000,
                        end_ns: 14_100,
                        copy_kind: 2,
                        bytes: 4096,
                        stream_id: 7,
                        correlation_id: 100,
                        ..Default::default()
                    })),
                },
                wire::Activity {
                    record: Some(Record::Graph(wire::GraphRecord {
                        start_ns: 15_000,
                        end_ns: 19_000,
                        graph_id: 3,
                        stream_id: 7,
                        ..Default::default()
                    })),
                },
                wire::Activity {
                    record: Some(Record::Marker(wire::MarkerRecord {
                        start_ns: 9_000,
                        end_ns: 20_000,
                        name: "decode step".into(),
                        domain: "vllm".into(),
                        id: 5,
                    })),
                },
            ],
            dropped_total: 0,
            cupti_dropped_total: 0,
            pid: 4242,
        })),
    };
    let error = wire::HookMessage {
        body: Some(Hook::Error(wire::HookError {
            message: "libcupti.so not found".into(),
            cupti_result: 0,
            call: "dlopen".into(),
        })),
    };
    let mut stream = Vec::new();
    wire::encode_message(&hello, &mut stream);
    wire::encode_message(&batch, &mut stream);
    s.put("cupti_wire", "hello_batch", &stream);
    let mut refused = Vec::new();
    wire::encode_message(&error, &mut refused);
    s.put("cupti_wire", "error", &refused);
}

pub(super) fn duration_slo(s: &mut Seeds) {
    for (name, text) in [
        ("ms", "500ms"),
        ("bare", "7"),
        ("fraction", " 1.5s "),
        ("micro", "2µs"),
        ("ttft", "ttft_p95=300ms"),
        ("itl", "itl_p99=50ms"),
        ("tpot", "TPOT_mean=0.05s"),
        ("max", "ttft_max=1500us"),
    ] {
        s.put("duration_slo", name, text.as_bytes());
    }
}
