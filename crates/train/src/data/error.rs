//! What can go wrong between the data on disk and a batch: a corpus or token file that cannot
//! be used, a worker that failed or died, a host budget too small for one batch.
//!
//! Not for: errors of the model or the device (the trainer's `TrainError` wraps this).

use super::corpus::CorpusError;
use super::token_file::TokenFileError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
    #[error("{path}: {source}")]
    Tokenizer {
        path: PathBuf,
        source: super::tokenizer::TokenizerError,
    },
    #[error("data-loader worker {worker} failed: {source}")]
    Worker {
        worker: usize,
        source: TokenFileError,
    },
    #[error(
        "data-loader worker {worker} stopped unexpectedly ({reason}); the run ends rather than wait for its batches"
    )]
    WorkerLost { worker: usize, reason: String },
    #[error(
        "{path} holds tokens of a vocabulary of {vocab}, but the model embeds {model_vocab}; give a model TOML (--model FILE) with vocab = {vocab} or more"
    )]
    Vocabulary {
        path: PathBuf,
        vocab: u64,
        model_vocab: usize,
    },
    #[error(
        "--host-memory {budget} cannot hold the data loader's least of {batch} (one batch's staging buffers, and one queued batch and the workers' stacks with --workers); raise --host-memory or lower --micro-batch or --workers"
    )]
    HostBudget { budget: String, batch: String },
    #[error(
        "all {buffers} staging buffers are held by batches not yet dropped; drop a batch before asking for the next"
    )]
    BuffersHeld { buffers: usize },
    #[error("cannot start data-loader worker {worker}: {source}")]
    Spawn {
        worker: usize,
        source: std::io::Error,
    },
}
