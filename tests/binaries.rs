//! The profiler ships without the lab: `tokenscope` has only the profiler's commands,
//! and the lab's live in `tokenscope-lab`, which records with the profiler beside it.

#![allow(unused_crate_dependencies)] // a test binary sees every dev-dependency

use std::process::Command;

use test_support::{lab, profiler};

/// The subcommands `--help` lists.
fn commands(bin: &std::path::Path) -> Vec<String> {
    let out = Command::new(bin)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(out.status.success(), "{} --help exits 0", bin.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        // A command's name starts its line; wrapped help is indented further.
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn the_profiler_has_only_its_own_commands() {
    assert_eq!(
        commands(&profiler()),
        ["record", "dump", "report", "export", "diff", "top", "agent", "help"],
        "tokenscope --help"
    );
}

#[test]
fn the_lab_is_its_own_binary() {
    assert_eq!(
        commands(&lab()),
        [
            "demo",
            "bench",
            "engine",
            "proxy",
            "scenario",
            "replicate",
            "help"
        ],
        "tokenscope-lab --help"
    );
}
