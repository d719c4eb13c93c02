//! Tests of zstd frames ended inside a file's one zstd stream: read back exactly,
//! across many boundaries and with a crash cut inside one.

use super::*;

/// zstd frames in a file's bytes (each begins with the magic number; compressed bytes
/// could hold it by chance, which would only raise the count).
fn zstd_frames_in(path: &Path) -> usize {
    let bytes = std::fs::read(path).expect("read");
    bytes
        .windows(4)
        .filter(|w| *w == [0x28, 0xb5, 0x2f, 0xfd])
        .count()
}

/// Writes `events` in record frames of 100, with zstd frames ended before `limit` plain
/// bytes (None: the writer's own limit); finished, or left as a crash leaves it.
fn write_in_zstd_frames(path: &Path, events: &[Event], limit: Option<usize>, finish: bool) {
    let mut w = RecordWriter::create(path, header()).expect("create");
    if let Some(limit) = limit {
        w = w.with_zstd_frame_limit(limit);
    }
    for frame in events.chunks(100) {
        for e in frame {
            w.push(e.clone()).expect("push");
        }
        w.flush().expect("flush");
    }
    if !finish {
        return;
    }
    let n = events.len() as u64;
    let c = Counters {
        submitted: n,
        delivered: n,
        ..Default::default()
    };
    w.finish(c, 1).expect("finish");
}

#[test]
fn a_stream_of_many_zstd_frames_reads_back_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A new zstd frame every record frame or two, each next one led by the old one's end.
    let round_trip = |name: &str, n: u64, limit: Option<usize>, finish: bool, frames: usize| {
        let path = dir.path().join(name);
        let events: Vec<Event> = (0..n).map(event).collect();
        write_in_zstd_frames(&path, &events, limit, finish);
        let found = zstd_frames_in(&path);
        assert!(found >= frames, "{name}: {found} zstd frames");
        let mut r = RecordReader::open(&path).expect("open");
        assert_eq!(r.read_all().expect("read"), events, "{name}");
        (path, events)
    };
    let (small, small_events) = round_trip("small.tsrec", 3000, Some(4096), false, 15);
    // The writer's own limit (the window): several MiB of plain input pass it.
    round_trip("large.tsrec", 200_000, None, true, 3);
    // Unfinished (a crash) and cut inside its second zstd frame: it reads to its last
    // whole record frame.
    let bytes = std::fs::read(&small).expect("read");
    let magic = bytes
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == [0x28, 0xb5, 0x2f, 0xfd])
        .map(|(i, _)| i)
        .nth(1)
        .expect("a second zstd frame");
    let cut = dir.path().join("cut.tsrec");
    std::fs::write(&cut, &bytes[..magic + 40]).expect("write");
    let mut r = RecordReader::open(&cut).expect("open");
    let read = r.read_all().expect("a cut tail is not an error");
    assert!(!read.is_empty() && read.len().is_multiple_of(100) && read.len() < small_events.len());
    assert_eq!(
        read,
        small_events[..read.len()],
        "whole record frames, exactly"
    );
}
