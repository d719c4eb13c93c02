//! `cargo xtask fixtures`: re-records the recordings the diagnosis rules are tested on
//! (tests/fixtures/diagnose/NAME.tsrec.gz, checked by tests/diagnose_fixtures.rs), one
//! per lab scenario: `tokenscope-lab scenario NAME -o FILE` reproduces a pathology or
//! its fix on this machine (real TCP, nginx, nftables, the lab engine) and records it.
//! They are committed, gzip-compressed, so the rule tests replay exactly these bytes.

use std::process::Command;

use anyhow::{Context, Result};

const SCENARIOS: &[&str] = &[
    "untuned",
    "tuned-plain",
    "queued",
    "queued-fixed",
    "nagle",
    "nagle-fixed",
    "lossy",
    "lossless",
    "slow-client",
    "fast-client",
    "gpu-throttled",
    "gpu-cool",
    "host-bound",
    "host-bound-fixed",
    "kv-preempt",
    "kv-preempt-fixed",
    "untuned-keepalive",
    "untuned-unbuffered",
    "untuned-no-gzip",
    "untuned-prefix-cache",
    "untuned-chunked-prefill",
    "prefill-stall",
    "prefill-stall-fixed",
];

/// Re-records `only` (every scenario when empty).
pub(crate) fn run(only: &[String]) -> Result<()> {
    if let Some(unknown) = only.iter().find(|n| !SCENARIOS.contains(&n.as_str())) {
        anyhow::bail!(
            "no scenario '{unknown}'; scenarios: {}",
            SCENARIOS.join(", ")
        );
    }
    crate::setup::run()?;
    let lab = crate::build_binaries(false)?.join("tokenscope-lab");
    let dir = crate::root().join("tests/fixtures/diagnose");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let scratch = std::env::temp_dir().join(format!("tokenscope-fixtures-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    for name in SCENARIOS
        .iter()
        .filter(|n| only.is_empty() || only.iter().any(|o| o == *n))
    {
        let raw = scratch.join(format!("{name}.tsrec"));
        println!("xtask: recording scenario {name}");
        crate::run(Command::new(&lab).args(["scenario", name, "-o"]).arg(&raw))?;
        let gz = dir.join(format!("{name}.tsrec.gz"));
        crate::run(
            Command::new("sh")
                .arg("-c")
                .arg("gzip -9 -n -c \"$0\" > \"$1\"")
                .arg(&raw)
                .arg(&gz),
        )?;
    }
    std::fs::remove_dir_all(&scratch)?;
    println!(
        "xtask: fixtures written to {}; run `cargo test --test diagnose_fixtures`",
        dir.display()
    );
    Ok(())
}
