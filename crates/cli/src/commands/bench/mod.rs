//! `headroom bench …`: reproducible measurements of the memory levers, printed as tables, with
//! `--json` for tools and pictures where a curve says more than a table.

pub mod checkpoint;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Activation checkpointing: Chen et al.'s memory-vs-depth experiment on the residual MLP
    /// (none, all, √n, budget), and on the GPT the step-time overhead of each policy and the
    /// longest sequence that fits a device budget.
    Checkpoint(checkpoint::CheckpointBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Checkpoint(args) => checkpoint::run(args),
    }
}
