//! Privileged (root, eBPF): top's state fed by a live recording of the lab,
//! without a terminal. Requests appear within 1 s of the bench starting, and
//! the recording stops cleanly (probes detached, file sealed).
//!
//! The recorder never traces its own process, so the lab engine and the bench
//! run in a child: this test binary again, running `lab_child` only.
#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use collector::clock::monotonic_ns;
use collector::pipeline::Config;
use collector::record::RecordOptions;
use tokenscope_lab::bench::{self, BenchConfig};
use tokenscope_lab::{Engine, EngineConfig};
use tokenscope_tui::feed::Live;
use tokenscope_tui::Meta;

mod common;

const CHILD_ENV: &str = "TOKENSCOPE_TOP_LAB_CHILD";
/// The app draws every 100 ms; poll at least as often.
const FRAME: Duration = Duration::from_millis(50);

#[test]
fn lab_requests_appear_within_a_second_of_the_bench_starting() {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "lab_child", "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the lab child");
    let lines = common::ChildLines::of(&mut child);
    let wait_line = |prefix: &str| lines.said(prefix);
    let port: u16 = wait_line("engine-port ").parse().expect("port");

    let opts = RecordOptions::ports(vec![port], collector::record::sink::Output::Discard);
    let mut live = Live::start(opts).expect("live recording");
    let (attached, _) = live
        .wait_started(Duration::from_secs(60))
        .expect("probes attached (this test needs root and eBPF)");
    let mut top = common::Top::new(
        Meta {
            source: "live".into(),
            probes_attached: attached,
            start_ns: monotonic_ns(),
            ..Meta::default()
        },
        60_000_000_000,
        Config::live(),
    );

    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "go").expect("tell the child to start the bench");
    let started = Instant::now();
    let mut appeared = None;
    while started.elapsed() < Duration::from_secs(10) {
        for batch in live.take_batches() {
            top.events(batch);
        }
        let now = monotonic_ns();
        top.tick(now, now);
        if top
            .state
            .shown
            .rows
            .iter()
            .any(|r| r.route.ends_with("/v1/completions"))
        {
            appeared = Some(started.elapsed());
            break;
        }
        std::thread::sleep(FRAME);
    }
    let ok = wait_line("bench-ok ");
    assert_eq!(ok, "true", "every bench request succeeded");
    let status = child.wait().expect("lab child exit");
    assert!(status.success(), "lab child: {status}");
    let header = live
        .stop()
        .expect("the recording was running")
        .expect("the recording stopped cleanly");
    assert!(
        header.complete,
        "recording sealed: probes detached and drained"
    );
    let appeared = appeared.unwrap_or_else(|| {
        panic!(
            "no request in top's table 10 s after the bench started ({} events)",
            top.analysis.events_total()
        )
    });
    println!("first request in the table {appeared:?} after the bench started");
    assert!(
        appeared <= Duration::from_secs(1),
        "a request appears within 1 s of the bench starting (took {appeared:?})"
    );
}

/// The child: the lab engine, then the bench when the parent says go.
#[test]
#[ignore = "run by lab_requests_appear_within_a_second_of_the_bench_starting"]
fn lab_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let engine = Engine::start(EngineConfig::default(), "127.0.0.1:0".parse().unwrap())
            .await
            .expect("lab engine");
        println!("engine-port {}", engine.addr().port());
        let mut go = String::new();
        std::io::stdin().read_line(&mut go).expect("go");
        let outcome = bench::run(&BenchConfig {
            url: format!("http://{}", engine.addr()),
            concurrency: 4,
            requests: Some(8),
            prompt_tokens: 64,
            max_tokens: 48,
            progress: false,
            timeout: Duration::from_secs(60),
            ..BenchConfig::default()
        })
        .await
        .expect("bench");
        println!(
            "bench-ok {}",
            !outcome.records.is_empty() && outcome.records.iter().all(|r| r.ok)
        );
        engine.shutdown().await;
    });
}
