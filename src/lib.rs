//! tokenscope, the profiler binary's command line as a library: `main.rs` parses and
//! calls [`cli::run`].

pub mod cli;
