//! `cargo xtask demo`: the main job. Builds the profiler and the lab and runs
//! `tokenscope-lab demo --compare`: the lab engine behind real nginx, untuned then
//! tuned, under the same load, recorded by the `tokenscope` beside it, with each
//! side's report and the side-by-side table.

use std::process::Command;

use anyhow::Result;

pub(crate) fn run() -> Result<()> {
    crate::setup::run()?;
    let lab = crate::build_binaries(false)?.join("tokenscope-lab");
    crate::run(Command::new(lab).args(["demo", "--compare"]))
}
