//! tokenscope: where did the time to first token go? See `tokenscope --help`.

#![allow(unused_crate_dependencies)] // the library's dependencies are linked here too

use std::process::ExitCode;

use clap::Parser;
use tokenscope::cli;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // One line with its context chain, like bpftop and oha.
            eprintln!("tokenscope: error: {e:#}");
            if unsupported_kernel(&e) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// No BTF, no usable I/O source, or no privilege to load eBPF: the host (or this
/// process) cannot run the probes (exit status 2).
fn unsupported_kernel(e: &anyhow::Error) -> bool {
    use collector::probes::ProbeError;
    use collector::record::live::LiveError;
    use collector::record::RecordSessionError;
    e.chain().any(|c| {
        c.downcast_ref::<ProbeError>()
            .is_some_and(ProbeError::is_unsupported_kernel)
            || c.downcast_ref::<RecordSessionError>()
                .is_some_and(RecordSessionError::is_unsupported_kernel)
            || c.downcast_ref::<LiveError>()
                .is_some_and(LiveError::is_unsupported_kernel)
    })
}
