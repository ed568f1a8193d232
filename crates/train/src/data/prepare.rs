//! Preparing a corpus once: a text file, or every file of a directory in name order, tokenized
//! in pieces of about 1 MiB (whole lines for a subword tokenizer) and streamed into a token
//! file, so a corpus of any size is prepared in bounded memory. `headroom data prepare` runs it.
//!
//! What is written is bounded: an input that is not a regular file (a FIFO, `/dev/zero`) is
//! refused unless allowed, the tokens by `max_tokens` if given, and the file by the free space
//! of the filesystem that holds it (less a reserve, see `space`), checked before the first byte
//! when the size is known and before every piece. A stop flag (set by a signal) is polled
//! between pieces; stopped or failed, the unfinished file is removed and nothing appears.
//!
//! Not for: the file's format (see `token_file`) or reading it back (see `source`).

mod error;
mod input;
mod limits;

pub use error::PrepareError;
use input::exact_file_bytes;
pub use input::input_files;
pub use limits::PrepareLimits;

use super::token_file::{Header, TokenFileWriter};
use super::tokenizer::{Tokenizer, TokenizerError};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bytes of text tokenized at a time.
const PIECE_BYTES: usize = 1 << 20;

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

/// Tokenizes `input` (a file or directory) with `tokenizer` into the token file `out`, which
/// appears whole or not at all, within `limits`.
pub fn prepare(
    input: &Path,
    out: &Path,
    tokenizer: &Tokenizer,
    limits: &PrepareLimits,
) -> Result<Prepared, PrepareError> {
    let started = Instant::now();
    let files = input_files(input, limits.allow_stream)?;
    let width = Header::width_for(tokenizer.vocab_size()) as u64;
    if let Some(bytes) = exact_file_bytes(&files, tokenizer, width) {
        limits.check_space(out, bytes)?;
    }
    let mut writer = TokenFileWriter::create(out, tokenizer.vocab_size())?;
    let mut tokens_written = 0u64;
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
            if limits.stopped() {
                return Err(PrepareError::Stopped { out: out.into() });
            }
            let tokens = tokenizer
                .encode(&piece)
                .map_err(|source| PrepareError::Tokenize {
                    path: path.clone(),
                    offset: offset + utf8_offset(&source),
                    source,
                })?;
            tokens_written += tokens.len() as u64;
            if let Some(max) = limits.max_tokens.filter(|&max| tokens_written > max) {
                return Err(PrepareError::TooManyTokens {
                    path: path.clone(),
                    max,
                });
            }
            // This piece, and the writer's buffer of at most a piece not yet on disk.
            let piece_bytes = tokens.len() as u64 * width;
            limits.check_space(out, 2 * piece_bytes.max(PIECE_BYTES as u64))?;
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
    use crate::data::space::FreeSpace;
    use crate::data::token_file::{TokenFile, Verify};
    use std::sync::atomic::AtomicBool;

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
        let p = prepare(&input, &out, &Tokenizer::Bytes, &PrepareLimits::default()).unwrap();
        assert_eq!((p.files, p.tokens, p.text_bytes), (2, 3, 3));
        assert_eq!(read_all(&out), [b'a' as u32, b'B' as u32, b'B' as u32]);
    }

    /// The names in `dir`, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_fifo_or_a_device_is_refused_at_once_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let out = dir.path().join("t.bin");
        let limits = PrepareLimits::default();
        // Opening the FIFO for reading would block until a writer came: refused before that.
        for (input, kind) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "device"),
        ] {
            let e = prepare(input, &out, &Tokenizer::Bytes, &limits).unwrap_err();
            assert!(matches!(e, PrepareError::NotRegular { .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains(kind) && e.contains("--allow-stream"), "{e}");
        }
        assert_eq!(listing(dir.path()), ["pipe"]);
        // Allowed, /dev/zero is bounded by --max-tokens: the first piece of 1 MiB is over 1,000.
        let allowed = PrepareLimits {
            allow_stream: true,
            max_tokens: Some(1_000),
            ..PrepareLimits::default()
        };
        let e = prepare(Path::new("/dev/zero"), &out, &Tokenizer::Bytes, &allowed).unwrap_err();
        assert!(
            matches!(e, PrepareError::TooManyTokens { max: 1_000, .. }),
            "{e}"
        );
        assert_eq!(listing(dir.path()), ["pipe"]);
    }

    #[test]
    fn max_tokens_admits_exactly_that_many() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, "12345").unwrap();
        let out = dir.path().join("t.bin");
        let limits = |max| PrepareLimits {
            max_tokens: Some(max),
            ..PrepareLimits::default()
        };
        let e = prepare(&text, &out, &Tokenizer::Bytes, &limits(4)).unwrap_err();
        assert!(e.to_string().contains("--max-tokens 4"), "{e}");
        assert!(!out.exists());
        let p = prepare(&text, &out, &Tokenizer::Bytes, &limits(5)).unwrap();
        assert_eq!(p.tokens, 5);
    }

    #[test]
    fn a_stop_leaves_nothing_behind_and_the_old_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, "some text").unwrap();
        let out = dir.path().join("t.bin");
        std::fs::write(&out, "the previous file").unwrap();
        let stop = AtomicBool::new(true);
        let limits = PrepareLimits {
            stop: Some(&stop),
            ..PrepareLimits::default()
        };
        let e = prepare(&text, &out, &Tokenizer::Bytes, &limits).unwrap_err();
        assert!(matches!(e, PrepareError::Stopped { .. }), "{e}");
        assert_eq!(listing(dir.path()), ["t.bin", "t.txt"]);
        assert_eq!(std::fs::read(&out).unwrap(), b"the previous file");
    }

    #[test]
    fn a_known_size_is_checked_against_the_free_space_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t.txt");
        std::fs::write(&text, vec![b'a'; 3 << 20]).unwrap();
        let out = dir.path().join("t.bin");
        let calls = std::cell::Cell::new(0);
        // 10 MiB free of 100 MiB: 5 MiB kept free, 5 MiB usable; the file needs 64 B + 6 MiB.
        let small = |_: &Path| {
            calls.set(calls.get() + 1);
            Ok(FreeSpace {
                available: 10 << 20,
                total: 100 << 20,
            })
        };
        let limits = PrepareLimits {
            free_space: &small,
            ..PrepareLimits::default()
        };
        let e = prepare(&text, &out, &Tokenizer::Bytes, &limits).unwrap_err();
        assert!(matches!(e, PrepareError::NoSpace { .. }), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("6.00 MiB") && e.contains("5.00 MiB to spare"),
            "{e}"
        );
        assert_eq!(calls.get(), 1);
        assert_eq!(listing(dir.path()), ["t.txt"]);
    }

    #[test]
    fn a_stream_is_checked_against_the_free_space_before_every_piece() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("t.bin");
        let calls = std::cell::Cell::new(0);
        // Room for the first piece (1 MiB of bytes, 2 MiB of u16 tokens), then 1 MiB left.
        let shrinking = |_: &Path| {
            calls.set(calls.get() + 1);
            let available = if calls.get() == 1 { 1 << 40 } else { 1 << 20 };
            Ok(FreeSpace {
                available,
                total: 1 << 40,
            })
        };
        let limits = PrepareLimits {
            allow_stream: true,
            free_space: &shrinking,
            ..PrepareLimits::default()
        };
        let e = prepare(Path::new("/dev/zero"), &out, &Tokenizer::Bytes, &limits).unwrap_err();
        assert!(matches!(e, PrepareError::NoSpace { .. }), "{e}");
        assert_eq!(calls.get(), 2);
        assert_eq!(listing(dir.path()), Vec::<String>::new());
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
        let p = prepare(&text, &out, &tokenizer, &PrepareLimits::default()).unwrap();
        assert_eq!(p.vocab_size, 4);
        // "goddess" is not in the vocabulary: [UNK] = 0.
        assert_eq!(read_all(&out), [1, 2, 3, 1, 0]);
        // Text that is not UTF-8 names the file and the byte.
        std::fs::write(&text, b"sing \xff muse").unwrap();
        let e = prepare(&text, &out, &tokenizer, &PrepareLimits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.txt") && e.contains("byte 5"), "{e}");
    }
}
