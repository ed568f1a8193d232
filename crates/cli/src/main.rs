//! The `headroom` command: plan a training run that fits, run it, and see where every byte went.

mod commands;
mod report;
mod signals;

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
    /// Train a model on headroom's engine inside a device budget and report where every byte went.
    ///
    /// With no arguments: a small GPT on the bundled corpus (Milton's Paradise Lost), 200 steps,
    /// with the fastest strategy that fits 512 MiB of device memory (`--auto`), ending with the
    /// memory summary, the bytes per category at the peak next to the dry run's prediction, and a
    /// memory timeline picture.
    Train(Box<commands::train::TrainArgs>),
    /// Measure the memory levers and the predictions: checkpointing against depth and per policy,
    /// predicted against measured memory, and the speed model against measured steps.
    #[command(subcommand)]
    Bench(commands::bench::BenchCommand),
    /// Prepare training data: tokenize a corpus once into a compact token file that `headroom
    /// train --data FILE` memory-maps.
    #[command(subcommand)]
    Data(commands::data::DataCommand),
    /// Inspect device memory: replay allocation traces through the allocator, compare allocators.
    #[command(subcommand)]
    Memory(commands::memory::MemoryCommand),
    /// Choose the fastest combination of memory levers that fits a model on given hardware.
    Plan(Box<commands::plan::PlanArgs>),
    /// Count a model's parameters: total, largest layer, per-module breakdown.
    Params(commands::params::ParamsArgs),
    /// Reproduce DeepSpeed's and Accelerate's memory estimators for comparison.
    #[command(subcommand)]
    Estimate(commands::estimate::EstimateCommand),
}

/// A closed stdout (`headroom … | head -1`) ends the process quietly, as it does for other
/// command-line tools: the default action of SIGPIPE (exit status 141 in a shell) instead of
/// Rust's default of ignoring it, which turns the failed write into a panic.
fn die_quietly_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    die_quietly_on_closed_stdout();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(args) => commands::train::run(*args),
        Command::Bench(cmd) => commands::bench::run(cmd),
        Command::Memory(cmd) => commands::memory::run(cmd),
        Command::Data(cmd) => commands::data::run(cmd),
        Command::Plan(args) => commands::plan::run(*args),
        Command::Params(args) => commands::params::run(args),
        Command::Estimate(cmd) => commands::estimate::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The run saved and said how to resume; the status says which signal stopped it.
        Err(err) if err.downcast_ref::<signals::Interrupted>().is_some() => {
            let code = err
                .downcast_ref::<signals::Interrupted>()
                .map_or(1, |i| i.exit_code());
            ExitCode::from(code)
        }
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: a cause whose text the message already holds (an
/// OS error quoted by the error that wraps it) is not repeated.
fn describe(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out += ": ";
        }
        out += &text;
    }
    out
}
