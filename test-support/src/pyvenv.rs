//! A Python venv with one PyPI package, for tests that check tokenscope's output
//! with third-party Python code (the openai SDK, Perfetto's own bindings). Built
//! beside its final path and renamed into place, so concurrent runs never share a
//! half-made one; reused by later runs. Within one process (the tests of one binary run
//! on several threads) one thread builds a given venv while the others wait for it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The python of the venv `spec` (see `venv_specs`), built here if need be.
pub fn python_for(spec: crate::venv_specs::VenvSpec) -> PathBuf {
    python_with(spec.0, spec.1, spec.2)
}

/// The python of a venv under the temp dir named `name` in which `import_check`
/// (Python code) runs, installing `package` from PyPI when needed (several
/// requirements separated by spaces, e.g. "openai httpx[http2]"). Panics with the
/// reason when it cannot (it is for tests).
pub fn python_with(name: &str, package: &str, import_check: &str) -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while building leaves nothing behind but its own folder.
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let venv = std::env::temp_dir().join(name);
    let python = venv.join("bin/python");
    let works = |python: &Path| {
        Command::new(python)
            .args(["-c", import_check])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&python) {
        return python;
    }
    let building = std::env::temp_dir().join(format!("{name}.{}", std::process::id()));
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&building),
        "python3 -m venv (Debian package python3-venv)",
    );
    run(
        Command::new(building.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(package.split_whitespace()),
        &format!("pip install {package} (PyPI)"),
    );
    let _ = std::fs::remove_dir_all(&venv);
    if std::fs::rename(&building, &venv).is_err() {
        // Another run put its venv in place first: use ours where it is.
        return building.join("bin/python");
    }
    assert!(
        works(&python),
        "the venv at {} passes `{import_check}`",
        venv.display()
    );
    python
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
