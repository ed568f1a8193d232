//! Preparing a corpus once: a text file, or every file of a directory in name order, tokenized
//! in pieces of about 1 MiB (whole lines for a subword tokenizer) and streamed into a token
//! file, so a corpus of any size is prepared in bounded memory. `headroom data prepare` runs it.
//!
//! Not for: the file's format (see `token_file`) or reading it back (see `source`).

use super::token_file::{Header, TokenFileError, TokenFileWriter};
use super::tokenizer::{Tokenizer, TokenizerError};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bytes of text tokenized at a time.
const PIECE_BYTES: usize = 1 << 20;

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
    #[error(transparent)]
    TokenFile(#[from] TokenFileError),
}

/// What was prepared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prepared {
    pub out: PathBuf,
    pub files: usize,
    pub text_bytes: u64,
    pub tokens: u64,
    pub vocab_size: u64,
    pub token_bytes: u32,
    pub file_bytes: u64,
    pub tokenizer: String,
    pub seconds: f64,
}

/// The files `input` names: itself, or a directory's regular files (not hidden) by name.
pub fn input_files(input: &Path) -> Result<Vec<PathBuf>, PrepareError> {
    let read = |source| PrepareError::Read {
        path: input.into(),
        source,
    };
    if !std::fs::metadata(input).map_err(read)?.is_dir() {
        return Ok(vec![input.into()]);
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

/// Tokenizes `input` (a file or directory) with `tokenizer` into the token file `out`, which
/// appears whole or not at all.
pub fn prepare(input: &Path, out: &Path, tokenizer: &Tokenizer) -> Result<Prepared, PrepareError> {
    let started = Instant::now();
    let files = input_files(input)?;
    let mut writer = TokenFileWriter::create(out, tokenizer.vocab_size())?;
    let mut text_bytes = 0;
    let mut piece = Vec::with_capacity(PIECE_BYTES + 4096);
    for path in &files {
        let read = |source| PrepareError::Read {
            path: path.clone(),
            source,
        };
        let mut reader =
            BufReader::with_capacity(PIECE_BYTES, std::fs::File::open(path).map_err(read)?);
        let mut offset = 0u64;
        loop {
            piece.clear();
            let n = match tokenizer.needs_lines() {
                // Whole lines up to about a piece's worth.
                true => {
                    while piece.len() < PIECE_BYTES
                        && reader.read_until(b'\n', &mut piece).map_err(read)? > 0
                    {
                    }
                    piece.len()
                }
                false => {
                    piece.resize(PIECE_BYTES, 0);
                    let n = read_full(&mut reader, &mut piece).map_err(read)?;
                    piece.truncate(n);
                    n
                }
            };
            if n == 0 {
                break;
            }
            let tokens = tokenizer
                .encode(&piece)
                .map_err(|source| PrepareError::Tokenize {
                    path: path.clone(),
                    offset: offset + utf8_offset(&source),
                    source,
                })?;
            writer.push(&tokens)?;
            offset += n as u64;
        }
        text_bytes += offset;
    }
    let header: Header = writer.finish()?;
    Ok(Prepared {
        out: out.into(),
        files: files.len(),
        text_bytes,
        tokens: header.count,
        vocab_size: header.vocab_size,
        token_bytes: header.token_bytes,
        file_bytes: header.file_bytes(),
        tokenizer: tokenizer.name().into(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Where in the piece a UTF-8 error lies (0 for other errors).
fn utf8_offset(e: &TokenizerError) -> u64 {
    match e {
        TokenizerError::NotUtf8 { offset, .. } => *offset as u64,
        _ => 0,
    }
}

fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match reader.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::token_file::{TokenFile, Verify};

    fn read_all(path: &Path) -> Vec<u32> {
        let f = TokenFile::open(path, Verify::Contents).unwrap();
        let mut out = vec![0; f.len()];
        f.read(0, &mut out).unwrap();
        out
    }

    #[test]
    fn a_directory_is_prepared_file_by_file_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("corpus");
        std::fs::create_dir(&input).unwrap();
        std::fs::write(input.join("b.txt"), "BB").unwrap();
        std::fs::write(input.join("a.txt"), "a").unwrap();
        std::fs::write(input.join(".hidden"), "xx").unwrap();
        let out = dir.path().join("t.bin");
        let p = prepare(&input, &out, &Tokenizer::Bytes).unwrap();
        assert_eq!((p.files, p.tokens, p.text_bytes), (2, 3, 3));
        assert_eq!(read_all(&out), [b'a' as u32, b'B' as u32, b'B' as u32]);
    }

    #[cfg(feature = "hf-tokenizer")]
    #[test]
    fn a_hugging_face_tokenizer_json_prepares_its_ids() {
        let dir = tempfile::tempdir().unwrap();
        // A word-level tokenizer.json: whitespace pre-tokenizer, four words.
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
            "decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"sing":1,
            "heavenly":2,"muse":3},"unk_token":"[UNK]"}}"#;
        let tok_path = dir.path().join("tokenizer.json");
        std::fs::write(&tok_path, json).unwrap();
        let tokenizer = Tokenizer::load(tok_path.to_str().unwrap()).unwrap();
        assert_eq!(tokenizer.vocab_size(), 4);
        let text = dir.path().join("t.txt");
        std::fs::write(&text, "sing heavenly muse\nsing goddess\n").unwrap();
        let out = dir.path().join("t.bin");
        let p = prepare(&text, &out, &tokenizer).unwrap();
        assert_eq!(p.vocab_size, 4);
        // "goddess" is not in the vocabulary: [UNK] = 0.
        assert_eq!(read_all(&out), [1, 2, 3, 1, 0]);
        // Text that is not UTF-8 names the file and the byte.
        std::fs::write(&text, b"sing \xff muse").unwrap();
        let e = prepare(&text, &out, &tokenizer).unwrap_err().to_string();
        assert!(e.contains("t.txt") && e.contains("byte 5"), "{e}");
    }
}
