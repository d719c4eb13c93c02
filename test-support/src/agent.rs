//! A `tokenscope agent` child that has attached its probes, a plain HTTP GET for its
//! `/metrics`, and a real Prometheus server that scrapes it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `tokenscope agent` child.
pub struct Agent {
    child: Child,
    pub metrics_port: u16,
    stderr: mpsc::Receiver<String>,
}

impl Agent {
    /// Starts `tokenscope agent --metrics-listen 127.0.0.1:<free port> <extra...>` and
    /// waits until it says its probes are attached.
    pub fn start(extra: &[&str]) -> Agent {
        Agent::start_on(crate::free_port(), extra)
    }

    /// The same with its metrics on `metrics_port`.
    pub fn start_on(metrics_port: u16, extra: &[&str]) -> Agent {
        Agent::start_with(Command::new(crate::profiler()), metrics_port, extra)
    }

    /// The same through a wrapper (e.g. `setpriv ... tokenscope`): `command` runs the
    /// profiler with what comes after it.
    pub fn start_with(mut command: Command, metrics_port: u16, extra: &[&str]) -> Agent {
        command
            .arg("agent")
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{metrics_port}"))
            .args(extra);
        let (child, stderr) = crate::recorder::spawn_until(
            &mut command,
            "tokenscope agent: attached",
            "tokenscope agent",
        );
        Agent {
            child,
            metrics_port,
            stderr,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its resident memory now (kB, VmRSS).
    pub fn rss_kb(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// GET /metrics (panics when it does not answer 200).
    pub fn metrics(&self) -> String {
        let (status, body) = http_get("127.0.0.1", self.metrics_port, "/metrics");
        assert_eq!(status, 200, "/metrics answered {status}: {body}");
        body
    }

    /// SIGTERM, then its exit; returns what it printed on stderr after attaching.
    pub fn stop(mut self) -> String {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = crate::wait_timeout(&mut self.child, Duration::from_secs(30));
        let lines: Vec<String> = self.stderr.try_iter().collect();
        let text = lines.join("\n");
        match status {
            Some(s) => assert!(s.success(), "tokenscope agent exited with {s}: {text}"),
            None => {
                let _ = self.child.kill();
                panic!("tokenscope agent did not stop within 30 s of SIGTERM: {text}");
            }
        }
        text
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of the samples of `name` (exact metric name, labels ignored) summed.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| {
            // `name{labels} value [# exemplar]` or `name value`
            let value = match l.split_once('}') {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => l.split_whitespace().nth(1),
            };
            value?.parse::<f64>().ok()
        })
        .sum()
}

/// A plain HTTP/1.1 GET: (status, body).
pub fn http_get(host: &str, port: u16, target: &str) -> (u16, String) {
    let mut s =
        TcpStream::connect((host, port)).unwrap_or_else(|e| panic!("connect {host}:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A real Prometheus server (Debian's `prometheus`) scraping `targets` every second.
pub struct Prometheus {
    child: Child,
    pub port: u16,
    _dir: PathBuf,
}

impl Prometheus {
    pub fn start(dir: &Path, targets: &[u16]) -> Prometheus {
        let port = crate::free_port();
        let list: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: tokenscope\n    scrape_interval: 1s\n    \
                 scrape_timeout: 900ms\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ),
        )
        .expect("write prometheus.yml");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--enable-feature=exemplar-storage")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus (Debian package prometheus; cargo xtask setup installs it)");
        crate::wait_for_port(port);
        let p = Prometheus {
            child,
            port,
            _dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_get("127.0.0.1", port, "/-/ready").0 != 200 {
            assert!(Instant::now() < deadline, "prometheus not ready in 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// An instant PromQL query: the `data.result` array.
    pub fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        let (status, body) = http_get(
            "127.0.0.1",
            self.port,
            &format!("/api/v1/query?query={}", url_encode(promql)),
        );
        assert_eq!(status, 200, "{promql}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The exemplars Prometheus stored for `promql` (its `data` array).
    pub fn exemplars(&self, promql: &str) -> Vec<serde_json::Value> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let (status, body) = http_get(
            "127.0.0.1",
            self.port,
            &format!(
                "/api/v1/query_exemplars?query={}&start={}&end={}",
                url_encode(promql),
                now - 3600,
                now + 60
            ),
        );
        assert_eq!(status, 200, "{promql}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("prometheus JSON");
        v["data"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `promql` returns a first sample whose value passes `ok`; that value.
    pub fn wait_for(&self, promql: &str, limit: Duration, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + limit;
        loop {
            let value = self.query(promql).first().and_then(sample_value);
            match value {
                Some(v) if ok(v) => return v,
                _ if Instant::now() > deadline => {
                    panic!("{promql}: {value:?} after {limit:?}")
                }
                _ => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

/// The value of one result of an instant query.
pub fn sample_value(r: &serde_json::Value) -> Option<f64> {
    r["value"][1].as_str()?.parse().ok()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
