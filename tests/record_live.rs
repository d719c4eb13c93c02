//! What a live session hands over (to `agent` and `top`) is what its file reads back:
//! every event, field for field and in the same order, through the compact format
//! (zigzag timestamps, the per-file socket table, columns, zstd frames), on real
//! traffic: the lab engine and its load client as processes of their own (a session
//! never records its own process), several clients connecting at once on both CPUs,
//! and curl. `agent`'s OTLP spans and `report`'s replay of the agent's recordings must
//! agree to the nanosecond (tests/agent_otlp.rs); this is the half of that which does
//! not go through the stitcher. Privileged: it loads the probes.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::process::{Command, Stdio};
use std::time::Duration;

use collector::ingest::model::event::Body;
use collector::ingest::model::TcpState;
use collector::ingest::record::RecordReader;
use collector::ingest::Event;
use collector::record::live::Live;
use collector::record::sink::{Output, Rotation};
use collector::record::RecordOptions;
use test_support::http::curl_status;
use test_support::{free_port, lab, lab_engine_process};

/// Rounds of load: a bench of 12 clients at once, then curls one after another.
const ROUNDS: usize = 2;
const BENCH_REQUESTS: usize = 48;
const CURLS: usize = 6;

fn load(port: u16) {
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    let status = Command::new(lab())
        .args(["bench", "--url", &url, "--concurrency", "12"])
        .args(["--requests", &BENCH_REQUESTS.to_string()])
        .args(["--prompt-tokens", "30", "--max-tokens", "16"])
        .stdout(Stdio::null())
        .status()
        .expect("run the lab bench");
    assert!(status.success(), "bench: {status}");
    let body = r#"{"model":"lab-model","prompt":"a b c","max_tokens":4,"stream":true}"#;
    for _ in 0..CURLS {
        let (code, text) = curl_status(&[
            "-N",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            &url,
        ]);
        assert_eq!(code, 200, "curl: {text}");
    }
}

fn is_state(e: &Event, new: TcpState) -> bool {
    matches!(&e.body, Some(Body::State(s)) if s.new() == new)
}

#[test]
fn every_event_handed_over_live_is_the_one_its_file_reads_back() {
    let port = free_port();
    let _engine = lab_engine_process(Command::new(lab()), &format!("127.0.0.1:{port}"), &[]);
    let dir = tempfile::tempdir().expect("tempdir");
    // As `agent --record-dir` records: a rotating sink, events handed over as they drain.
    let mut live = Live::start(RecordOptions::ports(
        vec![port],
        Output::Rotate(Rotation::new(
            dir.path().to_path_buf(),
            1 << 30,
            Duration::from_secs(3600),
        )),
    ))
    .expect("start recording");
    live.wait_started(Duration::from_secs(60))
        .expect("probes attached");
    let mut handed = Vec::new();
    for _ in 0..ROUNDS {
        load(port);
        handed.extend(live.take_batches().into_iter().flatten());
    }
    live.stop()
        .expect("the session ran")
        .expect("the session ended cleanly");
    handed.extend(live.take_batches().into_iter().flatten());

    let files: Vec<_> = std::fs::read_dir(dir.path())
        .expect("the record dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "tsrec"))
        .collect();
    assert_eq!(files.len(), 1, "one file (nothing rotated): {files:?}");
    let read = RecordReader::open(&files[0])
        .expect("open the recording")
        .read_all()
        .expect("read the recording");
    println!(
        "{} events handed over, {} read back",
        handed.len(),
        read.len()
    );

    // The load was seen: every client's connect() and each streamed token's I/O.
    let connects = ROUNDS * (12 + CURLS);
    let syn_sent = handed
        .iter()
        .filter(|e| is_state(e, TcpState::SynSent))
        .count();
    assert!(
        syn_sent >= connects,
        "{syn_sent} connects seen, {connects} made"
    );
    assert!(
        handed.iter().filter(|e| e.io().is_some()).count() > ROUNDS * BENCH_REQUESTS * 16,
        "every streamed token's I/O was handed over"
    );
    if let Some(i) = (0..handed.len().min(read.len())).find(|&i| handed[i] != read[i]) {
        panic!(
            "event {i} of {} differs:\n  handed over {:?}\n  read back   {:?}",
            handed.len(),
            handed[i],
            read[i]
        );
    }
    assert_eq!(handed.len(), read.len(), "as many events read as handed");
}
