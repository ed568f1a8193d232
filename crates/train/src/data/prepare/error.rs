//! Why a corpus cannot be prepared (`PrepareError`): each message names the file and the fix.
//!
//! Not for: the limits that refuse a preparation (see `limits`).

use crate::data::token_file::TokenFileError;
use crate::data::tokenizer::TokenizerError;
use std::path::PathBuf;

/// A corpus that cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot read {path}: {source}; give a text file or a directory of text files")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no regular files to prepare; give a text file or a directory of them")]
    Empty { path: PathBuf },
    #[error("{path}, near byte {offset}: {source}")]
    Tokenize {
        path: PathBuf,
        offset: u64,
        source: TokenizerError,
    },
    #[error(
        "{path} is {kind}, not a regular file: its length is unknown and it may never end (/dev/zero never does); give a text file or a directory of them, or allow it with --allow-stream (bounded by --max-tokens and the free space of the output's filesystem)"
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "{path} gives more than --max-tokens {max} tokens; raise --max-tokens, or prepare less text"
    )]
    TooManyTokens { path: PathBuf, max: u64 },
    #[error(
        "{out} would need {needed}, but its filesystem has {usable} to spare ({available} free, of which {reserve} is kept free); free space there, write --out on another filesystem, or bound the input with --max-tokens"
    )]
    NoSpace {
        out: PathBuf,
        needed: String,
        usable: String,
        available: String,
        reserve: String,
    },
    #[error("cannot find the free space of the filesystem holding {path}: {source}")]
    Space {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "stopped before the end: the unfinished token file was removed; nothing was written at {out}"
    )]
    Stopped { out: PathBuf },
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
}
