//! Format 5's columns: every shape and flag they carry reads back exactly, what does not
//! fit them stays whole, the fixture's I/Os and libcuda calls go to them, and damaged
//! columns are errors.

use super::*;
use crate::ingest::model::{BodyPrint, CudaCall, Sniff, SockIo, SseEvent};
use crate::ingest::record::columns::{expand, Columns};

fn io(i: u64, sock: Option<Sock>, sniff: Option<Sniff>) -> Event {
    Event {
        ts_ns: 1_000 + i,
        pid: 7,
        tid: 8 + (i % 2) as u32,
        cpu: (i % 4) as u32,
        comm: "nginx".into(),
        body: Some(Body::Io(SockIo {
            sock,
            dir: 1 + (i % 2) as i32,
            syscall: (i % 9) as i32,
            fd: 3,
            bytes: 100 + i,
            captured: 100 + i as u32,
            sniff,
            ..Default::default()
        })),
    }
}

fn sse(kind: i32, api: i32, choice: u32, token: i32) -> SseEvent {
    SseEvent {
        fingerprint: 11 + u64::from(choice),
        kind,
        api,
        choice,
        token,
        text_print: 13,
    }
}

fn cuda(i: u64, api: i32, result: i64) -> Event {
    Event {
        ts_ns: 1_000 + i,
        pid: 7,
        tid: 9,
        comm: "python".into(),
        body: Some(Body::Cuda(CudaCall {
            api,
            entry: i.is_multiple_of(2),
            stream: u64::MAX - i,
            bytes: i << 40,
            result,
            per_thread_stream: i.is_multiple_of(3),
        })),
        ..Default::default()
    }
}

/// Every column and flag, values at their ends, and values past the columns' ranges
/// (which must go whole).
fn columnar_events() -> Vec<Event> {
    let sock = Some(Sock {
        skaddr: 0xffff_8000,
        saddr: vec![10, 0, 0, 1].into(),
        sport: 40_000,
        daddr: vec![10, 0, 0, 2].into(),
        dport: 8000,
    });
    let mut events = vec![io(0, sock.clone(), None)];
    let sniffs = [
        Sniff::default(),
        Sniff {
            message_start: true,
            body_bytes: 228,
            sse: vec![sse(2, 2, 0, 0)].into(),
            ..Default::default()
        },
        Sniff {
            message_end: true,
            unparsed: true,
            compressed: true,
            body_bytes: u64::MAX,
            sse: vec![sse(1, 9, 0, 2), sse(2, 3, 5, 1), sse(3, 0, u32::MAX, 0)].into(),
            limits: 0b101,
            body_print: Some(BodyPrint {
                hash: 17,
                length: 1 << 40,
            }),
            ..Default::default()
        },
        Sniff {
            body_print: Some(BodyPrint::default()),
            ..Default::default()
        },
    ];
    for (i, sniff) in sniffs.into_iter().enumerate() {
        events.push(io(1 + i as u64, sock.clone(), Some(sniff)));
    }
    let mut odd = io(10, sock.clone(), None);
    if let Some(Body::Io(x)) = &mut odd.body {
        x.fd = -1;
        x.payload_fault = true;
        x.bytes = u64::MAX;
        x.captured = u32::MAX;
    }
    events.push(odd);
    // Past the columns' ranges: whole events, read back all the same.
    for (dir, syscall, kind, api) in [(7, 1, 2, 2), (1, -1, 2, 2), (1, 1, 9, 2), (1, 1, 2, -1)] {
        let mut e = io(
            20,
            sock.clone(),
            Some(Sniff {
                sse: vec![sse(kind, api, 1, 0)].into(),
                ..Default::default()
            }),
        );
        if let Some(Body::Io(x)) = &mut e.body {
            x.dir = dir;
            x.syscall = syscall;
        }
        events.push(e);
    }
    for (i, (api, result)) in [(1, 0), (6, -1), (8, i64::MIN), (-5, 3), (1 << 20, 1)]
        .into_iter()
        .enumerate()
    {
        events.push(cuda(30 + i as u64, api, result));
    }
    events.push(io(40, None, None));
    events
}

