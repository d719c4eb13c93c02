//! Privileged: a rewriting gateway, the LiteLLM proxy (PyPI `litellm[proxy]`, pinned), in
//! front of the lab engine. LiteLLM rewrites each request (its own body, with
//! `stream_options` added) and re-serialises every event (keys reordered, fields dropped,
//! a finish chunk added), so neither a body print nor an event fingerprint joins its two
//! sides: the text of the tokens it forwards does. 16 chat streams through it, recorded:
//! each request appears once, joined `by-tokens`, with client-read, gateway (proxy write
//! and read) and engine points; the gateway's TTFT stage equals the client's TTFT by its
//! own clock less the engine's by its own log, within 1 ms; LiteLLM's master key (sent
//! as Authorization) is in no output.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use test_support::*;
use tokenscope_lab::bench::{self, ApiKey, BenchConfig};
use tokenscope_lab::EngineConfig;

const STREAMS: usize = 16;
const MASTER_KEY: &str = "sk-tokenscope-gw-7f3a9c21e5";

/// The LiteLLM proxy on `port`, routing `lab-model` to the engine at `engine`.
struct Gateway {
    child: Child,
    log: PathBuf,
}

impl Gateway {
    fn start(dir: &Path, port: u16, engine: std::net::SocketAddr) -> Gateway {
        let python = pyvenv::python_for(venv_specs::LITELLM);
        let config = dir.join("litellm.yaml");
        std::fs::write(
            &config,
            format!(
                "model_list:\n  - model_name: lab-model\n    litellm_params:\n      \
                 model: openai/lab-model\n      api_base: http://{engine}/v1\n      \
                 api_key: unused\ngeneral_settings:\n  master_key: {MASTER_KEY}\n"
            ),
        )
        .expect("write litellm config");
        let log = dir.join("litellm.log");
        let out = std::fs::File::create(&log).expect("log file");
        // The `litellm` script's shebang names the path the venv was built at; its entry
        // point through the venv's python works wherever the venv was moved.
        let child = Command::new(&python)
            .args([
                "-c",
                "import sys; from litellm import run_server; sys.argv[0] = 'litellm'; run_server()",
            ])
            .arg("--config")
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            // Offline: the model cost map and the rest from the package, no banners.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LITELLM_LOCAL_BLOG_POSTS", "True")
            .env("LITELLM_LOCAL_POLICY_TEMPLATES", "True")
            .env("LITELLM_LOCAL_AUTOROUTER_PRESETS", "True")
            .env("LITELLM_DONT_SHOW_FEEDBACK_BOX", "True")
            .env("DISABLE_ADMIN_UI", "True")
            .env("NO_DOCS", "True")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start litellm ({}): {e}", python.display()));
        let mut gw = Gateway { child, log };
        gw.wait_ready(port);
        gw
    }

