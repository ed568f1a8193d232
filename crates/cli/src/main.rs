//! The `headroom` command: plan a training run that fits, run it, and see where every byte went.

mod commands;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// headroom fits deep-learning training into the memory you have.
///
/// It predicts every byte a training step needs under each combination of memory levers
/// (precision, micro-batch and accumulation, activation checkpointing, ZeRO sharding, offload),
/// picks the fastest combination that fits, and measures real runs through a caching allocator
/// with PyTorch-compatible statistics.
#[derive(Debug, Parser)]
#[command(name = "headroom", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect device memory: replay allocation traces through the allocator, compare allocators.
    #[command(subcommand)]
    Memory(commands::memory::MemoryCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Memory(cmd) => commands::memory::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
