//! Shared by the hook tests: where the built pieces are, and a host run like CUDA would do it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Guards against a hung host; not a timing assertion.
pub(crate) const HOST_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) fn standin_dir() -> PathBuf {
    PathBuf::from(env!("CUPTI_STANDIN_DIR"))
}

pub(crate) fn standin_lib() -> PathBuf {
    let p = standin_dir().join("libcupti_standin.so");
    assert!(
        p.exists(),
        "stand-in libcupti not built at {} (build.rs needs gcc)",
        p.display()
    );
    p
}

pub(crate) fn host_bin() -> PathBuf {
    let p = standin_dir().join("cupti_host");
    assert!(
        p.exists(),
        "cupti_host not built at {} (build.rs needs gcc)",
        p.display()
    );
    p
}

/// The cdylib cargo built for this test run: target/<profile>/deps/ (the uplifted copy in
/// target/<profile>/ is only refreshed by `cargo build`).
pub(crate) fn hook_so() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let p = deps.join("libtokenscope_cupti_hook.so");
    assert!(p.exists(), "hook cdylib not found at {}", p.display());
    p
}

/// A host process that loaded the hook; stdout lines arrive on `lines`.
pub(crate) struct Host {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    stderr: Option<thread::JoinHandle<String>>,
}

pub(crate) fn spawn_host(
    cupti_lib: &Path,
    socket: &Path,
    env: &[(&str, &str)],
    steps: &[&str],
) -> Host {
    let mut cmd = Command::new(host_bin());
    cmd.arg(hook_so())
        .args(steps)
        .env("TOKENSCOPE_CUPTI_LIB", cupti_lib)
        .env("TOKENSCOPE_CUPTI_SOCKET", socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn cupti_host");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    Host {
        child,
        lines,
        stderr: Some(stderr),
    }
}

impl Host {
    /// Waits for a stdout line starting with `prefix`; returns it.
    pub(crate) fn expect_line(&self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(HOST_TIMEOUT) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(e) => panic!("host never printed a line starting {prefix:?}: {e}"),
            }
        }
    }

    /// Waits for exit; returns (exit code, every remaining stdout line, stderr).
    pub(crate) fn finish(mut self) -> (i32, Vec<String>, String) {
        let status = self.child.wait().expect("wait for host");
        let rest: Vec<String> = self.lines.iter().collect();
        let stderr = self.stderr.take().unwrap().join().unwrap_or_default();
        let code = status
            .code()
            .unwrap_or_else(|| panic!("host killed by a signal: {status:?}; stderr: {stderr}"));
        (code, rest, stderr)
    }
}

/// Lines the hook printed (its prefix), from a host's stderr.
pub(crate) fn hook_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("tokenscope-cupti-hook:"))
        .collect()
}
