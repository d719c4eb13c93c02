//! Shared pieces of the end-to-end tests: run `tokenscope record` as a child,
//! real nginx on free ports, and helpers to read what was recorded.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use collector::ingest::model::{event::Body, Direction, Event, Sock};
use collector::ingest::record::{FileHeader, RecordReader};

pub const BIN: &str = env!("CARGO_BIN_EXE_tokenscope");

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
        let mut child = Command::new(BIN)
            .arg("record")
            .arg("-o")
            .arg(&path)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tokenscope record");
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
                Ok(line) if line.contains("recording:") => break,
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = child.kill();
                    panic!("tokenscope record never said it was recording; stderr: {seen:?}");
                }
            }
        }
        Recorder {
            child,
            path,
            stderr: rx,
        }
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

pub fn read_recording(path: &Path) -> (FileHeader, Vec<Event>) {
    let mut r = RecordReader::open(path).unwrap_or_else(|e| panic!("recording unreadable: {e}"));
    let events = r
        .read_all()
        .unwrap_or_else(|e| panic!("recording events unreadable: {e}"));
    (r.header, events)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Waits until something accepts connections on `port`.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on port {port} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sum of I/O bytes in `dir` by `pid` on sockets whose local port is `local_port`.
pub fn io_bytes(events: &[Event], pid: u32, dir: Direction, local_port: u16) -> u64 {
    io_events(events, pid, dir, local_port)
        .map(|(_, io_bytes)| io_bytes)
        .sum()
}

pub fn io_events(
    events: &[Event],
    pid: u32,
    dir: Direction,
    local_port: u16,
) -> impl Iterator<Item = (&Event, u64)> {
    events.iter().filter_map(move |e| {
        let io = e.io()?;
        let sock = io.sock.as_ref()?;
        (e.pid == pid && io.dir() == dir && sock.sport == u32::from(local_port))
            .then_some((e, io.bytes))
    })
}

/// State transitions `(old, new)` seen on sockets with this local and remote port.
pub fn transitions(events: &[Event], sport: u16, dport: u16) -> Vec<(String, String, u32)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::State(s)) if matches_ports(s.sock.as_ref()?, sport, dport) => Some((
                s.old().label().to_string(),
                s.new().label().to_string(),
                e.pid,
            )),
            _ => None,
        })
        .collect()
}

fn matches_ports(sock: &Sock, sport: u16, dport: u16) -> bool {
    sock.sport == u32::from(sport) && sock.dport == u32::from(dport)
}

/// A real nginx from the system, with its own prefix directory, on free ports.
pub struct Nginx {
    child: Child,
    pub dir: PathBuf,
    pub http_port: u16,
    pub https_port: u16,
    /// TLS with HTTP/2 offered by ALPN.
    pub h2_port: u16,
    /// Cleartext HTTP/2 with prior knowledge (h2c).
    pub h2c_port: u16,
}

impl Nginx {
    /// Serves `location_body` (nginx directives) on four listeners: plain HTTP/1.1,
    /// TLS (HTTP/1.1), TLS with HTTP/2, and cleartext HTTP/2 (prior knowledge).
    pub fn start(dir: &Path, location_body: &str) -> Nginx {
        let [http_port, https_port, h2_port, h2c_port] = std::array::from_fn(|_| free_port());
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        let status = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=localhost",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run openssl (installed by cargo xtask setup)");
        assert!(
            status.success(),
            "openssl could not make a self-signed certificate"
        );
        std::fs::create_dir_all(dir.join("logs")).expect("logs dir");
        let conf = format!(
            "worker_processes 1;\nerror_log {dir}/logs/error.log;\npid {dir}/nginx.pid;\n\
events {{ worker_connections 64; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
  fastcgi_temp_path {dir}/fcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
  server {{\n    listen 127.0.0.1:{http_port};\n    listen 127.0.0.1:{https_port} ssl;\n\
    listen 127.0.0.1:{h2_port} ssl http2;\n    listen 127.0.0.1:{h2c_port} http2;\n\
    ssl_certificate {cert};\n    ssl_certificate_key {key};\n    location / {{ {location_body} }}\n  }}\n}}\n",
            dir = dir.display(),
            cert = cert.display(),
            key = key.display(),
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).expect("write nginx.conf");
        let child = Command::new(nginx_binary())
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path)
            .args(["-g", "daemon off; master_process on;"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start nginx (installed by cargo xtask setup)");
        let mut nginx = Nginx {
            child,
            dir: dir.to_path_buf(),
            http_port,
            https_port,
            h2_port,
            h2c_port,
        };
        for port in [http_port, https_port, h2_port, h2c_port] {
            wait_for_port(port);
        }
        assert!(
            nginx.child.try_wait().expect("try_wait").is_none(),
            "nginx exited: {}",
            nginx.error_log()
        );
        nginx
    }

    pub fn master_pid(&self) -> u32 {
        self.child.id()
    }

    /// Pids of the worker processes (children of the master).
    pub fn worker_pids(&self) -> Vec<u32> {
        let master = self.master_pid();
        std::fs::read_dir("/proc")
            .expect("read /proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| {
                        s.rsplit(')')
                            .next()?
                            .split_whitespace()
                            .nth(1)?
                            .parse::<u32>()
                            .ok()
                    })
                    == Some(master)
            })
            .collect()
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("logs/error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: SIGQUIT asks the nginx master for a graceful stop.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
    }
}

fn nginx_binary() -> &'static str {
    [
        "/usr/sbin/nginx",
        "/usr/local/sbin/nginx",
        "/usr/local/nginx/sbin/nginx",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .unwrap_or("nginx")
}

