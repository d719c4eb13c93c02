//! Replaying a committed recording gives the committed report, byte for byte: the
//! JSON `tokenscope report --json --tokens` printed for each fixture (tests/fixtures/
//! report; first written by the batch stitcher of commit 5761f64, before the pipeline
//! became incremental). A figure that moves must move for a stated reason: re-generate
//! the file with `tokenscope report --json --tokens` and say why in the commit. And
//! the default `--json` lists each request in under 2 KB, however long its stream.
//! Unprivileged: it replays committed recordings.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::io::Read;
use std::path::Path;
use std::process::Command;

fn gunzip(path: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(
        std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .read_to_end(&mut bytes)
    .unwrap_or_else(|e| panic!("gunzip {}: {e}", path.display()));
    bytes
}

/// The names of the files in `dir` ending in `suffix`, without it, sorted.
fn fixtures(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(suffix)?.to_string())
        })
        .collect();
    names.sort();
    names
}

/// The first line that differs, with its number, for a readable failure.
fn first_difference(want: &str, got: &str) -> String {
    for (i, (w, g)) in want.lines().zip(got.lines()).enumerate() {
        if w != g {
            return format!("line {}:\n  want {w}\n  got  {g}", i + 1);
        }
    }
    format!(
        "one is a prefix of the other: {} vs {} lines",
        want.lines().count(),
        got.lines().count()
    )
}

#[test]
fn replaying_each_fixture_gives_its_committed_report_byte_for_byte() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let dir = tempfile::tempdir().unwrap();
    let names = fixtures(&root.join("report"), ".report.json.gz");
    assert!(
        names.len() >= 11,
        "expected every diagnose fixture, found {names:?}"
    );
    let mut differ = Vec::new();
    for name in &names {
        let recording = dir.path().join(format!("{name}.tsrec"));
        std::fs::write(
            &recording,
            gunzip(&root.join(format!("diagnose/{name}.tsrec.gz"))),
        )
        .unwrap();
        let out = Command::new(test_support::profiler())
            .args(["report", "--json", "--tokens"])
            .arg(&recording)
            .output()
            .expect("run tokenscope report");
        assert!(
            out.status.success(),
            "{name}: report failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = String::from_utf8(gunzip(&root.join(format!("report/{name}.report.json.gz"))))
            .expect("committed report is UTF-8");
        let got = String::from_utf8(out.stdout).expect("report is UTF-8");
        if want != got {
            let kept = dir.path().join(format!("{name}.json"));
            std::fs::write(&kept, &got).unwrap();
            differ.push(format!(
                "{name} (new report kept in {}): {}",
                kept.display(),
                first_difference(&want, &got)
            ));
        } else {
            println!("{name}: {} bytes, identical", got.len());
        }
    }
    if !differ.is_empty() {
        let _ = dir.keep(); // the new reports, for a diff
        panic!("reports changed:\n{}", differ.join("\n"));
    }
}

/// The default JSON lists each request as its summary: under 2 KB a request on every
/// fixture (the untuned chain's four points and three hops are the most), a line each,
/// following the schema.
#[test]
fn the_default_json_lists_each_request_in_under_2_kb() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/diagnose");
    let dir = tempfile::tempdir().unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(&root).expect("tests/fixtures/diagnose") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(name) = name.strip_suffix(".tsrec.gz") else {
            continue;
        };
        let recording = dir.path().join(format!("{name}.tsrec"));
        std::fs::write(&recording, gunzip(&path)).unwrap();
        let out = Command::new(test_support::profiler())
            .args(["report", "--json"])
            .arg(&recording)
            .output()
            .expect("run tokenscope report");
        assert!(out.status.success(), "{name}");
        let text = String::from_utf8(out.stdout).expect("UTF-8");
        let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        test_support::check_report_schema(&report)
            .unwrap_or_else(|e| panic!("{name}: the default JSON breaks the schema: {e}"));
        let requests = report["requests"].as_array().expect("requests").len();
        let listed = &text[text.find("\"requests\": [").expect("requests")..];
        let per_request = listed.len() / requests.max(1);
        println!("{name}: {requests} requests, {per_request} bytes each");
        assert!(per_request <= 2048, "{name}: {per_request} bytes a request");
        assert_eq!(listed.lines().count(), requests + 3, "{name}: a line each");
        assert!(!listed.contains("token_ns"), "{name}: no per-token arrays");
        seen += 1;
    }
    assert!(seen >= 17, "every diagnose fixture: {seen}");
}

