//! Tests of `record`.

use super::*;
use crate::ingest::model::{event::Body, Sock, StateChange, TcpState};
use formats::{format_2_frame, write_format_1, write_format_3, write_format_frames};
use sizes::{fixture_events, write_live};
use sockets::awkward_socket_events;

fn event(i: u64) -> Event {
    Event {
        ts_ns: 1_000 + i,
        pid: 42,
        tid: 43,
        cpu: 0,
        comm: "curl".into(),
        body: Some(Body::State(StateChange {
            sock: Some(Sock {
                skaddr: i,
                saddr: vec![127, 0, 0, 1].into(),
                sport: 1,
                daddr: vec![127, 0, 0, 1].into(),
                dport: 2,
            }),
            old: TcpState::SynSent as i32,
            new: TcpState::Established as i32,
        })),
    }
}

fn header() -> FileHeader {
    FileHeader {
        clock: "MONOTONIC".into(),
        host: "h".into(),
        probes: vec!["sock:inet_sock_set_state".into()],
        ..Default::default()
    }
}

fn write(path: &Path, n: u64, finish: bool) -> Vec<Event> {
    let mut w = RecordWriter::create(path, header()).expect("create");
    let events: Vec<Event> = (0..n).map(event).collect();
    for e in &events {
        w.push(e.clone()).expect("push");
    }
    if finish {
        let c = Counters {
            submitted: n + 5,
            dropped: 5,
            delivered: n,
            ..Default::default()
        };
        w.finish(c, 99).expect("finish");
    } else {
        w.flush().expect("flush");
    }
    events
}

#[test]
fn round_trip_keeps_every_event_and_the_counters() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let events = write(&path, 2500, true);
    let mut r = RecordReader::open(&path).expect("open");
    assert!(r.header.complete, "a finished recording says so");
    let c = r.header.counters.expect("counters");
    assert_eq!(
        (c.submitted, c.dropped, c.delivered, c.written),
        (2505, 5, 2500, 2500)
    );
    assert_eq!(r.header.end_monotonic_ns, 99);
    assert!(
        r.header.end_realtime_ns > 1_700_000_000_000_000_000,
        "sealed with the wall clock: {}",
        r.header.end_realtime_ns
    );
    assert_eq!(
        r.read_all().expect("read"),
        events,
        "events come back exactly, in order"
    );
    assert_eq!(r.cut_off_at, None);
}

#[test]
fn unfinished_recording_reads_to_its_last_whole_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    write(&path, 2048, false); // two frames of 1024
    let len = std::fs::metadata(&path).expect("meta").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    f.set_len(len - 10).expect("truncate into the second frame");
    let mut r = RecordReader::open(&path).expect("open");
    assert!(!r.header.complete);
    assert_eq!(
        r.read_all().expect("a cut-off tail is not an error").len(),
        1024,
        "first frame survives"
    );
    assert!(r.cut_off_at.is_some(), "the cut is reported");
}

#[test]
fn completed_but_truncated_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    write(&path, 10, true);
    let len = std::fs::metadata(&path).expect("meta").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(len - 1)
        .expect("truncate");
    let err = RecordReader::open(&path)
        .expect("header is intact")
        .read_all()
        .expect_err("must fail");
    assert!(matches!(err, RecordError::Truncated { .. }), "got {err}");
}

/// Events a frame's packing must carry through: timestamps out of order and at the
/// ends of u64, comms empty, repeated, changing within a thread, and starting with
/// the escape byte.
fn awkward_events() -> Vec<Event> {
    let comms = ["curl", "", "\0x", "\0", "curl", "nginx", "curl", ""];
    let stamps = [5, 3, u64::MAX, 0, 7, u64::MAX - 1, 1, 1];
    (0..64u64)
        .map(|i| {
            let mut e = event(i);
            e.ts_ns = stamps[i as usize % stamps.len()] ^ (i << 20);
            e.tid = (i % 3) as u32;
            e.comm = comms[(i / 2) as usize % comms.len()].into();
            e
        })
        .collect()
}

#[test]
fn packed_frames_give_back_every_event_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let events = awkward_events();
    let frames: Vec<&[Event]> = events.chunks(5).collect();
    write_live(&path, header(), &frames);
    let mut r = RecordReader::open(&path).expect("open");
    assert_eq!(r.read_all().expect("read"), events);
}

