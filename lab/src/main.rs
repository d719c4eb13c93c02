//! tokenscope-lab: the simulated serving chain and the demo. See `tokenscope-lab --help`.

#![allow(unused_crate_dependencies)] // the library's dependencies are linked here too

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = tokenscope_lab::cli::LabCli::parse();
    match tokenscope_lab::cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenscope-lab: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
