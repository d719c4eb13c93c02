//! `tokenscope demo`: the lab's load, recorded by tokenscope itself. A
//! `tokenscope record` child watches the engine's and the proxy's ports while
//! the bench runs (in this process, so the recorder's self-exclusion does not
//! hide it), and its report is printed beside the bench's own.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};

use collector::export::report;
use collector::ingest::record::RecordReader;
use tokenscope_lab::demo::DemoObserver;

pub struct RecordingObserver {
    dir: PathBuf,
    recorder: Option<(Child, BufReader<ChildStderr>, PathBuf)>,
    problem: Option<String>,
}

impl RecordingObserver {
    pub fn new() -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("tokenscope-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(RecordingObserver {
            dir,
            recorder: None,
            problem: None,
        })
    }

    fn start(&mut self, tuned: bool, ports: [u16; 2]) -> Result<(), String> {
        let exe = std::env::current_exe().map_err(|e| format!("finding tokenscope: {e}"))?;
        let path = self.dir.join(if tuned {
            "tuned.tsrec"
        } else {
            "untuned.tsrec"
        });
        let mut child = Command::new(exe)
            .args([
                "record",
                "--port",
                &ports[0].to_string(),
                "--port",
                &ports[1].to_string(),
                "-o",
            ])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting tokenscope record: {e}"))?;
        let mut err = BufReader::new(child.stderr.take().expect("stderr is piped"));
        let mut line = String::new();
        loop {
            line.clear();
            match err.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = child.wait();
                    return Err(line.trim().to_string());
                }
                Ok(_) if line.contains("recording:") => break,
                Ok(_) if line.contains("error") => {
                    let _ = child.wait();
                    return Err(line.trim().to_string());
                }
                Ok(_) => {}
            }
        }
        self.recorder = Some((child, err, path));
        Ok(())
    }
}

impl DemoObserver for RecordingObserver {
    fn ready(&mut self, tuned: bool, engine: SocketAddr, proxy: SocketAddr) {
        self.problem = self.start(tuned, [engine.port(), proxy.port()]).err();
    }

    fn finished(&mut self, _tuned: bool) -> Option<String> {
        if let Some(problem) = self.problem.take() {
            return Some(format!("tokenscope did not record this side: {problem}\n"));
        }
        let (mut child, mut err, path) = self.recorder.take()?;
        // SAFETY: kill(2) on our own child; SIGINT seals the recording.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        match child.wait() {
            Ok(s) if s.success() => {}
            other => {
                return Some(format!(
                    "tokenscope record failed ({other:?}): {}\n",
                    rest.trim()
                ))
            }
        }
        Some(
            profile(&path)
                .unwrap_or_else(|e| format!("reading the recording {}: {e}\n", path.display())),
        )
    }
}

fn profile(path: &std::path::Path) -> anyhow::Result<String> {
    let mut reader = RecordReader::open(path)?;
    let events = reader.read_all()?;
    let built = report::build(&reader.header, &events);
    let mut text = format!(
        "tokenscope's view of the same run (recording: {}):\n",
        path.display()
    );
    let mut buf = Vec::new();
    report::write_text(&built, &mut buf)?;
    text.push_str(&String::from_utf8_lossy(&buf));
    Ok(text)
}
