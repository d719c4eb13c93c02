//! How far out of time order a recording's events came, as its header says.

use super::*;

#[test]
fn a_finished_recording_says_how_far_out_of_time_order_its_events_came() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.tsrec");
    // A header copied from another recording says nothing of this one's order.
    let copied = FileHeader {
        disorder_ns: Some(7),
        ..header()
    };
    let mut w = RecordWriter::create(&path, copied).expect("create");
    // Newest so far, less each: 0, 0, 20 (1_030 - 1_010), 0, 45 (1_050 - 1_005), 0.
    for ts in [1_000, 1_030, 1_010, 1_050, 1_005, 1_060] {
        w.push(Event {
            ts_ns: ts,
            ..event(0)
        })
        .expect("push");
    }
    w.flush().expect("flush");
    let open = RecordReader::open(&path).expect("open").header;
    assert_eq!(open.disorder_ns, None, "not known before the end");
    w.update_header(|h| h.disorder_ns = Some(1))
        .expect("update");
    let updated = RecordReader::open(&path).expect("open").header;
    assert_eq!(updated.disorder_ns, None, "nor set by an update");
    w.finish(Counters::default(), 99).expect("finish");
    let done = RecordReader::open(&path).expect("open").header;
    assert_eq!(done.disorder_ns, Some(45));
}