#[test]
fn every_columnar_shape_reads_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    let events = columnar_events();
    // One frame, and a frame per event (the socket table and comms across frames).
    for frame_events in [events.len(), 1] {
        let frames: Vec<&[Event]> = events.chunks(frame_events).collect();
        write_live(&path, header(), &frames);
        let mut r = RecordReader::open(&path).expect("open");
        assert_eq!(r.header.format_version, FORMAT_VERSION);
        assert!(
            r.read_all().expect("read") == events,
            "every event back ({frame_events} a frame)"
        );
    }
    let back = crate::ingest::record::frame::repack(vec![events.clone(), events.clone()]);
    assert!(back == Ok(vec![events.clone(), events]), "repacked");
}

/// Sniffs whose own fingerprints are not 0 (recordings before be611d6, or a file
/// written by hand), on their own and inside an HTTP/2 stream: format 6 keeps them in
/// their events, whole; format 5 in the prints column. Both read every one back.
#[test]
fn sniff_fingerprints_read_back_in_formats_5_and_6() {
    use crate::ingest::model::H2StreamSniff;
    let mut events = columnar_events();
    let sock = events[0].sock().cloned();
    for (i, fingerprint) in [(50, 7), (51, u64::MAX), (52, 0)] {
        events.push(io(
            i,
            sock.clone(),
            Some(Sniff {
                fingerprint,
                sse: vec![sse(2, 2, 0, 1)].into(),
                h2_streams: vec![H2StreamSniff {
                    stream_id: 1,
                    sniff: Some(Sniff {
                        fingerprint: fingerprint ^ 1,
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        ));
        events.push(io(
            i + 10,
            sock.clone(),
            Some(Sniff {
                fingerprint,
                message_end: true,
                ..Default::default()
            }),
        ));
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for version in [5, FORMAT_VERSION] {
        let path = dir.path().join(format!("v{version}.tsrec"));
        write_format_frames(&path, &[&events[..20], &events[20..]], version);
        let mut r = RecordReader::open(&path).expect("open");
        assert_eq!(r.header.format_version, version);
        assert!(
            r.read_all().expect("read") == events,
            "format {version}: every fingerprint back"
        );
    }
    let (_, columnar) = columnar_batch(&events);
    let (_, zeroed) = columnar_batch(&events[..events.len() - 6]);
    assert_eq!(
        columnar,
        zeroed + 1,
        "of the six, only the one without fingerprint or HTTP/2 fits the columns"
    );
}

/// The packed batch of `events` (one frame of a new file) through the columns, and
/// how many of its events went to the columns.
fn columnar_batch(events: &[Event]) -> (Vec<u8>, usize) {
    let mut batch = EventBatch {
        events: events.to_vec(),
        ..Default::default()
    };
    frame::pack_for_tests(&mut batch);
    let mut plain = Vec::new();
    Columns::default().encode(&batch, &mut plain);
    let read = batch::decode(&plain).expect("decodes");
    (plain, read.shapes.len() - read.events.len())
}

#[test]
fn the_fixtures_ios_and_libcuda_calls_go_to_the_columns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, events) = fixture_events(dir.path());
    let (ios, cudas) = events.iter().fold((0, 0), |(i, c), e| match e.body {
        Some(Body::Io(_)) => (i + 1, c),
        Some(Body::Cuda(_)) => (i, c + 1),
        _ => (i, c),
    });
    assert!(
        ios > 1000 && cudas > 100,
        "{ios} I/Os, {cudas} libcuda calls"
    );
    let (_, columnar) = columnar_batch(&events);
    // The rest: each thread's first event (its comm), sockets seen first, HTTP heads.
    assert!(
        columnar * 100 >= (ios + cudas) * 90,
        "{columnar} of {} I/Os and libcuda calls in the columns",
        ios + cudas
    );
    let (_, columnar) = columnar_batch(&columnar_events());
    // Four I/Os and two calls: the rest are first sights (comms, the socket) or out of
    // the columns' ranges.
    assert_eq!(columnar, 6, "the events that fit the columns");
}

/// `expand` of a batch with its own shapes and columns (as `batch::decode` copies them).
fn expand_own(b: &mut EventBatch) -> Result<(), String> {
    let (shapes, columns) = (b.shapes.clone(), b.columns.clone());
    expand(b, &shapes, &columns, Vec::new())
}

#[test]
fn damaged_columns_are_errors() {
    let events = columnar_events();
    let (plain, _) = columnar_batch(&events);
    let good = batch::decode(&plain).expect("decodes");
    let mut damaged = Vec::new();
    let mut damage = |what: &str, edit: &dyn Fn(&mut EventBatch)| {
        let mut b = good.clone();
        edit(&mut b);
        damaged.push((what.to_string(), expand_own(&mut b)));
    };
    damage("no columns", &|b| b.columns.clear());
    damage("columns cut short", &|b| {
        b.columns.truncate(b.columns.len() - 1)
    });
    damage("a byte past the columns", &|b| b.columns.push(0));
    damage("a shape unknown", &|b| b.shapes[0] = 9);
    damage("more shapes than events", &|b| b.shapes.push(1));
    damage("fewer shapes than events", &|b| {
        b.shapes.pop();
    });
    damage("a whole event more", &|b| b.events.push(Event::default()));
    damage("columns without shapes", &|b| b.shapes.clear());
    damage("every byte 0xff", &|b| b.columns.fill(0xff));
    for (what, result) in damaged {
        assert!(result.is_err(), "{what}: {result:?}");
    }
    let mut b = good;
    expand_own(&mut b).expect("the undamaged batch expands");
    assert_eq!(b.events.len(), events.len());
}

/// A batch handed back (`RecordReader::recycle`) has the next frame written over its
/// events where they lie: what is read is what a reader without it reads, whatever the
/// recycled events held (HTTP heads, libcuda calls, and sniffs with every field set).
#[test]
fn frames_written_over_recycled_batches_read_back_exactly() {
    use crate::ingest::model::H2StreamSniff;
    let dir = tempfile::tempdir().expect("tempdir");
    let (header, fixture) = fixture_events(dir.path());
    let path = dir.path().join("r.tsrec");
    let frames: Vec<&[Event]> = fixture.chunks(700).collect();
    write_live(&path, header, &frames);
    let want = RecordReader::open(&path)
        .expect("open")
        .read_all()
        .expect("read");
    // First a batch of other events, longer than a frame, every sniff field set.
    let mut other: Vec<Event> = fixture.iter().rev().cloned().collect();
    for e in &mut other {
        if let Some(Body::Io(io)) = &mut e.body {
            // Every field set, none left to `..` (a field added must be set here).
            *io = SockIo {
                sock: io.sock.take(),
                dir: 3,
                syscall: 4,
                fd: 99,
                bytes: 1 << 40,
                captured: 7,
                payload_fault: true,
                sniff: io.sniff.take(),
            };
            let s = io.sniff.get_or_insert_with(Sniff::default);
            s.fingerprint = 5;
            s.message_start = true;
            s.message_end = true;
            s.body_bytes = 9;
            s.body_print = Some(BodyPrint { hash: 1, length: 2 });
            s.sse.push(sse(1, 1, 3, 1));
            s.unparsed = true;
            s.compressed = true;
            s.prefix_prints = vec![1, 2];
            s.h2_streams = vec![H2StreamSniff::default()];
            s.h2_control_frames = 1;
            s.h2_errors = 1;
            s.h2_preface = true;
            s.limits = 1;
        }
    }
    let mut r = RecordReader::open(&path).expect("open");
    r.recycle(other);
    let (mut got, mut reused) = (Vec::new(), 0);
    let mut last = None;
    while let Some(batch) = r.next_batch().expect("read") {
        reused += usize::from(last == Some(batch.as_ptr()));
        last = Some(batch.as_ptr());
        got.extend(batch.iter().cloned());
        r.recycle(batch);
    }
    assert!(
        frames.len() > 3 && reused + 1 >= frames.len(),
        "{reused} of {} frames read into the batch before",
        frames.len()
    );
    assert_eq!(got.len(), want.len());
    let differ = got.iter().zip(&want).position(|(g, w)| g != w);
    assert!(
        differ.is_none(),
        "event {differ:?} differs from a fresh read"
    );
}
