//! Privileged: a flood into a one-page ring buffer forces drops; the sealed
//! recording must account for every record: submitted = delivered + dropped,
//! in the file header and in `tokenscope dump`.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use test_support::*;

#[test]
fn forced_drops_are_counted_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let rec = Recorder::start(
        dir.path(),
        &["--port", &port.to_string(), "--ring-size", "4096"],
    );

    let sink = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
        }
        total
    });
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    const SENDS: usize = 50_000;
    for _ in 0..SENDS {
        s.write_all(b"x").expect("send one byte");
    }
    drop(s);
    assert_eq!(sink.join().expect("sink"), SENDS, "every byte arrived");
    let path = rec.path.clone();
    rec.stop();

    let (header, events) = read_recording(&path);
    let c = header.counters.expect("a sealed recording has counters");
    assert!(
        c.dropped > 0,
        "a 4 KiB ring under a {SENDS}-send flood must drop: {c:?}"
    );
    assert_eq!(
        c.submitted,
        c.delivered + c.dropped,
        "submitted = delivered + dropped: {c:?}"
    );
    assert_eq!(
        c.delivered + c.gpu_samples + c.ring_readings,
        c.written + c.decode_errors,
        "every delivered record (and NVML sample, and ring reading) is written or counted: {c:?}"
    );
    // When the drops happened: readings written as they moved, running totals.
    let readings: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match &e.body {
            Some(collector::ingest::model::event::Body::Ring(r)) => Some((e.ts_ns, r.dropped)),
            _ => None,
        })
        .collect();
    assert_eq!(readings.len() as u64, c.ring_readings, "readings counted");
    assert!(
        !readings.is_empty()
            && readings
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1),
        "drops over time: rising readings in time order: {readings:?}"
    );
    assert_eq!(
        readings.last().map(|r| r.1),
        Some(c.dropped),
        "the last reading is the recording's total"
    );
    assert_eq!(
        c.written,
        events.len() as u64,
        "the header's count matches the events in the file"
    );

    let dump = std::process::Command::new(profiler())
        .arg("dump")
        .arg(&path)
        .arg("--limit")
        .arg("1")
        .output()
        .expect("dump");
    let text = String::from_utf8_lossy(&dump.stdout);
    let expected = format!(
        "submitted {} delivered {} dropped {}",
        c.submitted, c.delivered, c.dropped
    );
    assert!(
        text.contains(&expected),
        "dump reports the counters ({expected}):\n{text}"
    );
    assert!(
        text.contains("WARNING: events were dropped"),
        "dump warns about drops:\n{text}"
    );
}