#[test]
fn a_stream_cut_mid_frame_reads_to_its_last_whole_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let events: Vec<Event> = (0..1000).map(event).collect();
    let mut w = RecordWriter::create(&path, header()).expect("create");
    let mut ends = Vec::new();
    for frame in events.chunks(100) {
        for e in frame {
            w.push(e.clone()).expect("push");
        }
        w.flush().expect("flush");
        ends.push(w.bytes());
    }
    drop(w); // a crash: the header still says incomplete
    let cut = (ends[6] + ends[7]) / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open")
        .set_len(cut)
        .expect("cut");
    let mut r = RecordReader::open(&path).expect("open");
    assert_eq!(
        r.read_all().expect("a cut tail is not an error"),
        events[..700],
        "the seven whole frames, exactly"
    );
    assert_eq!(
        r.cut_off_at,
        Some(ends[6]),
        "the cut is reported where it is"
    );
}

#[test]
fn garbage_inside_a_stream_is_an_error_then_and_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let events: Vec<Event> = (0..300).map(event).collect();
    let frames: Vec<&[Event]> = events.chunks(100).collect();
    write_live(&path, header(), &frames);
    let mut bytes = std::fs::read(&path).expect("read");
    let mut r = RecordReader::open(&path).expect("open");
    r.next_batch().expect("first frame").expect("events");
    let second = r.offset as usize;
    for b in &mut bytes[second + 3..second + 11] {
        *b ^= 0x5a;
    }
    std::fs::write(&path, &bytes).expect("write");
    let mut r = RecordReader::open(&path).expect("open");
    assert_eq!(
        r.next_batch().expect("first frame intact").map(|b| b.len()),
        Some(100)
    );
    for _ in 0..2 {
        let err = r
            .next_batch()
            .expect_err("the damaged frame, and what follows it");
        assert!(
            matches!(err, RecordError::CorruptFrame { offset, .. } if offset == second as u64),
            "names the damaged frame: {err}"
        );
    }
}

#[test]
fn corrupt_files_give_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x");
    std::fs::write(&path, b"hello world").expect("write");
    assert!(matches!(
        RecordReader::open(&path),
        Err(RecordError::NotARecording(_))
    ));
    std::fs::write(&path, MAGIC).expect("write");
    assert!(matches!(
        RecordReader::open(&path),
        Err(RecordError::CorruptHeader { .. })
    ));

    write(&path, 3, true);
    let mut bytes = std::fs::read(&path).expect("read");
    let frame_body = HEADER_REGION as usize + 2;
    for b in &mut bytes[frame_body..frame_body + 8] {
        *b = 0xff;
    }
    std::fs::write(&path, &bytes).expect("write");
    let err = RecordReader::open(&path)
        .expect("header ok")
        .read_all()
        .expect_err("garbage frame");
    assert!(matches!(err, RecordError::CorruptFrame { .. }), "got {err}");

    let mut bytes = std::fs::read(&path).expect("read");
    bytes[12] ^= 0xff; // header body
    bytes[8..12].copy_from_slice(&5000u32.to_le_bytes());
    std::fs::write(&path, &bytes).expect("write");
    assert!(matches!(
        RecordReader::open(&path),
        Err(RecordError::CorruptHeader { .. })
    ));
}

#[test]
fn random_garbage_never_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g");
    write(&path, 50, true);
    let good = std::fs::read(&path).expect("read");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200 {
        let mut bytes = good.clone();
        for _ in 0..8 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at =
                HEADER_REGION as usize + (seed as usize % (bytes.len() - HEADER_REGION as usize));
            bytes[at] = (seed >> 32) as u8;
        }
        std::fs::write(&path, &bytes).expect("write");
        if let Ok(mut r) = RecordReader::open(&path) {
            let _ = r.read_all();
        }
    }
}

#[test]
fn recordings_are_created_owner_only_even_over_a_looser_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    std::fs::write(&path, b"old").expect("a file already there");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    write(&path, 10, true);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

/// `batch::decode` must be prost's decoding, result and error alike.
fn decodes_as_prost_does(bytes: &[u8], what: &str) {
    let ours = batch::decode(bytes).map_err(|e| e.to_string());
    let prost = EventBatch::decode(bytes).map_err(|e| e.to_string());
    assert_eq!(ours, prost, "{what}: read by hand as prost reads it");
}