    /// Polls `/health/liveliness` (startup takes 10-25 s on 2 cores).
    fn wait_ready(&mut self, port: u16) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(120) {
            if let Some(status) = self.child.try_wait().expect("litellm status") {
                panic!("litellm exited with {status}: {}", self.log_tail());
            }
            if get(port, "/health/liveliness").is_some_and(|s| s.starts_with("HTTP/1.1 200")) {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("litellm not ready after 120 s: {}", self.log_tail());
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = log.len().saturating_sub(4000);
        log[log.floor_char_boundary(start)..].to_string()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // SIGTERM waits for streams in flight (none by now); SIGKILL after 10 s.
        // SAFETY: kill(2) on our own child's pid, which it keeps until we wait for it.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A plain GET's status line and headers, if anything answered.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn load(url: String, requests: u64, concurrency: usize) -> BenchConfig {
    BenchConfig {
        url,
        chat: true,
        concurrency,
        requests: Some(requests),
        prompt_tokens: 40,
        max_tokens: 24,
        progress: false,
        timeout: Duration::from_secs(120),
        api_key: Some(ApiKey(MASTER_KEY.into())),
        ..BenchConfig::default()
    }
}

fn port_of(r: &Value) -> u16 {
    r["client_addr"]
        .as_str()
        .and_then(|a| a.rsplit(':').next()?.parse().ok())
        .expect("client_addr host:port")
}

#[test]
fn litellm_streams_are_joined_by_their_tokens_and_its_ttft_share_measured() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = lab_engine(&rt, EngineConfig::default());
    let port = free_port();
    let gateway = Gateway::start(dir.path(), port, engine.addr());
    let url = format!("http://127.0.0.1:{port}");
    // Warm LiteLLM up (its first requests load code), unrecorded.
    rt.block_on(bench::run(&load(url.clone(), 2, 1)))
        .expect("warm-up through litellm");
    let ports = [port.to_string(), engine.addr().port().to_string()];
    let rec = Recorder::start(dir.path(), &["--port", &ports[0], "--port", &ports[1]]);
    let outcome = rt
        .block_on(bench::run(&load(url, STREAMS as u64, STREAMS)))
        .expect("bench through litellm");
    let path = rec.path.clone();
    rec.stop();
    let served = engine.request_log().snapshot();
    drop(gateway);
    rt.block_on(engine.shutdown());
    assert!(
        outcome.records.iter().all(|r| r.ok),
        "every stream succeeded"
    );

    let report = report_json(&path);
    check_report_schema(&report).expect("the report follows the schema");
    let requests: Vec<&Value> = report["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("chat/completions"))
        })
        .collect();
    let by_port: HashMap<u16, &Value> = requests.iter().map(|r| (port_of(r), *r)).collect();
    assert_eq!(
        requests.len(),
        STREAMS,
        "each stream once, not once per hop: {:#}",
        report["requests"]
    );
    let gateways = report["gateways"].as_object().expect("a gateway is named");
    assert_eq!(gateways.len(), 1, "{gateways:?}");
    assert_eq!(gateways.values().next().unwrap(), STREAMS, "{gateways:?}");
    let engine_by_id: HashMap<&str, _> =
        served.iter().map(|s| (s.response_id.as_str(), s)).collect();
    let mut errors = Vec::new();
    for b in &outcome.records {
        let r = by_port
            .get(&b.local_port)
            .unwrap_or_else(|| panic!("bench's request on :{} is in the report", b.local_port));
        assert_eq!(r["join"], "by-tokens", "{r:#}");
        assert_eq!(
            point_kinds(r),
            ["client_read", "proxy_write", "proxy_read", "engine_write"],
            "{r:#}"
        );
        let id = b.response_id.as_deref().expect("a response id");
        let e = engine_by_id
            .get(id)
            .unwrap_or_else(|| panic!("the engine served {id} (LiteLLM keeps the id)"));
        // The client's TTFT by its clock, less the engine's own by its log (from the
        // request's head, as the profiler's runs from its first byte): what the gateway
        // (and the hops to and from it) added.
        let client = b.ttft_ns().expect("client TTFT");
        let engine_ttft = e.token_ns[0] - e.head_ns;
        let expected = client as i64 - engine_ttft as i64;
        let got = ns(&r["stages"]["gateway_ttft_ns"]) as i64;
        errors.push((got - expected).unsigned_abs());
        println!(
            "{id}: client TTFT {:.2} ms, engine TTFT {:.2} ms, gateway share {:.2} ms (profiler {:.2} ms)",
            client as f64 / 1e6,
            engine_ttft as f64 / 1e6,
            expected as f64 / 1e6,
            got as f64 / 1e6
        );
    }
    let within = errors.iter().filter(|e| **e <= MS).count();
    println!(
        "gateway TTFT stage vs client - engine clocks: {within} of {} within 1 ms",
        errors.len()
    );
    // Four clock reads make the expected value (client start and first token, the
    // engine's head and first token), each next to a socket call: a preemption between
    // one and its call (CI saw one request of 16 at 1.09 ms, the rest 36-103 us) moves a
    // request by its length. A systematic error moves the median and most requests.
    let mut sorted = errors.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    assert!(median <= MS / 4, "median error {median} ns: {errors:?}");
    assert!(
        within * 8 >= errors.len() * 7,
        "within 1 ms for >= 7/8 of requests: {errors:?}"
    );
    assert!(
        sorted.last().is_some_and(|w| *w <= 10 * MS),
        "none 10 ms off: {errors:?}"
    );

    // Not asserted: rule 7 (Nagle) sometimes fires here though the engine sets
    // TCP_NODELAY; LiteLLM's CPU-bound event loop reads late (see the session notes).
    println!(
        "diagnoses: {:?}",
        report["diagnoses"]
            .as_array()
            .expect("diagnoses")
            .iter()
            .map(|d| d["rule"].as_u64().unwrap())
            .collect::<Vec<_>>()
    );

    // The text names the hop as a gateway, with its stage and per-token delay.
    let text = Command::new(profiler())
        .arg("report")
        .arg(&path)
        .output()
        .expect("report");
    let text = String::from_utf8_lossy(&text.stdout);
    println!("{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("gateway "))
        .unwrap_or_else(|| panic!("a gateway line: {text}"));
    assert!(line.contains(&format!(": {STREAMS} requests")), "{line}");
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("gateway ttft "))
            && text
                .lines()
                .any(|l| l.trim_start().starts_with("proxy read -> proxy write")),
        "the gateway's TTFT stage and forward delay are listed: {text}"
    );

    // The master key went over the wire in every request; it is in no output.
    assert_no_secrets_in_outputs(&path, dir.path(), &[MASTER_KEY]);
}
