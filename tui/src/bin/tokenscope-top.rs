//! `tokenscope top` on its own (the main CLI wires the same `run_top`); the
//! tmux smoke test runs this binary.
#![allow(unused_crate_dependencies)] // the library's dependencies are linked here too

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "tokenscope-top",
    about = "The live terminal view of LLM token streams",
    after_help = tokenscope_tui::AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    top: tokenscope_tui::TopArgs,
}

fn main() -> std::process::ExitCode {
    match tokenscope_tui::run_top(Cli::parse().top) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenscope-top: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
