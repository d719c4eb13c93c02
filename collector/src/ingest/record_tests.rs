//! Tests of `record`.

use super::*;
use crate::ingest::model::{event::Body, Sock, StateChange, TcpState};

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
                saddr: vec![127, 0, 0, 1],
                sport: 1,
                daddr: vec![127, 0, 0, 1],
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

/// The magic and a complete header of `version`, padded to the header region: the start
/// of a file as an older tokenscope wrote it.
fn old_file_start(version: u32) -> Vec<u8> {
    let mut h = header();
    h.format_version = version;
    h.complete = true;
    let body = h.encode_to_vec();
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes.resize(HEADER_REGION as usize, 0);
    bytes
}

/// A format 1 file as tokenscope wrote them before frames were compressed.
fn write_format_1(path: &Path, events: &[Event]) {
    let mut bytes = old_file_start(1);
    for chunk in events.chunks(BATCH_EVENTS) {
        let batch = EventBatch {
            events: chunk.to_vec(),
            ..Default::default()
        };
        bytes.extend_from_slice(&batch.encode_length_delimited_to_vec());
    }
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn format_1_files_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v1.tsrec");
    let events: Vec<Event> = (0..2500).map(event).collect();
    write_format_1(&path, &events);
    let mut r = RecordReader::open(&path).expect("open");
    assert_eq!(r.header.format_version, 1);
    assert_eq!(r.read_all().expect("read"), events);
}

/// A format 2 file: each frame zstd-compressed on its own, events as they are.
fn write_format_2(path: &Path, events: &[Event], frame_events: usize) {
    let mut bytes = old_file_start(2);
    for chunk in events.chunks(frame_events) {
        bytes.extend_from_slice(&format_2_frame(chunk));
    }
    std::fs::write(path, bytes).expect("write");
}

fn format_2_frame(events: &[Event]) -> Vec<u8> {
    let batch = EventBatch {
        events: events.to_vec(),
        ..Default::default()
    };
    let packed = zstd::bulk::compress(&batch.encode_to_vec(), 3).expect("zstd");
    let mut frame = Vec::new();
    prost::encoding::encode_varint(packed.len() as u64, &mut frame);
    frame.extend_from_slice(&packed);
    frame
}

#[test]
fn format_2_files_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v2.tsrec");
    let events: Vec<Event> = (0..2500).map(event).collect();
    write_format_2(&path, &events, BATCH_EVENTS);
    let mut r = RecordReader::open(&path).expect("open");
    assert_eq!(r.header.format_version, 2);
    assert_eq!(r.read_all().expect("read"), events);
}

/// A format 3 file, from the format 3 writer, a frame per chunk of `frame_events`.
fn write_format_3(path: &Path, events: &[Event], frame_events: usize) {
    let frames: Vec<&[Event]> = events.chunks(frame_events).collect();
    write_format_3_frames(path, &frames);
}

fn write_format_3_frames(path: &Path, frames: &[&[Event]]) {
    let mut w = RecordWriter::create_format(path, header(), 3).expect("create");
    for frame in frames {
        for e in *frame {
            w.push(e.clone()).expect("push");
        }
        w.flush().expect("flush");
    }
    w.finish(Counters::default(), 1).expect("finish");
}

#[test]
fn format_3_files_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v3.tsrec");
    let events = awkward_socket_events();
    write_format_3(&path, &events, 100);
    let mut r = RecordReader::open(&path).expect("open");
    assert_eq!(r.header.format_version, 3);
    assert!(r.read_all().expect("read") == events, "every event back");
}

#[test]
fn newer_formats_are_refused_naming_their_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("v9.tsrec");
    write(&path, 3, true);
    let mut bytes = std::fs::read(&path).expect("read");
    let mut h = header();
    h.format_version = FORMAT_VERSION + 1;
    let body = h.encode_to_vec();
    bytes[8..12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    bytes[12..12 + body.len()].copy_from_slice(&body);
    std::fs::write(&path, &bytes).expect("write");
    let err = RecordReader::open(&path).err().expect("refused");
    let text = err.to_string();
    assert!(
        text.contains(&format!("format {}", FORMAT_VERSION + 1))
            && text.contains(&format!("({FORMAT_VERSION})")),
        "names the file's version and the one read: {text}"
    );
}

