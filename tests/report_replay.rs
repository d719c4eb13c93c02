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
    let mut names: Vec<String> = std::fs::read_dir(root.join("report"))
        .expect("tests/fixtures/report")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(".report.json.gz")?.to_string())
        })
        .collect();
    names.sort();
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
