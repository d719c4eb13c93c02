//! An OTLP/HTTP trace receiver (`otlp_receiver.py`): the official opentelemetry-proto
//! schema decodes what `tokenscope agent --otlp-endpoint` sends, one JSON line per span.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running receiver; killed, and its files removed, on drop.
pub struct Receiver {
    child: Child,
    port: u16,
    dir: PathBuf,
    out: PathBuf,
}

impl Receiver {
    /// Starts the receiver on 127.0.0.1:`port` (0: any free port) and waits until it
    /// listens.
    pub fn start(port: u16) -> Receiver {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let python = crate::pyvenv::python_for(crate::venv_specs::OTLP);
        let dir = std::env::temp_dir().join(format!(
            "tokenscope-otlp-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("the receiver's directory");
        let out = dir.join("spans.jsonl");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/otlp_receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .arg(&out)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn otlp_receiver.py");
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_default();
        let Some(port) = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
        else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("otlp_receiver.py says `listening PORT` once bound, said {line:?}");
        };
        Receiver {
            child,
            port,
            dir,
            out,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`, for `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every span received so far, one JSON object each (trace_id, span_id,
    /// parent_span_id as hex; name; start/end_time_unix_nano; attributes as an object;
    /// events with name, time_unix_nano, attributes; resource; status).
    pub fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Every request body as received, concatenated.
    pub fn raw(&self) -> Vec<u8> {
        std::fs::read(self.out.with_extension("jsonl.raw")).unwrap_or_default()
    }

    /// The spans once `done` holds for them, polled until `limit` (the receiver writes a
    /// file; there is no event to wait on). Panics naming `what` past the limit.
    pub fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what} within {limit:?}; {} spans received",
                spans.len()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Root spans: those whose parent is not a span of the same batch of spans (a request's
/// root has no parent, or the caller's span from its traceparent).
pub fn roots(spans: &[Value]) -> Vec<&Value> {
    let ids: std::collections::HashSet<&str> =
        spans.iter().filter_map(|s| s["span_id"].as_str()).collect();
    spans
        .iter()
        .filter(|s| {
            !s["parent_span_id"]
                .as_str()
                .is_some_and(|p| ids.contains(p))
        })
        .collect()
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