/// The committed lab recording's header and events.
fn fixture_events(dir: &Path) -> (FileHeader, Vec<Event>) {
    let gz = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/diagnose/tuned-plain.tsrec.gz");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(File::open(&gz).expect("fixture"))
        .read_to_end(&mut bytes)
        .expect("gunzip");
    let fixture = dir.join("fixture.tsrec");
    std::fs::write(&fixture, &bytes).expect("write");
    let mut r = RecordReader::open(&fixture).expect("open");
    let header = r.header.clone();
    (header, r.read_all().expect("read"))
}

/// The frames a live recorder writes: one per flush, every 200 ms (`record`'s
/// interval), here by the events' own clock.
fn live_frames(events: &[Event]) -> Vec<&[Event]> {
    const FLUSH_NS: u64 = 200_000_000;
    let mut frames = Vec::new();
    let (mut start, mut due) = (0, events.first().map_or(0, |e| e.ts_ns + FLUSH_NS));
    for (i, e) in events.iter().enumerate() {
        if e.ts_ns >= due || i - start == BATCH_EVENTS {
            frames.push(&events[start..i]);
            start = i;
            due = e.ts_ns + FLUSH_NS;
        }
    }
    frames.push(&events[start..]);
    frames
}

fn write_live(path: &Path, header: FileHeader, frames: &[&[Event]]) -> u64 {
    let mut w = RecordWriter::create(path, header).expect("create");
    for frame in frames {
        for e in *frame {
            w.push(e.clone()).expect("push");
        }
        w.flush().expect("flush");
    }
    w.finish(Counters::default(), 1).expect("finish");
    std::fs::metadata(path).expect("meta").len() - HEADER_REGION
}

#[test]
fn live_sized_frames_stay_under_the_size_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (header, events) = fixture_events(dir.path());
    let frames = live_frames(&events);
    let v3 = dir.path().join("v3.tsrec");
    let after = write_live(&v3, header, &frames);
    let before: u64 = frames.iter().map(|f| format_2_frame(f).len() as u64).sum();
    let old = dir.path().join("old-v3.tsrec");
    write_format_3_frames(&old, &frames);
    let v3_bytes = std::fs::metadata(&old).expect("meta").len() - HEADER_REGION;
    let n = events.len() as f64;
    println!(
        "{n} events in {} frames of 200 ms ({:.0} events each): format 2 {before} bytes \
         ({:.2} B/event), format 3 {v3_bytes} bytes ({:.2} B/event), format {FORMAT_VERSION} \
         {after} bytes ({:.2} B/event)",
        frames.len(),
        n / frames.len() as f64,
        before as f64 / n,
        v3_bytes as f64 / n,
        after as f64 / n,
    );
    // Issue 17's target, 48 B per token at its load's 4.5 events per token, is this
    // much per event. The lab recording's events are not the load (fewer
    // socket hops per token, CUDA calls), so live figures come from `cargo xtask bench
    // agent`; this holds the format to the budget on a fixed input.
    let budget = 48.0 / 4.5;
    assert!(
        after as f64 / n <= budget,
        "at most {budget:.1} B/event: {after} bytes for {n} events"
    );
    // Deltas, columns and the stream across frames each take a share that does not
    // depend on the load: together at least a fifth of format 2's bytes at the same
    // frames.
    assert!(
        after * 5 <= before * 4,
        "format {FORMAT_VERSION} at most 4/5 of format 2: {before} -> {after}"
    );
    // Format 4's socket table: 4.6% here (10.64 -> 10.15 B/event); 14% on issue 17's
    // load (12.11 -> 10.41), nearly all socket I/O.
    assert!(
        after * 100 <= v3_bytes * 97,
        "format 4 at most 97% of format 3: {v3_bytes} -> {after}"
    );
    let mut back = RecordReader::open(&v3).expect("open v3");
    assert_eq!(back.header.format_version, FORMAT_VERSION);
    let mut got = Vec::new();
    while let Some(batch) = back.next_batch().expect("read v3") {
        got.push(batch.len());
    }
    let want: Vec<usize> = frames.iter().map(|f| f.len()).filter(|&l| l > 0).collect();
    assert_eq!(got, want, "one batch per flush, as written");
    let mut back = RecordReader::open(&v3).expect("open v3");
    assert!(
        back.read_all().expect("read v3") == events,
        "every event back exactly"
    );
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

