//! tokenscope: where did the time to first token go? See `tokenscope --help`.

mod cli;
mod demo;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // One line with its context chain, like bpftop and oha.
            eprintln!("tokenscope: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
