//! The prepared token file: a corpus tokenized once (`headroom data prepare`) into a compact
//! binary that training memory-maps instead of loading. A 64-byte header, then the tokens:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "HDRMTOK\0"
//!      8     4  format version (1), little-endian like every field
//!     12     4  bytes per token: 2 (u16) or 4 (u32)
//!     16     8  vocabulary size (every token is below it)
//!     24     8  token count
//!     32     4  CRC-32 of the token bytes
//!     36     4  CRC-32 of bytes 0..36 (the header itself)
//!     40    24  zero
//!     64     …  the tokens
//! ```
//!
//! Opening checks the header, the length and (unless only the shape is needed, as in a dry
//! run) the checksum with buffered reads, so verifying a file does not make it resident. A
//! damaged or truncated file is an error naming the file, what is wrong and the fix.
//!
//! Not for: tokenizing text (see `prepare`) or choosing windows (see `dataset`, `sampler`).

use crc32fast::Hasher;
use headroom_memory::output::AtomicFile;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const MAGIC: [u8; 8] = *b"HDRMTOK\0";
pub const VERSION: u32 = 1;
pub const HEADER_BYTES: usize = 64;
const FIX: &str = "re-run `headroom data prepare` to write it again";

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the token file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a headroom token file (its first bytes are not \"HDRMTOK\"); {FIX}")]
    NotTokenFile { path: PathBuf },
    #[error(
        "{path} is a token file of format version {found}; this headroom reads version {VERSION}: {FIX}"
    )]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: {what}; the file is damaged: {FIX}")]
    Corrupt { path: PathBuf, what: String },
    #[error(
        "{path} is truncated: its header promises {count} tokens ({expected} bytes in all) but the file has {found} bytes; {FIX}"
    )]
    Truncated {
        path: PathBuf,
        count: u64,
        expected: u64,
        found: u64,
    },
    #[error(
        "{path} is truncated: it has {found} bytes, fewer than the {HEADER_BYTES} of a token file's header; {FIX}"
    )]
    ShortHeader { path: PathBuf, found: u64 },
    #[error(
        "{path}: token {token} at byte offset {offset} is outside the vocabulary of {vocab}; the file is damaged: {FIX}"
    )]
    OutOfVocabulary {
        path: PathBuf,
        token: u32,
        offset: u64,
        vocab: u64,
    },
}

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub token_bytes: u32,
    pub vocab_size: u64,
    pub count: u64,
    pub payload_crc: u32,
}

impl Header {
    /// The narrowest token width for a vocabulary.
    pub fn width_for(vocab_size: u64) -> u32 {
        if vocab_size <= 1 << 16 { 2 } else { 4 }
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.token_bytes.to_le_bytes());
        h[16..24].copy_from_slice(&self.vocab_size.to_le_bytes());
        h[24..32].copy_from_slice(&self.count.to_le_bytes());
        h[32..36].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32fast::hash(&h[0..36]);
        h[36..40].copy_from_slice(&crc.to_le_bytes());
        h
    }

    fn decode(path: &Path, h: &[u8]) -> Result<Header, TokenFileError> {
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        if h[0..8] != MAGIC {
            return Err(TokenFileError::NotTokenFile { path: path.into() });
        }
        let corrupt = |what: String| TokenFileError::Corrupt {
            path: path.into(),
            what,
        };
        if crc32fast::hash(&h[0..36]) != u32_at(36) {
            return Err(corrupt("the header's checksum does not match".into()));
        }
        if u32_at(8) != VERSION {
            return Err(TokenFileError::Version {
                path: path.into(),
                found: u32_at(8),
            });
        }
        let header = Header {
            token_bytes: u32_at(12),
            vocab_size: u64_at(16),
            count: u64_at(24),
            payload_crc: u32_at(32),
        };
        if !matches!(header.token_bytes, 2 | 4) {
            return Err(corrupt(format!(
                "the header gives {} bytes per token (2 or 4 are written)",
                header.token_bytes
            )));
        }
        Ok(header)
    }

    /// Bytes of the whole file.
    pub fn file_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + self.count * self.token_bytes as u64
    }
}

