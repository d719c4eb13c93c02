//! Developer entry point for the lab while it lives outside the tokenscope binary.
use clap::{Parser, Subcommand};
use tokenscope_lab::cli::{run_bench, run_demo, run_lab, BenchArgs, DemoArgs, LabArgs};

#[derive(Parser)]
#[command(name = "lab-dev", about = "tokenscope lab commands, standalone")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Bench(BenchArgs),
    Lab(LabArgs),
    Demo(DemoArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Bench(a) => run_bench(a),
        Command::Lab(a) => run_lab(a),
        Command::Demo(a) => run_demo(a),
    }
}
