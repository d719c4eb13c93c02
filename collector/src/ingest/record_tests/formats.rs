//! Files as older tokenscopes wrote them (formats 1 to 5) still read; a newer format is
//! refused naming its version.

use super::*;

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
pub(super) fn write_format_1(path: &Path, events: &[Event]) {
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
pub(super) fn write_format_2(path: &Path, events: &[Event], frame_events: usize) {
    let mut bytes = old_file_start(2);
    for chunk in events.chunks(frame_events) {
        bytes.extend_from_slice(&format_2_frame(chunk));
    }
    std::fs::write(path, bytes).expect("write");
}

pub(super) fn format_2_frame(events: &[Event]) -> Vec<u8> {
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
pub(super) fn write_format_3(path: &Path, events: &[Event], frame_events: usize) {
    let frames: Vec<&[Event]> = events.chunks(frame_events).collect();
    write_format_frames(path, &frames, 3);
}

/// A file of `version` (3 or later), from that format's writer, a frame per slice.
pub(super) fn write_format_frames(path: &Path, frames: &[&[Event]], version: u32) {
    let mut w = RecordWriter::create_format(path, header(), version).expect("create");
    for frame in frames {
        for e in *frame {
            w.push(e.clone()).expect("push");
        }
        w.flush().expect("flush");
    }
    w.finish(Counters::default(), 1).expect("finish");
}

#[test]
fn formats_3_to_5_files_still_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = awkward_socket_events();
    let frames: Vec<&[Event]> = events.chunks(100).collect();
    for version in [3, 4, 5] {
        let path = dir.path().join(format!("v{version}.tsrec"));
        write_format_frames(&path, &frames, version);
        let mut r = RecordReader::open(&path).expect("open");
        assert_eq!(r.header.format_version, version);
        assert!(
            r.read_all().expect("read") == events,
            "format {version}: every event back"
        );
    }
}

/// A format 5 file as the format 5 writer wrote it (committed: the layout, not today's
/// writer asked for version 5): the committed lab recording `tuned-plain` (format 2,
/// from before be611d6, so its sniffs' fingerprints are not 0 and went to the prints
/// column), rewritten by `tokenscope-lab replicate --times 1` at b5f134a. Every event
/// reads back as the original's.
#[test]
fn a_committed_format_5_file_reads_as_its_original() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = |name: &str| {
        let gz = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(format!("{name}.tsrec.gz"));
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(&gz).expect("fixture")),
            &mut bytes,
        )
        .expect("gunzip");
        let path = dir.path().join(format!("{}.tsrec", name.replace('/', "-")));
        std::fs::write(&path, bytes).expect("write");
        let mut r = RecordReader::open(&path).expect("open");
        let events = r.read_all().expect("read");
        (r.header.format_version, events)
    };
    let (version, v5) = fixture("formats/tuned-plain-v5");
    assert_eq!(version, 5);
    let (_, events) = fixture("diagnose/tuned-plain");
    let fingerprinted = events
        .iter()
        .filter(|e| {
            e.io()
                .and_then(|io| io.sniff.as_ref())
                .is_some_and(|s| s.fingerprint != 0)
        })
        .count();
    assert!(
        fingerprinted > 1000,
        "{fingerprinted} sniffs with fingerprints"
    );
    assert_eq!(v5.len(), events.len());
    assert!(
        v5 == events,
        "every event of the format 5 file as the original's"
    );
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
