//! A replay holds events as long as its recording says they came out of order, and
//! gives what the default second gives.

use super::*;
use crate::ingest::record::{write_recording, RecordReader};

#[test]
fn a_recording_replayed_in_a_window_its_own_disorder_long_gives_what_the_second_gives() {
    for name in ["tuned-plain", "gpu-cool"] {
        let (old, events) = fixture(name);
        // The committed fixtures predate the field: written again, the writer says.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("again.tsrec");
        write_recording(&path, &old, &events);
        let known = RecordReader::open(&path).expect("open").header;
        let disorder = known.disorder_ns.expect("a finished recording says");
        assert!(
            disorder > 0 && disorder < 1_000_000_000,
            "{name}: out of order a little, as recorders write: {disorder} ns"
        );
        assert_eq!(pipeline::Config::replay_of(&known).reorder_ns, disorder);
        let unknown = FileHeader {
            disorder_ns: None,
            ..known.clone()
        };
        let report = |h: &FileHeader| {
            let r = crate::export::report::build(h, &events);
            let mut json = Vec::new();
            crate::export::report::write_json(&r, &mut json).expect("json");
            (r.recording.late_events, r.requests.len(), json)
        };
        let (late, requests, json) = report(&known);
        assert_eq!(late, 0, "{name}: no event later than the window");
        assert!(requests > 0, "{name}: requests built");
        assert!(
            json == report(&unknown).2,
            "{name}: the report is the one the default second gives"
        );
        // Not vacuous: held for no time, the same events are used out of order.
        let sorted = FileHeader {
            disorder_ns: Some(0),
            ..known.clone()
        };
        assert!(
            report(&sorted).0 > 0,
            "{name}: late events without a window"
        );
        let trace = |h: &FileHeader| {
            let mut buf = Vec::new();
            write_trace(h, &events, &mut buf).expect("trace written");
            buf
        };
        assert!(
            trace(&known) == trace(&unknown),
            "{name}: the trace is the one the default second gives"
        );
    }
}