/// A socket I/O of `pid` on `fd`.
fn io_event(i: u64, pid: u32, fd: i32, sock: Option<Sock>) -> Event {
    Event {
        pid,
        tid: pid + 1,
        body: Some(Body::Io(crate::ingest::model::SockIo {
            sock,
            dir: 1 + (i % 2) as i32,
            fd,
            bytes: 100 + i,
            ..Default::default()
        })),
        ..event(i)
    }
}

fn tcp(skaddr: u64, sport: u32) -> Sock {
    Sock {
        skaddr,
        saddr: vec![10, 0, 0, 1],
        sport,
        daddr: vec![10, 0, 0, 2],
        dport: 8000,
    }
}

/// What format 4's socket table must carry through: sockets repeated on their fd and
/// on others, missing and empty and partial ones, source addresses that begin with
/// the table's marks, a kernel address reused for a new connection, every kind that
/// has a socket, and more sockets and fds than the table keeps.
fn awkward_socket_events() -> Vec<Event> {
    let mut events = Vec::new();
    let mut i = 0;
    let mut push = |e: Event| {
        i += 1;
        events.push(Event { ts_ns: i, ..e });
    };
    for round in 0..3 {
        push(io_event(0, 7, 3, Some(tcp(0xffff_8000, 40_000))));
        push(io_event(0, 7, 3, Some(tcp(0xffff_8000, 40_000))));
        push(io_event(0, 8, 3, Some(tcp(0xffff_8000, 40_000)))); // another pid, same fd
        push(io_event(0, 7, 4, Some(tcp(0xffff_8000, 40_000)))); // dup'ed fd
        push(io_event(0, 7, -1, Some(tcp(0xffff_8000, 40_000))));
        push(io_event(0, 7, 3, None));
        push(io_event(0, 7, 3, Some(Sock::default())));
        push(io_event(0, 7, 3, Some(Sock::default())));
        push(io_event(0, 7, 3, Some(tcp(0xffff_8000, 40_000))));
        push(io_event(
            0,
            7,
            5,
            Some(Sock {
                sport: 9,
                ..Sock::default()
            }),
        ));
        push(io_event(
            0,
            7,
            5,
            Some(Sock {
                skaddr: 3,
                ..Sock::default()
            }),
        ));
        push(io_event(
            0,
            7,
            5,
            Some(Sock {
                saddr: vec![0],
                ..Sock::default()
            }),
        ));
        push(io_event(
            0,
            7,
            5,
            Some(Sock {
                saddr: vec![1],
                ..Sock::default()
            }),
        ));
        push(io_event(
            0,
            7,
            5,
            Some(Sock {
                saddr: vec![1, 1],
                ..Sock::default()
            }),
        ));
        push(io_event(0, 7, 5, None));
        let long = Sock {
            saddr: vec![2; 40],
            ..tcp(0xffff_8000, 40_000)
        };
        push(io_event(0, 7, 3, Some(long.clone())));
        push(io_event(0, 7, 3, Some(long)));
        push(io_event(0, 7, 3, Some(tcp(0xffff_8000, 40_000))));
        // The kernel reuses the address for a new connection on the same fd.
        push(io_event(0, 7, 3, Some(tcp(0xffff_8000, 40_001 + round))));
        push(io_event(0, 7, 3, Some(tcp(0xffff_8000, 40_001 + round))));
        for body in [
            Body::State(StateChange {
                sock: Some(tcp(0xffff_8000, 40_001 + round)),
                old: 1,
                new: 7,
            }),
            Body::State(StateChange::default()),
            Body::Accept(crate::ingest::model::Accept {
                sock: Some(tcp(0xffff_9000, 80)),
                fd: 3,
            }),
            Body::Accept(crate::ingest::model::Accept { sock: None, fd: 3 }),
            Body::Retransmit(crate::ingest::model::Retransmit {
                sock: Some(tcp(0xffff_9000, 80)),
                state: 1,
            }),
            Body::Retransmit(crate::ingest::model::Retransmit {
                sock: Some(Sock::default()),
                state: 1,
            }),
        ] {
            push(Event {
                body: Some(body),
                ..event(0)
            });
        }
    }
    // More connections than the table's slots, on more fds than it keeps, then the
    // first ones again (evicted and forgotten by then).
    let many = super::frame::SOCK_SLOTS as u64 + 100;
    for k in (0..many).chain(0..50) {
        let fd = (k % (super::frame::FD_KEYS as u64 + 7)) as i32;
        push(io_event(k, 9, fd, Some(tcp(0x1000 + k, k as u32))));
        push(io_event(k, 9, fd, Some(tcp(0x1000 + k, k as u32))));
    }
    events
}

