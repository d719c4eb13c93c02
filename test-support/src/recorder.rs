//! A `tokenscope record` child that has attached its probes, stopped by a signal.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `tokenscope record` child that has attached its probes.
pub struct Recorder {
    child: Child,
    pub path: PathBuf,
    stderr: mpsc::Receiver<String>,
}

impl Recorder {
    /// Starts `tokenscope record -o <dir>/rec.tsrec <extra...>` and waits until it says it is recording.
    pub fn start(dir: &Path, extra: &[&str]) -> Recorder {
        let path = dir.join("rec.tsrec");
        let mut command = Command::new(crate::profiler());
        command.arg("record").arg("-o").arg(&path).args(extra);
        let (child, stderr) = spawn_until(&mut command, "recording:", "tokenscope record");
        Recorder {
            child,
            path,
            stderr,
        }
    }

    /// The recorder's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal`, waits for exit, and returns the rest of stderr.
    pub fn stop_with(mut self, signal: i32) -> String {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let status = wait_timeout(&mut self.child, Duration::from_secs(60))
            .expect("tokenscope record did not exit after the signal");
        let rest: Vec<String> = self.stderr.try_iter().collect();
        let rest = rest.join("\n");
        assert!(
            status.success(),
            "tokenscope record exited with {status}; stderr: {rest}"
        );
        rest
    }

    pub fn stop(self) -> String {
        self.stop_with(libc::SIGINT)
    }
}

/// A test that panics before stopping its recorder must not leave it running (its
/// probes would stay attached and its traffic would reach the next tests' kernels).
impl Drop for Recorder {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Spawns `command` with stderr piped and waits (60 s at most) for a line containing
/// `marker`; the child and the rest of its stderr, line by line. Panics with what it
/// said otherwise (`what` names it).
pub fn spawn_until(
    command: &mut Command,
    marker: &str,
    what: &str,
) -> (Child, mpsc::Receiver<String>) {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().expect("stderr piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(marker) => break,
            Ok(line) => seen.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} never said {marker:?}; stderr: {seen:?}");
            }
        }
    }
    (child, rx)
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
