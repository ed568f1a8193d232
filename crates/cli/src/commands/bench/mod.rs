//! `headroom bench …`: reproducible measurements of the memory levers, printed as tables, with
//! `--json` for tools and pictures where a curve says more than a table.

pub mod checkpoint;
pub mod collectives;
pub mod loader;
pub mod offload;
pub mod predict;
pub mod speed;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Activation checkpointing: Chen et al.'s memory-vs-depth experiment on the residual MLP
    /// (none, all, √n, budget), and on the GPT the step-time overhead of each policy and the
    /// longest sequence that fits a device budget.
    Checkpoint(checkpoint::CheckpointBenchArgs),
    /// The communicators' bandwidth per collective and size: the in-process thread group, and
    /// under mpirun (the mpi build) headroom's MPI communicator against plain MPI.
    Collectives(collectives::CollectivesBenchArgs),
    /// Predicted against measured memory over 32 configurations of the GPT and the residual MLP
    /// (precision × micro-batch × accumulation × checkpoint policy × attention): the dry run's
    /// error and the planner's analytical model's.
    Predict(predict::PredictBenchArgs),
    /// The data loader: its throughput alone against what training consumes, the share of step
    /// time spent waiting for data with 0, 1 and 2 workers (default and input-bound models), and
    /// page-locked against pageable copy bandwidth into device memory.
    Loader(loader::LoaderBenchArgs),
    /// Offload on this machine: the host optimizer step against the engine's and a plain loop,
    /// device↔host copies, the disk tier against plain sequential I/O, and the step time of
    /// each offload mode (on the default model, and on one that only fits with offload);
    /// `--write-hardware` saves the rates for `headroom plan --hardware`.
    Offload(offload::OffloadBenchArgs),
    /// How well --auto's speed model predicts and ranks the step time of each strategy against
    /// measured steps.
    Speed(speed::SpeedBenchArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Checkpoint(args) => checkpoint::run(args),
        BenchCommand::Collectives(args) => collectives::run(args),
        BenchCommand::Predict(args) => predict::run(args),
        BenchCommand::Speed(args) => speed::run(args),
        BenchCommand::Loader(args) => loader::run(args),
        BenchCommand::Offload(args) => offload::run(args),
    }
}
