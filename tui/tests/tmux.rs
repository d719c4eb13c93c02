//! The real binary in a real terminal (tmux): replay the fixture, sort,
//! filter, open a request, quit; the shell's screen and tty modes come back.
#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

mod common;

use std::process::Command;

use test_support::tmux::Tmux;

const BIN: &str = env!("CARGO_BIN_EXE_tokenscope-top");

fn has_line(screen: &str, text: &str) -> bool {
    screen.lines().any(|l| l.trim_end() == text)
}

#[test]
fn replay_sort_filter_open_and_quit_restore_the_terminal() {
    let tmux = Tmux::shell(100, 30);
    let dir = tempfile::tempdir().expect("tempdir");
    let stty_before = dir.path().join("stty.before");
    let stty_after = dir.path().join("stty.after");
    tmux.type_text(&format!(
        "echo before-top; stty -g > {}; {BIN} --replay {} --speed 0; echo top-exit=$?",
        stty_before.display(),
        common::fixture().display()
    ));
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the table with the replayed requests", |s| {
        s.contains("tokenscope top") && s.contains("replay done") && s.contains("24/24 shown")
    });
    assert_eq!(
        tmux.pane_flag("#{alternate_on}"),
        "1",
        "top uses the alternate screen"
    );
    assert!(
        screen.contains("/v1/chat/completions") && screen.contains("/v1/completions"),
        "both routes listed:\n{screen}"
    );
    assert!(
        screen.contains("diagnoses (3)") && screen.contains("[2] turn proxy buffering off"),
        "the diagnoses panel names the untuned proxy's buffering first:\n{screen}"
    );

    tmux.keys(&["s"]);
    tmux.wait_for("sorted by TTFT", |s| s.contains("sorted by TTFT"));

    tmux.keys(&["/"]);
    tmux.type_text("chat");
    tmux.wait_for("the filter narrowing to the chat route", |s| {
        s.contains("6/24 shown") || s.contains("/chat")
    });
    tmux.keys(&["Enter"]);
    let filtered = tmux.wait_for("the filter applied", |s| {
        s.contains("6/24 shown") && s.contains("│ /chat")
    });
    assert!(
        !filtered.contains("127.0.0.1:27312"),
        "the proxied route is filtered out of the table:\n{filtered}"
    );

    tmux.keys(&["Enter"]);
    let detail = tmux.wait_for("the request detail", |s| {
        s.contains("waterfall") && s.contains("tokens per point")
    });
    assert!(
        detail.contains("engine write") && detail.contains("client read"),
        "both points of a direct request:\n{detail}"
    );
    tmux.keys(&["Escape"]);
    tmux.wait_for("the table again", |s| s.contains("sorted by TTFT"));

    tmux.keys(&["q"]);
    let after = tmux.wait_for("top to exit", |s| {
        s.lines().any(|l| l.trim_end().starts_with("top-exit="))
    });
    assert!(has_line(&after, "top-exit=0"), "top exited 0:\n{after}");
    assert!(
        has_line(&after, "before-top") && !after.contains("tokenscope top │"),
        "the shell's screen is back, top's is gone:\n{after}"
    );
    assert_eq!(
        tmux.pane_flag("#{alternate_on}"),
        "0",
        "alternate screen left"
    );
    assert_eq!(tmux.pane_flag("#{cursor_flag}"), "1", "cursor shown again");

    tmux.type_text(&format!(
        "stty -g > {}; echo stty-saved",
        stty_after.display()
    ));
    tmux.keys(&["Enter"]);
    tmux.wait_for("stty saved", |s| has_line(s, "stty-saved"));
    let before = std::fs::read_to_string(&stty_before).expect("stty before");
    let after = std::fs::read_to_string(&stty_after).expect("stty after");
    assert_eq!(before, after, "tty modes (raw mode off) restored");
}

#[test]
fn without_a_terminal_top_says_so_in_one_line() {
    let out = Command::new(BIN)
        .args(["--replay"])
        .arg(common::fixture())
        .output()
        .expect("run tokenscope-top");
    assert!(!out.status.success(), "fails without a terminal");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("needs a terminal"), "{stderr}");
}

#[test]
fn a_ring_size_the_probes_would_refuse_is_refused_before_the_screen() {
    for bad in ["1000", "12288", "lots"] {
        let out = Command::new(BIN)
            .args(["--ring-size", bad])
            .output()
            .expect("run tokenscope-top");
        assert!(!out.status.success(), "--ring-size {bad} refused");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--ring-size"), "{stderr}");
        assert!(
            !stderr.contains("needs a terminal"),
            "refused first: {stderr}"
        );
    }
    let help = Command::new(BIN).arg("--help").output().expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--ring-size <BYTES>"), "{help}");
    assert!(
        help.contains("[default: 4194304]"),
        "top's own default: {help}"
    );
}

#[test]
fn replay_at_speed_pauses_follows_resizes_and_sigterm_restores_the_terminal() {
    let tmux = Tmux::shell(100, 30);
    tmux.type_text(&format!(
        "echo before-top; {BIN} --replay {} --speed 1; echo top-exit=$?",
        common::fixture().display()
    ));
    tmux.keys(&["Enter"]);
    tmux.wait_for("requests replayed at speed 1", |s| {
        s.contains("tokenscope top") && s.contains("/v1/completions")
    });
    tmux.keys(&["p"]);
    tmux.wait_for("the pause mark", |s| s.contains("PAUSED"));

    tmux.resize(80, 24);
    let small = tmux.wait_for("the 80x24 layout", |s| {
        s.lines().count() == 24
            && s.lines().last().is_some_and(|l| l.contains("PAUSED"))
            && s.contains("ITL per route")
    });
    assert!(
        small.lines().all(|l| l.chars().count() <= 80),
        "nothing drawn past 80 columns:\n{small}"
    );
    tmux.keys(&["p"]);
    tmux.wait_for("the pause lifted", |s| !s.contains("PAUSED"));

    let shell: u32 = tmux.pane_flag("#{pane_pid}").parse().expect("pane pid");
    let top = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children"))
        .expect("the shell's children");
    let top: i32 = top
        .split_whitespace()
        .next()
        .expect("top runs under the shell")
        .parse()
        .expect("pid");
    // SAFETY: kill(2) on the top process this test started.
    assert_eq!(unsafe { libc::kill(top, libc::SIGTERM) }, 0, "SIGTERM sent");
    let after = tmux.wait_for("top to exit on SIGTERM", |s| {
        s.lines().any(|l| l.trim_end().starts_with("top-exit="))
    });
    assert!(has_line(&after, "top-exit=0"), "clean exit:\n{after}");
    assert!(
        has_line(&after, "before-top"),
        "shell screen back:\n{after}"
    );
    assert_eq!(
        tmux.pane_flag("#{alternate_on}"),
        "0",
        "alternate screen left"
    );
}
