//! Which tokens a run reads and how its loader is set up: the prepared token file that the
//! run's `data` key names (memory-mapped; checked whole before a real run, by its header and
//! length only for a dry run, which reads no tokens), or else the corpus text tokenized in
//! memory as before.
//!
//! Not for: the token file's format (see `token_file`) or the loader itself (see `loader`).

use super::corpus::{Corpus, CorpusError};
use super::dataset::Tokens;
use super::error::DataError;
use super::loader::{Loader, LoaderConfig};
use super::order::DistributedSampler;
use super::sampler::TokenSampler;
use super::token_file::{TokenFile, Verify, is_token_file};
use super::tokenizer::{Tokenizer, TokenizerError};
use crate::config::RunConfig;
use headroom_nn::checkpoint::TokenizerSource;
use headroom_nn::models::ModelSpec;
use std::path::PathBuf;

/// Share of the tokens held out for validation.
pub const VALIDATION_FRACTION: f64 = 0.1;

/// The sampler of a run: over the prepared token file `config.data` names, or over `corpus`.
pub fn run_sampler(
    config: &RunConfig,
    corpus: &Corpus,
    spec: &ModelSpec,
    seq_len: usize,
    verify: Verify,
) -> Result<TokenSampler, DataError> {
    let kind = config.sampler;
    let seed = config.seed;
    match config.data.as_deref().filter(|p| is_token_file(p)) {
        Some(path) => {
            let file = TokenFile::open(path, verify)?;
            let model_vocab = model_vocab(spec);
            if file.header().vocab_size > model_vocab as u64 {
                return Err(DataError::Vocabulary {
                    path: path.into(),
                    vocab: file.header().vocab_size,
                    model_vocab,
                });
            }
            let tokens = file.len();
            TokenSampler::over(
                Tokens::Mapped(file),
                seq_len,
                VALIDATION_FRACTION,
                seed,
                kind,
            )
            .map_err(|needed| {
                CorpusError::TooFewTokens {
                    name: path.display().to_string(),
                    tokens,
                    needed,
                }
                .into()
            })
        }
        None => {
            let tokens = Tokens::Owned(corpus_tokens(config, corpus)?);
            TokenSampler::over(tokens, seq_len, VALIDATION_FRACTION, seed, kind).map_err(|needed| {
                CorpusError::TooSmall {
                    name: corpus.name.clone(),
                    bytes: corpus.len(),
                    needed,
                }
                .into()
            })
        }
    }
}

/// The corpus's tokens: by the `tokenizer.json` of the model directory `--model` names, else
/// byte by byte.
fn corpus_tokens(config: &RunConfig, corpus: &Corpus) -> Result<Vec<u32>, DataError> {
    let model = PathBuf::from(&config.model);
    let failed = |path: &PathBuf| {
        let path = path.clone();
        move |source| DataError::Tokenizer { path, source }
    };
    let source = crate::pretrained::tokenizer(&config.model).map_err(|e| {
        failed(&model)(TokenizerError::Load {
            path: config.model.clone(),
            message: e.to_string(),
        })
    })?;
    let (path, tokenizer) = match source {
        None => return Ok(super::ByteTokenizer.encode(&corpus.bytes)),
        Some(TokenizerSource::File(path)) => {
            let t = Tokenizer::load(&path.to_string_lossy());
            (path, t)
        }
        // A GGUF file's tokenizer, from its metadata.
        Some(TokenizerSource::Json(text)) => {
            (model.clone(), Tokenizer::from_json(&text, &config.model))
        }
    };
    tokenizer
        .map_err(failed(&path))?
        .encode(&corpus.bytes)
        .map_err(failed(&path))
}

/// The loader of rank `rank` of `world`: workers and staging as configured for a real run; a
/// dry run (`dry`) collates nothing and starts no worker.
pub fn run_loader(
    config: &RunConfig,
    corpus: &Corpus,
    spec: &ModelSpec,
    seq_len: usize,
    (rank, world): (usize, usize),
    dry: bool,
) -> Result<Loader, DataError> {
    let verify = if dry { Verify::Shape } else { Verify::Contents };
    let sampler = run_sampler(config, corpus, spec, seq_len, verify)?;
    let shard = DistributedSampler {
        rank,
        world,
        chunk: config.batch_per_rank(),
    };
    Loader::new(
        sampler,
        LoaderConfig {
            workers: if dry { 0 } else { config.workers },
            prefetch: config.prefetch,
            host_memory: config.host_memory,
            pin_memory: config.pin_memory && !dry,
            micro_batch: config.micro_batch(),
            shard,
        },
    )
}

/// Tokens the model's embedding holds.
pub fn model_vocab(spec: &ModelSpec) -> usize {
    spec.vocab()
}
