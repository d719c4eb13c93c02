//! `cargo xtask demo`: the main job. Builds tokenscope and runs `tokenscope demo
//! --compare`: the lab engine behind real nginx, untuned then tuned, under the same
//! load, with each side's report and the side-by-side table.

use std::process::Command;

use anyhow::Result;

pub fn run() -> Result<()> {
    crate::setup::run()?;
    crate::cargo(&["build", "--bin", "tokenscope"])?;
    let bin = crate::root().join("target/debug/tokenscope");
    crate::run(Command::new(bin).args(["demo", "--compare"]))
}
