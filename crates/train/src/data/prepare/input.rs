//! The files an input names (itself, or a directory's regular files by name; a stream only when
//! allowed), and the size of their token file where it is known before tokenizing.
//!
//! Not for: tokenizing and writing them (see `prepare`).

use super::PrepareError;
use crate::data::token_file::HEADER_BYTES;
use crate::data::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

/// The files `input` names: itself, or a directory's regular files (not hidden) by name. An
/// input that is neither a directory nor a regular file is refused unless `allow_stream`.
pub fn input_files(input: &Path, allow_stream: bool) -> Result<Vec<PathBuf>, PrepareError> {
    let read = |source| PrepareError::Read {
        path: input.into(),
        source,
    };
    let meta = std::fs::metadata(input).map_err(read)?;
    if meta.is_file() || (allow_stream && !meta.is_dir()) {
        return Ok(vec![input.into()]);
    }
    if !meta.is_dir() {
        return Err(PrepareError::NotRegular {
            path: input.into(),
            kind: kind_of(&meta),
        });
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(input).map_err(read)? {
        let entry = entry.map_err(read)?;
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if !hidden && entry.file_type().map_err(read)?.is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(PrepareError::Empty { path: input.into() });
    }
    Ok(files)
}

/// What kind of file a metadata describes, for a refusal.
fn kind_of(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// The bytes of the token file when they are known before tokenizing: byte-level tokens of
/// regular files (one token per byte).
pub(super) fn exact_file_bytes(
    files: &[PathBuf],
    tokenizer: &Tokenizer,
    width: u64,
) -> Option<u64> {
    if tokenizer.needs_lines() {
        return None;
    }
    let mut bytes = HEADER_BYTES as u64;
    for f in files {
        let meta = std::fs::metadata(f).ok().filter(|m| m.is_file())?;
        bytes += meta.len() * width;
    }
    Some(bytes)
}