/// Runs curl and returns (pid, stdout).
pub fn curl(args: &[&str]) -> (u32, String) {
    let child = Command::new("curl")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run curl");
    let pid = child.id();
    let out = child.wait_with_output().expect("curl output");
    assert!(
        out.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (pid, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `tokenscope report FILE --json`, parsed.
pub fn report_json(path: &Path) -> serde_json::Value {
    let out = Command::new(BIN)
        .arg("report")
        .arg(path)
        .arg("--json")
        .output()
        .expect("run tokenscope report");
    assert!(
        out.status.success(),
        "report failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("report --json is JSON")
}

/// Runs every output of a recording (dump, report as text and JSON, the Perfetto
/// export) and asserts that none of them, nor the record file, holds any of `secrets`.
/// Returns the dump's text.
pub fn assert_no_secrets_in_outputs(recording: &Path, scratch: &Path, secrets: &[&str]) -> String {
    let output = |args: &[&str]| -> Vec<u8> {
        let out = Command::new(BIN)
            .args(args)
            .arg(recording)
            .output()
            .expect("run tokenscope");
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let dump = output(&["dump"]);
    let report = output(&["report"]);
    let json = output(&["report", "--json"]);
    let trace_path = scratch.join("secrets-check.pftrace");
    output(&["export", "-o", trace_path.to_str().expect("utf-8 path")]);
    let trace = std::fs::read(&trace_path).expect("read trace");
    let file = std::fs::read(recording).expect("read recording");
    for secret in secrets {
        for (what, bytes) in [
            ("the dump", &dump),
            ("the record file", &file),
            ("the report", &report),
            ("the JSON report", &json),
            ("the Perfetto trace", &trace),
        ] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{secret} appears in {what}"
            );
        }
    }
    String::from_utf8_lossy(&dump).into_owned()
}

pub const MS: u64 = 1_000_000;

/// A nanosecond figure of a JSON report.
pub fn ns(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("expected ns, got {v}"))
}

/// A request's observation point of `kind` in a JSON report.
pub fn point<'a>(r: &'a serde_json::Value, kind: &str) -> Option<&'a serde_json::Value> {
    r["points"].as_array()?.iter().find(|p| p["kind"] == kind)
}

/// The kinds of a request's observation points, client side first.
pub fn point_kinds(r: &serde_json::Value) -> Vec<&str> {
    r["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| p["kind"].as_str().expect("kind"))
        .collect()
}

/// How many tokens a request's point of `kind` saw (0 without that point).
pub fn tokens_at(r: &serde_json::Value, kind: &str) -> usize {
    point(r, kind).map_or(0, |p| p["token_ns"].as_array().map_or(0, Vec::len))
}

/// The nearest-rank percentile of `v` (sorted in place).
pub fn percentile(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Accuracy against a client's own clock (two measurements of the same events, one
/// clock): prints the errors' p50/p99 and asserts >= 99% of first tokens (TTFT) and of
/// ITL samples are within 1 ms. `first` names what the first list holds.
pub fn assert_within_a_millisecond(
    what: &str,
    first: &str,
    mut first_err: Vec<u64>,
    mut itl_err: Vec<u64>,
) {
    let within = |v: &[u64]| v.iter().filter(|e| **e <= MS).count() as f64 / v.len() as f64;
    let (t_ok, i_ok) = (within(&first_err), within(&itl_err));
    let (t50, t99) = (
        percentile(&mut first_err, 0.5),
        percentile(&mut first_err, 0.99),
    );
    let (i50, i99) = (
        percentile(&mut itl_err, 0.5),
        percentile(&mut itl_err, 0.99),
    );
    println!(
        "accuracy, {what}: {first} |error| p50 {t50} ns p99 {t99} ns; ITL |error| p50 {i50} ns p99 {i99} ns ({} samples)",
        itl_err.len()
    );
    assert!(
        t_ok >= 0.99,
        "{what}: {first} within 1 ms for {:.1}% (p99 error {t99} ns)",
        t_ok * 100.0
    );
    assert!(
        i_ok >= 0.99,
        "{what}: ITL within 1 ms for {:.1}% of samples (p99 error {i99} ns)",
        i_ok * 100.0
    );
}

/// Asserts the report names `rule` with evidence (requests, ids, figures) and a fix.
pub fn assert_rule_with_evidence(report: &serde_json::Value, rule: u64) {
    let found: Vec<&serde_json::Value> = report["diagnoses"]
        .as_array()
        .expect("diagnoses")
        .iter()
        .map(|d| &d["rule"])
        .collect();
    let diag = report["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["rule"] == rule)
        .unwrap_or_else(|| panic!("rule {rule} in the report; found {found:?}"));
    let ev = &diag["evidence"];
    assert!(
        ev["requests"].as_u64().unwrap() >= 3
            && !ev["request_ids"].as_array().unwrap().is_empty()
            && !ev["figures"].as_array().unwrap().is_empty(),
        "rule {rule} shows its evidence: {diag:#}"
    );
    assert!(
        !diag["fix"].as_array().unwrap().is_empty(),
        "rule {rule} names a fix"
    );
}

/// The lab engine (on a runtime the caller keeps) behind real nginx on its four
/// listeners, proxying with HTTP/1.1 keep-alive upstream and no buffering.
pub fn engine_behind_nginx(dir: &Path) -> (tokio::runtime::Runtime, tokenscope_lab::Engine, Nginx) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let engine = rt
        .block_on(tokenscope_lab::Engine::start(
            tokenscope_lab::EngineConfig::default(),
            "127.0.0.1:0".parse().unwrap(),
        ))
        .expect("lab engine");
    let up = engine.addr();
    let nginx = Nginx::start(
        dir,
        &format!(
            "proxy_pass http://{up}; proxy_http_version 1.1; proxy_set_header Connection \"\"; \
             proxy_buffering off;"
        ),
    );
    (rt, engine, nginx)
}
