//! `top --replay` reads a recording as it plays: it holds what it read ahead of the
//! replay position, never the whole recording, hands events out in time order, and a
//! recording damaged part way plays up to the damage and says why.
#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

mod common;

use std::path::Path;

use collector::ingest::record::{RecordReader, RecordWriter};
use common::fixture;
use tokenscope_tui::feed::Replay;

const S: u64 = 1_000_000_000;

/// The fixture `copies` times one after another (each 2 s after the one before ends),
/// a frame each; the events written.
fn long_recording(path: &Path, copies: u64) -> usize {
    let mut reader = RecordReader::open(&fixture()).expect("fixture");
    let header = reader.header.clone();
    let events = reader.read_all().expect("fixture readable");
    let first = events.iter().map(|e| e.ts_ns).min().expect("events");
    let last = events.iter().map(|e| e.ts_ns).max().expect("events");
    let step = last - first + 2 * S;
    let counters = header.counters.unwrap_or_default();
    let mut w = RecordWriter::create(path, header).expect("create");
    for copy in 0..copies {
        for e in &events {
            let mut e = e.clone();
            e.ts_ns += copy * step;
            w.push(e).expect("write");
        }
        w.flush().expect("frame");
    }
    w.finish(counters, last + copies * step).expect("seal");
    events.len() * copies as usize
}

#[test]
fn a_replay_holds_what_it_read_ahead_not_the_recording() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("long.tsrec");
    let copies = 12;
    let total = long_recording(&path, copies);
    let per_copy = total / copies as usize;

    let mut replay = Replay::open(std::slice::from_ref(&path)).expect("open");
    assert!(
        replay.held() <= 2 * per_copy,
        "after open: {} of {total} events held",
        replay.held()
    );
    let (mut clock, mut handed, mut most_held, mut prev) = (replay.first_ns, 0, 0, 0);
    while !replay.finished() {
        clock += S / 2;
        let batch = replay.due(clock);
        assert!(batch.iter().all(|e| e.ts_ns <= clock), "nothing early");
        for e in &batch {
            assert!(e.ts_ns >= prev, "in time order");
            prev = e.ts_ns;
        }
        handed += batch.len();
        most_held = most_held.max(replay.held());
        assert!(clock < replay.first_ns + 1_000 * S, "the replay ends");
    }
    println!("held at most {most_held} of {total} events ({per_copy} a copy)");
    assert_eq!(handed, total, "every event handed out once");
    assert_eq!(replay.last_ns, prev, "the last event's time");
    assert!(replay.error().is_none());
    assert!(
        most_held <= 2 * per_copy,
        "held at most {most_held} events of {total} ({per_copy} a copy)"
    );
}

#[test]
fn all_at_once_in_steps_gives_the_same_events_as_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("long.tsrec");
    let total = long_recording(&path, 4);
    let whole = Replay::open(std::slice::from_ref(&path))
        .expect("open")
        .due(u64::MAX);
    let mut stepped = Vec::new();
    let mut replay = Replay::open(std::slice::from_ref(&path)).expect("open");
    while !replay.finished() {
        let step = replay.due_at_most(u64::MAX, 1_000);
        assert!(step.len() <= 1_000);
        stepped.extend(step);
    }
    assert_eq!(whole.len(), total);
    assert!(whole == stepped, "same events, same order");
}

#[test]
fn a_recording_damaged_part_way_plays_up_to_the_damage_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("damaged.tsrec");
    let total = long_recording(&path, 6);
    // A byte of the last frames' compressed bytes flipped: their CRC no longer holds.
    let mut bytes = std::fs::read(&path).expect("read");
    let at = bytes.len() - bytes.len() / 8;
    bytes[at] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write");

    let mut replay = Replay::open(std::slice::from_ref(&path)).expect("its start reads");
    let played = replay.due(u64::MAX);
    assert!(replay.finished(), "the replay ends at the damage");
    assert!(
        !played.is_empty() && played.len() < total,
        "{} of {total} events before the damage",
        played.len()
    );
    let why = replay.error().expect("the damage named").to_string();
    println!("{} of {total} events played: {why}", played.len());
    assert!(why.contains("damaged.tsrec"), "names the file: {why}");
}