#[test]
fn sockets_seen_before_read_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let events = awkward_socket_events();
    for frame_events in [1, 7, 1000] {
        let frames: Vec<&[Event]> = events.chunks(frame_events).collect();
        write_live(&path, header(), &frames);
        let mut r = RecordReader::open(&path).expect("open");
        assert_eq!(r.header.format_version, FORMAT_VERSION);
        let back = r.read_all().expect("read");
        assert_eq!(back.len(), events.len());
        for (got, want) in back.iter().zip(&events) {
            assert_eq!(
                got, want,
                "frames of {frame_events}: event {} back exactly",
                want.ts_ns
            );
        }
    }
}

#[test]
fn sockets_seen_before_take_a_fraction_of_their_bytes() {
    // I/O on 16 connections in an order zstd cannot foresee: each socket after its
    // first is left out in format 4, where format 3 repeats it.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let events: Vec<Event> = (0..5000)
        .map(|i| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let c = seed % 16;
            let skaddr = 0xffff_8880_0000_0000 + c * 0x1_2345_6780;
            let mut e = io_event(i, 7, 3 + c as i32, Some(tcp(skaddr, 40_000 + c as u32)));
            e.ts_ns = i * 1000 + (seed >> 40) % 1000;
            e
        })
        .collect();
    let (v3, v4) = (dir.path().join("v3"), dir.path().join("v4"));
    write_format_3(&v3, &events, 500);
    let frames: Vec<&[Event]> = events.chunks(500).collect();
    let after = write_live(&v4, header(), &frames);
    let before = std::fs::metadata(&v3).expect("meta").len() - HEADER_REGION;
    println!("format 3 {before} bytes, format 4 {after}");
    assert!(
        after * 4 <= before * 3,
        "format 4 at most 3/4 of format 3 on repeated sockets: {before} -> {after}"
    );
}

#[test]
fn broken_socket_references_are_errors() {
    // Format 3 writes sockets as they are; read as format 4, these are references to
    // nothing.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let cases = [
        (io_event(0, 7, 3, None), "no socket before on fd 3 of pid 7"),
        (
            io_event(
                0,
                7,
                3,
                Some(Sock {
                    skaddr: 5,
                    ..Sock::default()
                }),
            ),
            "a reference to socket slot 5, never filled",
        ),
        (
            io_event(
                0,
                7,
                3,
                Some(Sock {
                    skaddr: 5,
                    dport: 1,
                    ..Sock::default()
                }),
            ),
            "a socket reference with an address",
        ),
        (
            io_event(0, 7, 3, Some(tcp(1, 2))),
            "a socket written whole marked 10",
        ),
        (
            io_event(
                0,
                7,
                3,
                Some(Sock {
                    saddr: vec![0; 18],
                    ..tcp(1, 2)
                }),
            ),
            "a socket address of 17 bytes in the table",
        ),
    ];
    for (e, want) in cases {
        write_format_3(&path, &[e], 1);
        let mut bytes = std::fs::read(&path).expect("read");
        assert_eq!(
            bytes[12..14],
            [0x08, 3],
            "the header starts with its version"
        );
        bytes[13] = 4;
        std::fs::write(&path, &bytes).expect("write");
        let err = RecordReader::open(&path)
            .expect("open")
            .read_all()
            .expect_err(want);
        assert!(err.to_string().contains(want), "{want}: got {err}");
    }
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