/// The live pipeline (`agent`'s and `top`'s: events in 50 ms drains, the clock a few
/// milliseconds behind, requests taken as they finish) builds, from each fixture's
/// events, requests with the start, first byte, end, stages and points (token times
/// included) the replay `report` runs builds, to the nanosecond. The agent's OTLP spans
/// are the first; `report` of its recordings the second.
#[test]
fn the_live_pipeline_builds_what_the_replay_builds() {
    use collector::ingest::record::RecordReader;
    use collector::pipeline::{Config, Open, Pipeline};

    const DRAIN_NS: u64 = 50_000_000;
    const BEHIND_NS: u64 = 5_000_000;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/diagnose");
    let dir = tempfile::tempdir().unwrap();
    let names = fixtures(&root, ".tsrec.gz");
    assert!(names.len() >= 11, "every diagnose fixture: {names:?}");
    let as_json = |mut requests: Vec<collector::stitch::Request>| -> Vec<String> {
        requests.sort_by_key(|r| r.order);
        requests
            .iter()
            .map(|r| {
                // What the agent's spans carry (its root, stages and points). Not the GPU
                // share, which the agent joins later from its window of steps, nor the
                // connection's requests so far, which grow as it goes on.
                let r = serde_json::to_value(r).expect("a request serializes");
                let keys = ["start_ns", "first_byte_ns", "end_ns", "stages", "points"];
                serde_json::to_string(&keys.map(|k| (k, &r[k]))).expect("JSON")
            })
            .collect()
    };
    for name in &names {
        let recording = dir.path().join(format!("{name}.tsrec"));
        std::fs::write(&recording, gunzip(&root.join(format!("{name}.tsrec.gz")))).unwrap();
        let mut reader = RecordReader::open(&recording).expect("open the fixture");
        let header = reader.header.clone();
        let events = reader.read_all().expect("read the fixture");

        let mut replay = Pipeline::new(Config::replay_of(&header), false);
        events.iter().cloned().for_each(|e| replay.push(e));
        let replayed = as_json(replay.finish().requests);

        let mut live = Pipeline::new(
            Config {
                open: Open::Never,
                ..Config::live()
            },
            false,
        );
        let mut taken = Vec::new();
        for drain in events.chunk_by(|a, b| a.ts_ns / DRAIN_NS == b.ts_ns / DRAIN_NS) {
            live.push_batch(drain.to_vec());
            let newest = drain.iter().map(|e| e.ts_ns).max().unwrap_or(0);
            live.tick(newest + BEHIND_NS);
            taken.extend(live.take().requests);
        }
        live.flush();
        taken.extend(live.finish().requests);
        let built = as_json(taken);

        assert!(!replayed.is_empty(), "{name}: requests replayed");
        if let Some(i) = (0..replayed.len().min(built.len())).find(|&i| replayed[i] != built[i]) {
            let (a, b) = (&replayed[i], &built[i]);
            let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
            let from = a[..at].rfind(",\"").unwrap_or(0);
            panic!(
                "{name}: request {i} differs at byte {at}:\n  replay ...{}\n  live   ...{}",
                &a[from..(at + 120).min(a.len())],
                &b[from..(at + 120).min(b.len())]
            );
        }
        assert_eq!(replayed.len(), built.len(), "{name}: as many requests");
        println!(
            "{name}: {} requests, the same live and replayed",
            built.len()
        );
    }
}
