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

/// A format 1 file as tokenscope wrote them before frames were compressed.
fn write_format_1(path: &Path, events: &[Event]) {
    let mut h = header();
    h.format_version = 1;
    h.complete = true;
    let body = h.encode_to_vec();
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes.resize(HEADER_REGION as usize, 0);
    for chunk in events.chunks(BATCH_EVENTS) {
        let batch = EventBatch {
            events: chunk.to_vec(),
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

#[test]
fn compressed_frames_are_several_times_smaller_than_plain_ones() {
    // A committed lab recording's events, written in both formats.
    let gz = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/diagnose/tuned-plain.tsrec.gz");
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(File::open(&gz).expect("fixture"))
        .read_to_end(&mut bytes)
        .expect("gunzip");
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = dir.path().join("fixture.tsrec");
    std::fs::write(&fixture, &bytes).expect("write");
    let mut r = RecordReader::open(&fixture).expect("open");
    let header = r.header.clone();
    let events = r.read_all().expect("read");
    let v1 = dir.path().join("v1.tsrec");
    write_format_1(&v1, &events);
    let v2 = dir.path().join("v2.tsrec");
    let mut w = RecordWriter::create(&v2, header.clone()).expect("create");
    for e in &events {
        w.push(e.clone()).expect("push");
    }
    w.finish(header.counters.unwrap_or_default(), header.end_monotonic_ns)
        .expect("finish");
    let body = |p: &Path| std::fs::metadata(p).expect("meta").len() - HEADER_REGION;
    let (before, after) = (body(&v1), body(&v2));
    let n = events.len() as u64;
    println!(
        "{n} events: format 1 {before} bytes ({} B/event), format 2 {after} bytes ({} B/event), {:.1}x",
        before / n,
        after / n,
        before as f64 / after as f64
    );
    assert!(
        after * 4 <= before,
        "at least 4x smaller: {before} -> {after}"
    );
    let mut back = RecordReader::open(&v2).expect("open v2");
    assert_eq!(back.header.format_version, FORMAT_VERSION);
    assert_eq!(back.read_all().expect("read v2"), events, "the same events");
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
