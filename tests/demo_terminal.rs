//! Privileged: `tokenscope-lab demo` on a terminal (tmux) opens `tokenscope top` live
//! while the lab load runs, and prints tokenscope's report once top is quit.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::time::Duration;

use test_support::tmux::Tmux;
use test_support::{lab, profiler};
use tokenscope_lab::profiler::PROFILER_ENV;

#[test]
fn demo_on_a_terminal_opens_top_then_prints_the_report() {
    let cmd = format!(
        "{}={} {} demo --duration 4s; echo DEMO-EXIT-$?; sleep 600",
        PROFILER_ENV,
        profiler().display(),
        lab().display()
    );
    let tmux = Tmux::start(120, 40, &cmd)
        .with_patience(Duration::from_secs(120))
        .with_history(200);
    // Until a stream has finished in top (97 events: the role chunk and 96 tokens).
    let finished = |s: &str| {
        s.lines()
            .any(|l| l.contains("/v1/chat/completions") && l.split_whitespace().any(|w| w == "97"))
    };
    let live = tmux.wait_for("top with a finished stream", |s| {
        s.contains("tokenscope top") && finished(s)
    });
    assert!(live.contains("live"), "top runs live:\n{live}");
    // The load lasts a fixed 4 s (then its last streams finish); top is quit after that,
    // so its recording holds whole streams. (Nothing in top's screen marks the end of the
    // demo's load, hence a wait for its known length rather than for an event.)
    std::thread::sleep(Duration::from_secs(8));
    tmux.keys(&["q"]);
    let done = tmux.wait_for("the demo to finish", |s| s.contains("DEMO-EXIT-"));
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
