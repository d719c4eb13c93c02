//! `cargo run --example dist_assets -- DIR`: writes `tokenscope`'s shell completions
//! (bash, zsh, fish) to DIR/completions and its man pages (one per subcommand too) to
//! DIR/man, rendered from the clap definitions the binary parses with. Run by
//! `cargo xtask dist`; an example, so the generators never link into the profiler.

#![allow(unused_crate_dependencies)] // an example sees every dev-dependency

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .expect("usage: dist_assets DIR");
    // `tokenscope help CMD` is `tokenscope CMD --help`: no page or completion of its own.
    let mut cmd = tokenscope::cli::Cli::command().disable_help_subcommand(true);
    let completions = dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, "tokenscope", &completions)?;
        println!("{}", path.display());
    }
    let man = dir.join("man");
    std::fs::create_dir_all(&man)?;
    clap_mangen::generate_to(cmd, &man)?;
    for page in std::fs::read_dir(&man)? {
        println!("{}", page?.path().display());
    }
    Ok(())
}