#[test]
fn batches_written_by_hand_are_what_prost_writes() {
    use crate::ingest::model::{Sniff, SockIo, SseEvent};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, mut events) = fixture_events(dir.path());
    // Sniffs whose lengths take two and three varint bytes (the bytes after their
    // length are moved along) and an I/O without socket or sniff.
    for n in [70, 9000] {
        events.push(Event {
            body: Some(Body::Io(SockIo {
                sock: event(3).sock().cloned(),
                fd: -1,
                sniff: Some(Sniff {
                    sse: vec![SseEvent::default(); n].into(),
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..event(3)
        });
    }
    events.push(Event {
        body: Some(Body::Io(SockIo::default())),
        ..Default::default()
    });
    assert!(events
        .iter()
        .any(|e| matches!(&e.body, Some(Body::Io(io)) if io.sniff.is_some() && io.sock.is_some())));
    for batch in [
        EventBatch {
            events,
            ts_deltas: vec![1, 300, u64::MAX],
            prints: vec![u64::MAX, 7],
            shapes: vec![0, 1, 2],
            columns: vec![0; 300],
        },
        EventBatch::default(),
    ] {
        let mut ours = Vec::new();
        batch.encode_vec(&mut ours);
        assert_eq!(ours, batch.encode_to_vec(), "{} events", batch.events.len());
    }
}

#[test]
fn batches_read_by_hand_are_what_prost_reads() {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, events) = fixture_events(dir.path());
    let batch = EventBatch {
        events: events.clone(),
        ts_deltas: vec![1, 2, 3],
        prints: vec![u64::MAX, 7],
        shapes: vec![1, 2],
        columns: vec![3; 4],
    };
    let whole = batch.encode_to_vec();
    decodes_as_prost_does(&whole, "the fixture's events, every kind");
    assert_eq!(batch::decode(&whole).expect("decodes").events, events);
    decodes_as_prost_does(&whole[..whole.len() - 3], "cut short");

    // One event's bytes, then the batch field (tag 1) that carries them.
    let field = |tag: u32, wire_type: WireType, body: &[u8]| {
        let mut out = Vec::new();
        encode_key(tag, wire_type, &mut out);
        if wire_type == WireType::LengthDelimited {
            encode_varint(body.len() as u64, &mut out);
        }
        out.extend_from_slice(body);
        out
    };
    let varint = |v: u64| {
        let mut out = Vec::new();
        encode_varint(v, &mut out);
        out
    };
    let io = Event {
        body: Some(Body::Io(crate::ingest::model::SockIo {
            sock: event(9).sock().cloned(),
            dir: 1,
            fd: -1,
            bytes: 100,
            sniff: Some(crate::ingest::model::Sniff {
                fingerprint: 5,
                message_start: true,
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..event(9)
    }
    .encode_to_vec();
    let cuda = Event {
        body: Some(Body::Cuda(crate::ingest::model::CudaCall {
            api: 3,
            entry: true,
            result: -1,
            ..Default::default()
        })),
        ..event(10)
    }
    .encode_to_vec();
    let sock = Sock {
        skaddr: 77,
        saddr: vec![10, 0, 0, 1].into(),
        sport: 9,
        daddr: vec![1; 16].into(),
        dport: u32::MAX,
    }
    .encode_to_vec();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("an I/O", io.clone()),
        ("an I/O whose socket is a format 4 reference", {
            let reference = Sock {
                skaddr: 3,
                ..Sock::default()
            };
            let io_ref = field(1, WireType::LengthDelimited, &reference.encode_to_vec());
            let mut b = cuda.clone();
            b.extend(field(11, WireType::LengthDelimited, &io_ref));
            b
        }),
        ("a libcuda call", cuda.clone()),
        ("fields twice: the last scalar wins, messages merge", {
            let mut b = io.clone();
            b.extend(field(2, WireType::Varint, &varint(1 << 40)));
            b.extend(field(5, WireType::LengthDelimited, b"again"));
            let io_again = field(1, WireType::LengthDelimited, &sock);
            b.extend(field(11, WireType::LengthDelimited, &io_again));
            b
        }),
        (
            "the body changes kind",
            [io.clone(), cuda.clone(), io.clone()].concat(),
        ),
        ("a field no reader knows", {
            let mut b = io.clone();
            b.extend(field(99, WireType::Varint, &varint(3)));
            b
        }),
        ("a scalar as bytes", {
            let mut b = io.clone();
            b.extend(field(2, WireType::LengthDelimited, b"xy"));
            b
        }),
        ("a comm that is not UTF-8", {
            let mut b = cuda.clone();
            b.extend(field(5, WireType::LengthDelimited, &[0xff, 0xfe]));
            b
        }),
        ("an I/O whose socket runs past it", {
            let mut b = io.clone();
            let mut short = Vec::new();
            encode_key(1, WireType::LengthDelimited, &mut short);
            encode_varint(40, &mut short);
            short.extend_from_slice(&sock);
            b.extend(field(11, WireType::LengthDelimited, &short));
            b
        }),
        ("an overlong varint", {
            let mut b = cuda.clone();
            b.extend(field(1, WireType::Varint, &[0xff; 11]));
            b
        }),
        ("a sniff with every kind of field", {
            use crate::ingest::model::{sniff, BodyPrint, H2StreamSniff, HttpRequestHead, Sniff};
            let sse = |choice| crate::ingest::model::SseEvent {
                fingerprint: 4,
                kind: 1,
                api: 2,
                choice,
                token: 1,
                text_print: u64::MAX,
            };
            let full = Sniff {
                fingerprint: 1,
                kind: Some(sniff::Kind::HttpRequest(Box::new(HttpRequestHead {
                    method: "POST".into(),
                    path: "/v1/chat/completions".into(),
                    ..Default::default()
                }))),
                message_start: true,
                message_end: true,
                body_bytes: 1 << 35,
                body_print: Some(BodyPrint { hash: 3, length: 9 }),
                sse: vec![sse(0), sse(1), crate::ingest::model::SseEvent::default()].into(),
                unparsed: true,
                compressed: true,
                prefix_prints: vec![5, 6],
                h2_streams: vec![H2StreamSniff {
                    stream_id: 3,
                    sniff: Some(Sniff {
                        sse: vec![sse(2)].into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                h2_control_frames: 2,
                h2_errors: 1,
                h2_preface: true,
                limits: 7,
            };
            let io_sniff = field(8, WireType::LengthDelimited, &full.encode_to_vec());
            let mut b = cuda.clone();
            b.extend(field(11, WireType::LengthDelimited, &io_sniff));
            b
        }),
        ("a sniff field of tag 0", {
            let io_sniff = field(8, WireType::LengthDelimited, &[0x00, 0x01]);
            let mut b = io.clone();
            b.extend(field(11, WireType::LengthDelimited, &io_sniff));
            b
        }),
        ("a sniff key past 32 bits", {
            let mut key = varint((1 << 33) | 1);
            key.extend_from_slice(&[0; 8]);
            let io_sniff = field(8, WireType::LengthDelimited, &key);
            let mut b = io.clone();
            b.extend(field(11, WireType::LengthDelimited, &io_sniff));
            b
        }),
        (
            "an SSE event with a field no reader knows, and one cut short",
            {
                let mut event = field(2, WireType::Varint, &varint(1));
                event.extend(field(9, WireType::Varint, &varint(1)));
                let mut cut = field(1, WireType::SixtyFourBit, &[0; 8]);
                cut.truncate(5);
                let mut sniff = field(24, WireType::LengthDelimited, &event);
                sniff.extend(field(24, WireType::LengthDelimited, &cut));
                let io_sniff = field(8, WireType::LengthDelimited, &sniff);
                let mut b = io.clone();
                b.extend(field(11, WireType::LengthDelimited, &io_sniff));
                b
            },
        ),
    ];
    for (what, body) in &cases {
        let one = field(1, WireType::LengthDelimited, body);
        decodes_as_prost_does(&one, what);
        let mut two = one.clone();
        two.extend(field(2, WireType::Varint, &varint(4)));
        two.extend(one);
        decodes_as_prost_does(&two, what);
    }
    // The columns: packed (read by hand), unpacked (prost's), and damaged.
    let packed = |tag: u32, words: &[u8]| field(tag, WireType::LengthDelimited, words);
    let columns: Vec<(&str, Vec<u8>)> = vec![
        ("packed columns", {
            let mut b = packed(2, &[varint(3), varint(1 << 40), varint(0)].concat());
            b.extend(packed(3, &[7u8; 16]));
            b.extend(packed(2, &varint(9)));
            b
        }),
        ("unpacked columns", {
            let mut b = field(2, WireType::Varint, &varint(5));
            b.extend(field(3, WireType::SixtyFourBit, &[1; 8]));
            b.extend(packed(2, &varint(6)));
            b
        }),
        ("a prints column of 12 bytes", packed(3, &[1; 12])),
        (
            "a timestamp column cut in a varint",
            packed(2, &[0x80, 0x80]),
        ),
        ("a timestamp varint of 11 bytes", {
            let mut long = vec![0xff; 10];
            long.push(0);
            packed(2, &long)
        }),
        ("a column longer than the batch", {
            let mut b = packed(2, &[1, 2, 3]);
            b.truncate(b.len() - 1);
            b
        }),
    ];
    for (what, bytes) in &columns {
        decodes_as_prost_does(bytes, what);
    }
}

mod columns;
mod disorder;
mod formats;
mod sizes;
mod sockets;
mod zstd_frames;
