//! Replaying a committed recording gives the committed report, byte for byte: the
//! JSON `tokenscope report --json` printed for each fixture before the pipeline
//! became incremental (tests/fixtures/report, written by the batch stitcher of
//! commit 5761f64). A figure that moves must move for a stated reason: re-generate
//! the file with `tokenscope report --json` and say why in the commit.
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
            .args(["report", "--json"])
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
