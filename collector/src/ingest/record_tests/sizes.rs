//! Frame sizes and encode cost on the committed lab recording, framed as a live recorder frames it.

use super::*;

/// The committed lab recording's header and events.
pub(super) fn fixture_events(dir: &Path) -> (FileHeader, Vec<Event>) {
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
    let mut events = r.read_all().expect("read");
    // As a recorder since be611d6 writes them: the sniffs' own fingerprints 0 (the
    // fixture is older).
    for e in &mut events {
        if let Some(Body::Io(crate::ingest::model::SockIo { sniff: Some(s), .. })) = &mut e.body {
            s.fingerprint = 0;
            for h in &mut s.h2_streams {
                if let Some(inner) = &mut h.sniff {
                    inner.fingerprint = 0;
                }
            }
        }
    }
    (header, events)
}

/// Frames as a live recorder writes them, one per 200 ms by the events' own clock
/// (`record` writes one per drain, every 500 ms or sooner: smaller frames are the
/// harder case for compression, and the figures in README are these).
pub(super) fn live_frames(events: &[Event]) -> Vec<&[Event]> {
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

pub(super) fn write_live(path: &Path, header: FileHeader, frames: &[&[Event]]) -> u64 {
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
    write_format_frames(&old, &frames, 3);
    let v3_bytes = std::fs::metadata(&old).expect("meta").len() - HEADER_REGION;
    let v5 = dir.path().join("old-v5.tsrec");
    write_format_frames(&v5, &frames, 5);
    let v5_bytes = std::fs::metadata(&v5).expect("meta").len() - HEADER_REGION;
    let n = events.len() as f64;
    println!(
        "{n} events in {} frames of 200 ms ({:.0} events each): format 2 {before} bytes \
         ({:.2} B/event), format 3 {v3_bytes} bytes ({:.2} B/event), format 5 {v5_bytes} \
         bytes ({:.2} B/event), format {FORMAT_VERSION} {after} bytes ({:.2} B/event)",
        frames.len(),
        n / frames.len() as f64,
        before as f64 / n,
        v3_bytes as f64 / n,
        v5_bytes as f64 / n,
        after as f64 / n,
    );
    // Format 6 leaves the zero fingerprints out of the prints column.
    assert!(
        after < v5_bytes,
        "format {FORMAT_VERSION} smaller than format 5: {v5_bytes} -> {after}"
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
    super::write_recording(&v3, &header, &events);
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
