//! `cargo xtask dist`: what ships, in `dist/`. The profiler binary from the `dist`
//! profile (lto, one codegen unit, stripped; the lab is another binary and stays
//! out), with its size; the CUPTI hook an engine loads beside it; shell completions
//! (bash, zsh, fish) and man pages rendered from the binary's clap definitions.

use anyhow::{Context, Result};

pub(crate) fn run() -> Result<()> {
    let built = build()?;
    let dist = crate::root().join("dist");
    if dist.exists() {
        std::fs::remove_dir_all(&dist).with_context(|| format!("emptying {}", dist.display()))?;
    }
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    for file in ["tokenscope", "libtokenscope_cupti_hook.so"] {
        std::fs::copy(built.join(file), dist.join(file))
            .with_context(|| format!("copying {file} from {}", built.display()))?;
    }
    let dir = dist.to_str().context("a UTF-8 workspace path")?;
    crate::cargo(&[
        "run",
        "--quiet",
        "-p",
        "tokenscope",
        "--example",
        "dist_assets",
        "--",
        dir,
    ])?;
    for file in ["tokenscope", "libtokenscope_cupti_hook.so"] {
        let bytes = std::fs::metadata(dist.join(file))?.len();
        println!(
            "xtask: dist/{file}: {bytes} bytes ({:.1} MiB)",
            bytes as f64 / (1024.0 * 1024.0)
        );
    }
    println!(
        "xtask: completions in dist/completions, man pages in dist/man (man -l dist/man/tokenscope.1)"
    );
    Ok(())
}

/// Builds what ships (the profiler and the CUPTI hook, `dist` profile); the folder
/// they are in. `cargo xtask bench` measures this profiler.
pub(crate) fn build() -> Result<std::path::PathBuf> {
    // Only the profiler's packages: building the lab in the same run would unify its
    // features (the stand-in libraries) into the profiler's dependencies.
    crate::cargo(&[
        "build",
        "--profile",
        "dist",
        "-p",
        "tokenscope",
        "-p",
        "tokenscope-cupti-hook",
    ])?;
    Ok(crate::target_dir().join("dist"))
}
