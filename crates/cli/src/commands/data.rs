//! `headroom data prepare`: tokenizes a text file, or every file of a directory in name order,
//! once into a token file (header, checksum, u16 or u32 tokens) that `headroom train --data
//! FILE` memory-maps instead of loading.
//!
//! A first SIGINT, SIGTERM or SIGHUP stops it at the next piece of about 1 MiB: the unfinished
//! token file is removed and the process exits with 128 + the signal.
//!
//! Not for: training (see `train`).

use crate::signals::{Interrupted, StopSignals};
use anyhow::Context;
use clap::{Args, Subcommand};
use headroom_memory::size::format_bytes;
use headroom_train::data::prepare::{PrepareError, PrepareLimits, prepare};
use headroom_train::data::tokenizer::Tokenizer;
use std::path::PathBuf;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Tokenize TEXT (a file, or a directory whose files are taken in name order) into a token
    /// file: a checksummed header and the tokens as u16 (vocabularies up to 65,536) or u32.
    /// The file appears whole when done, never half-written. Train on it with `headroom train
    /// --data FILE`; a damaged or truncated file is refused with its name.
    Prepare(PrepareArgs),
}

#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// A text file, or a directory of text files (hidden files are skipped).
    #[arg(value_name = "TEXT|DIR")]
    pub input: PathBuf,
    /// The token file to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// `byte` (every byte a token, vocabulary 256; the model presets' vocabulary) or the path
    /// of a Hugging Face tokenizer.json (builds with the `hf-tokenizer` feature; the model then
    /// needs a vocabulary at least as large, from a model TOML).
    #[arg(long, default_value = "byte", value_name = "byte|FILE")]
    pub tokenizer: String,
    /// Read a TEXT that is not a regular file (a FIFO, a character device such as
    /// /dev/stdin). Its length is unknown, so only --max-tokens and the free space of the
    /// output's filesystem bound what is written.
    #[arg(long)]
    pub allow_stream: bool,
    /// Most tokens to write; a text that gives more is refused (nothing is written).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Print what was written as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: DataCommand) -> anyhow::Result<()> {
    match cmd {
        DataCommand::Prepare(args) => run_prepare(args),
    }
}

fn run_prepare(args: PrepareArgs) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::load(&args.tokenizer)?;
    let signals = StopSignals::install_acknowledging(
        "stopping; the unfinished token file is removed (send it again to stop at once)",
    )
    .context("cannot install the handlers of SIGINT, SIGTERM and SIGHUP")?;
    let limits = PrepareLimits {
        allow_stream: args.allow_stream,
        max_tokens: args.max_tokens,
        stop: Some(&signals.requested),
        ..PrepareLimits::default()
    };
    let prepared = match prepare(&args.input, &args.out, &tokenizer, &limits) {
        Err(e @ PrepareError::Stopped { .. }) => {
            let interrupted = Interrupted {
                signal: signals.received().unwrap_or(libc::SIGINT),
            };
            eprintln!("headroom: data prepare {interrupted}: {e}");
            return Err(interrupted.into());
        }
        other => other.with_context(|| format!("cannot prepare {}", args.input.display()))?,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&prepared)?);
        return Ok(());
    }
    println!(
        "{}: {} tokens ({} tokenizer, vocabulary {}, {} bytes each) from {} of text in {} file{}, {} written in {:.1} s; train on it with: headroom train --data {}",
        prepared.out.display(),
        prepared.tokens,
        prepared.tokenizer,
        prepared.vocab_size,
        prepared.token_bytes,
        format_bytes(prepared.text_bytes),
        prepared.files,
        if prepared.files == 1 { "" } else { "s" },
        format_bytes(prepared.file_bytes),
        prepared.seconds,
        prepared.out.display()
    );
    Ok(())
}
