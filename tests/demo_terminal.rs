//! Privileged: `tokenscope demo` on a terminal (tmux) opens `tokenscope top` live
//! while the lab load runs, and prints tokenscope's report once top is quit.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::BIN;

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .expect("run tmux (installed by cargo xtask setup)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls the pane until `pred` holds (the screen is the event we wait for).
fn wait_for(session: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let screen = tmux(&["capture-pane", "-t", session, "-p", "-S", "-200"]);
        if pred(&screen) {
            return screen;
        }
        assert!(
            Instant::now() < deadline,
            "waited 120 s for {what}; screen:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn demo_on_a_terminal_opens_top_then_prints_the_report() {
    let session = format!("ts-demo-{}", std::process::id());
    let cmd = format!("{BIN} demo --duration 4s; echo DEMO-EXIT-$?; sleep 600");
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "40",
        &cmd,
    ]);
    // Until a stream has finished in top (97 events: the role chunk and 96 tokens).
    let finished = |s: &str| {
        s.lines()
            .any(|l| l.contains("/v1/chat/completions") && l.split_whitespace().any(|w| w == "97"))
    };
    let live = wait_for(&session, "top with a finished stream", |s| {
        s.contains("tokenscope top") && finished(s)
    });
    assert!(live.contains("live"), "top runs live:\n{live}");
    // The load lasts a fixed 4 s (then its last streams finish); top is quit after that,
    // so its recording holds whole streams. (Nothing in top's screen marks the end of the
    // demo's load, hence a wait for its known length rather than for an event.)
    std::thread::sleep(Duration::from_secs(8));
    tmux(&["send-keys", "-t", &session, "q"]);
    let done = wait_for(&session, "the demo to finish", |s| s.contains("DEMO-EXIT-"));
    tmux(&["kill-session", "-t", &session]);
    assert!(done.contains("DEMO-EXIT-0"), "the demo exits 0:\n{done}");
    assert!(
        done.contains("tokenscope's view of the same run"),
        "the report follows top:\n{done}"
    );
    assert!(
        done.contains("client read") && done.contains("engine write"),
        "with TTFT per point:\n{done}"
    );
}
