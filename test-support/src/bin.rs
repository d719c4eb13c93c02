//! The binaries under test. The profiler (`tokenscope`) and the lab
//! (`tokenscope-lab`) are separate binaries of separate packages; cargo builds only
//! the tested package's binaries for its integration tests, so the other one is
//! built here on first use, into the same target directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// The directory cargo put this test's binaries in (`target/debug` for
/// `target/debug/deps/<test>-<hash>`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary lies in a directory");
    deps.parent()
        .expect("cargo puts test binaries in <target>/<profile>/deps")
        .to_path_buf()
}

/// The `tokenscope` profiler binary. Cargo builds it for the root package's tests,
/// the ones that run it (also inside `cargo xtask test-kernels`' guests, where no cargo
/// runs); elsewhere it is built on first use.
pub fn profiler() -> PathBuf {
    let path = bin_dir().join("tokenscope");
    if path.is_file() {
        return path;
    }
    built("tokenscope", "tokenscope")
}

/// The `tokenscope-lab` binary (demo, bench, engine, proxy, scenario), which
/// records with the `tokenscope` binary beside it. Another package's binary, so
/// (re)built once per test process: never stale.
pub fn lab() -> PathBuf {
    built("tokenscope-lab", "tokenscope-lab")
}

/// `tokenscope-lab` set to record with [`profiler`], not another `tokenscope`.
pub fn lab_command() -> Command {
    let mut cmd = Command::new(lab());
    cmd.env(tokenscope_lab::profiler::PROFILER_ENV, profiler());
    cmd
}

/// Runs `tokenscope-lab demo ARGS...` to its end; its stdout.
pub fn demo_stdout(args: &[&str]) -> String {
    let out = lab_command()
        .arg("demo")
        .args(args)
        .output()
        .expect("run tokenscope-lab demo");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The recording a demo's stdout names whose file name is `name` (`untuned.tsrec`,
/// `tuned.tsrec`).
pub fn demo_recording(stdout: &str, name: &str) -> PathBuf {
    stdout
        .lines()
        .filter_map(|l| l.split("(recording: ").nth(1))
        .map(|rest| PathBuf::from(rest.trim_end_matches("):")))
        .find(|p| p.ends_with(name))
        .unwrap_or_else(|| panic!("the demo names its {name} recording:\n{stdout}"))
}

/// A child process stopped when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    /// SIGTERM first: nginx's master then stops its workers (killed outright, they
    /// would live on, holding whatever the test's own descriptors were).
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        if crate::wait_timeout(&mut self.0, Duration::from_secs(10)).is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `tokenscope-lab engine --listen LISTEN ARGS...` as `cmd` runs it (`Command::new(lab())`,
/// or a network namespace's command), a process of its own, once it says it listens;
/// what it prints later (its call counts when stopped) is read and dropped.
pub fn lab_engine_process(mut cmd: Command, listen: &str, args: &[&str]) -> Killed {
    let mut child = cmd
        .args(["engine", "--listen", listen])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the lab engine");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("the engine's first line");
    assert!(line.starts_with("engine on"), "the engine said: {line:?}");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    Killed(child)
}

/// `bin` of workspace package `package` in this test's target directory, built
/// by cargo once per test process (when cargo runs the test).
fn built(package: &str, bin: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let path = bin_dir().join(bin);
    if std::env::var_os("CARGO").is_none() {
        // Not run by cargo (`cargo xtask test-kernels` runs test binaries in guests
        // over a read-only root): whoever ran it built what it needs.
        assert!(
            path.is_file(),
            "{} is not built (cargo build -p {package} --bin {bin})",
            path.display()
        );
        return path;
    }
    let mut done = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !done.iter().any(|p| p == package) {
        cargo_build(bin, &bin_dir());
        done.push(package.to_string());
    }
    assert!(
        path.is_file(),
        "{} missing after cargo built it",
        path.display()
    );
    path
}

/// What cargo sets (or prefixes) in the environment of a test it runs.
const TEST_RUN_VARS: &[&str] = &[
    "CARGO_MANIFEST_",
    "CARGO_PKG_",
    "CARGO_CRATE_NAME",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "CARGO_RUSTC_CURRENT_DIR",
    "OUT_DIR",
];

fn cargo_build(bin: &str, bin_dir: &Path) {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lies in the workspace");
    let profile = bin_dir
        .file_name()
        .and_then(|p| p.to_str())
        .expect("a profile directory");
    let target = bin_dir.parent().expect("the target directory");
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // As the cargo that built this test saw it: build scripts that watch a variable
    // cargo sets for tests (ring watches CARGO_MANIFEST_DIR) would otherwise be
    // rebuilt here, and again by the next ordinary build.
    for (name, _) in std::env::vars_os() {
        if name
            .to_str()
            .is_some_and(|n| TEST_RUN_VARS.iter().any(|v| n.starts_with(v)))
        {
            cmd.env_remove(name);
        }
    }
    // The whole workspace, as `cargo xtask test` builds it: building one package
    // alone resolves its dependencies' features differently and compiles a second copy
    // of them (100 s on CI's 2 cores); after the workspace build this is a no-op.
    cmd.args(["build", "--quiet", "--workspace", "--all-targets"])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target);
    if profile != "debug" {
        cmd.args(["--profile", profile]);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running cargo to build {bin}: {e}"));
    assert!(
        out.status.success(),
        "cargo could not build {bin}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
