//! The `headroom` command as a library: [`run`] is the whole command line (the binary's `main`
//! and the Python package's console script call it), [`run_json`] runs one command and hands
//! back its `--json` report as a string (the Python module's `plan` and `replay`).
//!
//! Not for: planning or replay logic, which live in the `plan`, `train` and `memory` crates;
//! this crate parses, calls and prints.

mod commands;
mod json_out;
mod report;
mod signals;

use clap::{Parser, Subcommand};
use std::ffi::OsString;

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
    /// Trace a PyTorch training step without a GPU and replay it through the allocator.
    ///
    /// Builds a Hugging Face model from its config.json (or your model factory) under PyTorch's
    /// fake tensors (no weights, no device memory), runs training steps, records every tensor
    /// allocation and free with its category, phase, module and op, writes the trace and
    /// replays it as `headroom memory replay` does. Needs Python with torch and transformers
    /// (`pip install headroom-mem torch transformers`); set HEADROOM_PYTHON to choose the
    /// interpreter.
    Trace(Box<commands::trace::TraceArgs>),
    /// Count a model's parameters: total, largest layer, per-module breakdown.
    Params(commands::params::ParamsArgs),
    /// Reproduce DeepSpeed's and Accelerate's memory estimators for comparison.
    #[command(subcommand)]
    Estimate(commands::estimate::EstimateCommand),
}

/// A closed stdout (`headroom … | head -1`) ends the process quietly, as it does for other
/// command-line tools: the default action of SIGPIPE (exit status 141 in a shell) instead of
/// Rust's default of ignoring it, which turns the failed write into a panic. Only for a process
/// that is the command line itself (not a library call inside another program).
pub fn die_quietly_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Runs the command line `argv` (the program name first, as `std::env::args_os()` gives it):
/// prints its output and errors, and returns the exit status (0 on success). `--help`,
/// `--version` and argument errors print and return instead of exiting the process.
pub fn run<I, T>(argv: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return err.exit_code().clamp(0, 255) as u8;
        }
    };
    match dispatch(cli.command) {
        Ok(()) => 0,
        // The run saved and said how to resume; the status says which signal stopped it.
        Err(err) if err.downcast_ref::<signals::Interrupted>().is_some() => err
            .downcast_ref::<signals::Interrupted>()
            .map_or(1, |i| i.exit_code()),
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            1
        }
    }
}

/// What [`run_json`] produced: the `--json` report if the command wrote one, and the error if
/// it failed (both when the report was written and the command then failed, as `plan` does
/// when no plan fits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonRun {
    pub report: Option<String>,
    pub error: Option<String>,
}

/// Runs the command line `argv` (program name first; give `--json`) and returns its JSON report
/// as a string instead of printing it. Argument errors and `--help` come back as the error.
pub fn run_json<I, T>(argv: I) -> JsonRun
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(err) => {
            return JsonRun {
                report: None,
                error: Some(err.render().to_string().trim_end().to_string()),
            };
        }
    };
    let (result, report) = json_out::capturing(|| dispatch(cli.command));
    JsonRun {
        report,
        error: result.err().map(|e| describe(&e)),
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Train(args) => commands::train::run(*args),
        Command::Bench(cmd) => commands::bench::run(cmd),
        Command::Memory(cmd) => commands::memory::run(cmd),
        Command::Data(cmd) => commands::data::run(cmd),
        Command::Plan(args) => commands::plan::run(*args),
        Command::Trace(args) => commands::trace::run(*args),
        Command::Params(args) => commands::params::run(args),
        Command::Estimate(cmd) => commands::estimate::run(cmd),
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
