//! tokenscope, the profiler binary's command line as a library: `main.rs` parses and
//! calls [`cli::run`]; `cargo xtask dist` renders the same definitions as shell
//! completions and man pages (examples/dist_assets.rs).

#![cfg_attr(test, allow(unused_crate_dependencies))] // unit tests see every dev-dependency

pub mod agent_cli;
pub mod cli;
pub mod probe_args;