/// Encode cost per event and size, format 2 against 3 and 4 (at zstd levels around the
/// default), at live-sized frames of the lab recording:
/// `cargo test --release -p tokenscope-collector --lib encode_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a benchmark: run in release and read the figures"]
fn encode_cost_per_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, events) = fixture_events(dir.path());
    let frames = live_frames(&events);
    let n = events.len() as f64;
    // Each pass clones the frames' events first (the writer is handed owned events),
    // untimed; the best of several passes.
    let best = |f: &mut dyn FnMut(Vec<Vec<Event>>) -> usize| {
        let mut bytes = 0;
        let ns = (0..9)
            .map(|_| {
                let owned: Vec<Vec<Event>> = frames.iter().map(|f| f.to_vec()).collect();
                let t = std::time::Instant::now();
                bytes = f(owned);
                t.elapsed().as_nanos() as f64 / n
            })
            .fold(f64::MAX, f64::min);
        (ns, bytes as f64 / n)
    };
    let (ns, size) = best(&mut |owned| {
        owned
            .into_iter()
            .map(|events| {
                let batch = EventBatch {
                    events,
                    ..Default::default()
                };
                zstd::bulk::compress(&batch.encode_to_vec(), 3)
                    .expect("zstd")
                    .len()
            })
            .sum()
    });
    println!("format 2 (zstd 3 per frame): {ns:.0} ns/event, {size:.1} B/event");
    for (version, level) in [(3, 3), (4, 1), (4, 3), (4, 6)] {
        let (ns, size) = best(&mut |owned| {
            let mut enc = frame::Encoder::for_format(version, level).expect("encoder");
            let mut out = Vec::new();
            for events in owned {
                drop(enc.frame(events, &mut out).expect("frame"));
            }
            out.len()
        });
        println!("format {version} (zstd {level} streamed): {ns:.0} ns/event, {size:.1} B/event");
    }
}

#[test]
fn compressed_frames_are_several_times_smaller_than_plain_ones() {
    // A committed lab recording's events, written in both formats.
    let dir = tempfile::tempdir().expect("tempdir");
    let (header, events) = fixture_events(dir.path());
    let v1 = dir.path().join("v1.tsrec");
    write_format_1(&v1, &events);
    let v3 = dir.path().join("v3.tsrec");
    let mut w = RecordWriter::create(&v3, header.clone()).expect("create");
    for e in &events {
        w.push(e.clone()).expect("push");
    }
    w.finish(header.counters.unwrap_or_default(), header.end_monotonic_ns)
        .expect("finish");
    let body = |p: &Path| std::fs::metadata(p).expect("meta").len() - HEADER_REGION;
    let (before, after) = (body(&v1), body(&v3));
    let n = events.len() as u64;
    println!(
        "{n} events: format 1 {before} bytes ({} B/event), format {FORMAT_VERSION} {after} bytes ({} B/event), {:.1}x",
        before / n,
        after / n,
        before as f64 / after as f64
    );
    assert!(
        after * 4 <= before,
        "at least 4x smaller: {before} -> {after}"
    );
    let mut back = RecordReader::open(&v3).expect("open v3");
    assert_eq!(back.header.format_version, FORMAT_VERSION);
    assert_eq!(back.read_all().expect("read v3"), events, "the same events");
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
fn batches_read_by_hand_are_what_prost_reads() {
    use prost::encoding::{encode_key, encode_varint, WireType};
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, events) = fixture_events(dir.path());
    let batch = EventBatch {
        events: events.clone(),
        ts_deltas: vec![1, 2, 3],
        prints: vec![u64::MAX, 7],
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
        saddr: vec![10, 0, 0, 1],
        sport: 9,
        daddr: vec![1; 16],
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
    ];
    for (what, body) in &cases {
        let one = field(1, WireType::LengthDelimited, body);
        decodes_as_prost_does(&one, what);
        let mut two = one.clone();
        two.extend(field(2, WireType::Varint, &varint(4)));
        two.extend(one);
        decodes_as_prost_does(&two, what);
    }
}