/// Whether `path` starts with the token file's magic (a text file does not).
pub fn is_token_file(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| magic == MAGIC)
}

/// How much of a file to check when opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Header and length (enough for a dry run, which reads no tokens).
    Shape,
    /// Also the checksum and the vocabulary, reading the whole file once.
    Contents,
}

/// An open, memory-mapped token file. The tokens are never copied whole: each read takes the
/// pages it touches (`MADV_RANDOM`: no read-ahead beyond them).
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    header: Header,
    map: memmap2::Mmap,
}

impl TokenFile {
    pub fn open(path: &Path, verify: Verify) -> Result<TokenFile, TokenFileError> {
        let read = |source| TokenFileError::Read {
            path: path.into(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(read)?;
        let len = file.metadata().map_err(read)?.len();
        let mut h = [0u8; HEADER_BYTES];
        let got = read_up_to(&mut file, &mut h).map_err(read)?;
        if got >= 8 && h[0..8] != MAGIC {
            return Err(TokenFileError::NotTokenFile { path: path.into() });
        }
        if got < HEADER_BYTES {
            return Err(TokenFileError::ShortHeader {
                path: path.into(),
                found: len,
            });
        }
        let header = Header::decode(path, &h)?;
        let expected = header
            .count
            .checked_mul(header.token_bytes as u64)
            .and_then(|b| b.checked_add(HEADER_BYTES as u64));
        if expected != Some(len) {
            return Err(match expected {
                Some(expected) if len < expected => TokenFileError::Truncated {
                    path: path.into(),
                    count: header.count,
                    expected,
                    found: len,
                },
                _ => TokenFileError::Corrupt {
                    path: path.into(),
                    what: format!(
                        "the header promises {} tokens but the file has {len} bytes",
                        header.count
                    ),
                },
            });
        }
        if verify == Verify::Contents {
            check_contents(path, &mut file, &header)?;
        }
        // SAFETY: the map is read-only; a file changed under it by another process is outside
        // what this reader guards against (as for any memory-mapped reader).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(read)?;
        // A hint only: if the kernel declines it, reads are still correct.
        let _ = map.advise(memmap2::Advice::Random);
        Ok(TokenFile {
            path: path.into(),
            header,
            map,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn len(&self) -> usize {
        self.header.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }

    /// Unmaps the pages read so far from this process (they stay in the page cache, and a
    /// later read maps them again), so the resident pages of the file stay those read since.
    pub fn release_pages(&self) {
        // SAFETY: the map is read-only and file-backed: dropping its pages loses nothing, and
        // a concurrent read simply faults its page in again.
        let _ = unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        };
    }

    /// Tokens `start..start + out.len()` into `out`, each checked against the vocabulary.
    pub fn read(&self, start: usize, out: &mut [u32]) -> Result<(), TokenFileError> {
        let width = self.header.token_bytes as usize;
        let from = HEADER_BYTES + start * width;
        let bytes = &self.map[from..from + out.len() * width];
        for (i, (o, b)) in out.iter_mut().zip(bytes.chunks_exact(width)).enumerate() {
            *o = decode(b);
            if *o as u64 >= self.header.vocab_size {
                return Err(TokenFileError::OutOfVocabulary {
                    path: self.path.clone(),
                    token: *o,
                    offset: (from + i * width) as u64,
                    vocab: self.header.vocab_size,
                });
            }
        }
        Ok(())
    }
}

/// One little-endian token of 2 or 4 bytes.
fn decode(b: &[u8]) -> u32 {
    match *b {
        [lo, hi] => u16::from_le_bytes([lo, hi]) as u32,
        [a, b, c, d] => u32::from_le_bytes([a, b, c, d]),
        _ => unreachable!("tokens are 2 or 4 bytes (checked when the header is read)"),
    }
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_up_to(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// The payload's checksum and vocabulary, in buffered reads of 1 MiB.
fn check_contents(
    path: &Path,
    file: &mut std::fs::File,
    header: &Header,
) -> Result<(), TokenFileError> {
    let read = |source| TokenFileError::Read {
        path: path.into(),
        source,
    };
    file.seek(SeekFrom::Start(HEADER_BYTES as u64))
        .map_err(read)?;
    let width = header.token_bytes as usize;
    let mut buf = vec![0u8; (1 << 20) / width * width];
    let mut hasher = Hasher::new();
    let mut offset = HEADER_BYTES as u64;
    let mut max: Option<(u32, u64)> = None;
    loop {
        let n = read_up_to(file, &mut buf).map_err(read)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        for (i, b) in buf[..n].chunks_exact(width).enumerate() {
            let t = decode(b);
            if t as u64 >= header.vocab_size && max.is_none() {
                max = Some((t, offset + (i * width) as u64));
            }
        }
        offset += n as u64;
    }
    let crc = hasher.finalize();
    if crc != header.payload_crc {
        return Err(TokenFileError::Corrupt {
            path: path.into(),
            what: format!(
                "the tokens' checksum is {crc:08x} where the header says {:08x}",
                header.payload_crc
            ),
        });
    }
    match max {
        Some((token, offset)) => Err(TokenFileError::OutOfVocabulary {
            path: path.into(),
            token,
            offset,
            vocab: header.vocab_size,
        }),
        None => Ok(()),
    }
}

/// Writes a token file piece by piece: tokens stream to a temporary beside the path, the
/// header (with the count and checksum) is written last, and `finish` puts the file in place
/// whole. Dropped unfinished, nothing appears at the path.
#[derive(Debug)]
pub struct TokenFileWriter {
    out: std::io::BufWriter<AtomicFile>,
    path: PathBuf,
    header: Header,
    hasher: Hasher,
    bytes: Vec<u8>,
}

impl TokenFileWriter {
    pub fn create(path: &Path, vocab_size: u64) -> Result<TokenFileWriter, TokenFileError> {
        let write = |source| TokenFileError::Write {
            path: path.into(),
            source,
        };
        let mut file = AtomicFile::create(path).map_err(write)?;
        file.write_all(&[0u8; HEADER_BYTES]).map_err(write)?;
        Ok(TokenFileWriter {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            path: path.into(),
            header: Header {
                token_bytes: Header::width_for(vocab_size),
                vocab_size,
                count: 0,
                payload_crc: 0,
            },
            hasher: Hasher::new(),
            bytes: Vec::new(),
        })
    }

    /// Appends tokens; each must be below the vocabulary size.
    pub fn push(&mut self, tokens: &[u32]) -> Result<(), TokenFileError> {
        self.bytes.clear();
        for &t in tokens {
            if t as u64 >= self.header.vocab_size {
                return Err(TokenFileError::OutOfVocabulary {
                    path: self.path.clone(),
                    token: t,
                    offset: self.header.file_bytes() + self.bytes.len() as u64,
                    vocab: self.header.vocab_size,
                });
            }
            match self.header.token_bytes {
                2 => self.bytes.extend_from_slice(&(t as u16).to_le_bytes()),
                _ => self.bytes.extend_from_slice(&t.to_le_bytes()),
            }
        }
        self.hasher.update(&self.bytes);
        self.header.count += tokens.len() as u64;
        self.out
            .write_all(&self.bytes)
            .map_err(|source| TokenFileError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Writes the header and puts the file at its path; returns the header.
    pub fn finish(self) -> Result<Header, TokenFileError> {
        let path = self.path;
        let write = |source| TokenFileError::Write {
            path: path.clone(),
            source,
        };
        let header = Header {
            payload_crc: self.hasher.finalize(),
            ..self.header
        };
        let mut file = self.out.into_inner().map_err(|e| write(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(write)?;
        file.write_all(&header.encode()).map_err(write)?;
        file.commit().map_err(write)?;
        Ok(header)
    }
}
