//! The text a run trains on: Milton's *Paradise Lost* bundled in the binary (public domain; see
//! `data/SOURCE.md`), or any UTF-8 or byte text file a user names (a prepared token file is
//! only named here: see `source`).
//!
//! Not for: tokenizing or batching (see `tokenizer`, `sampler`).

use std::borrow::Cow;
use std::path::{Path, PathBuf};

static PARADISE_LOST: &str = include_str!("../../data/paradise_lost.txt");

/// A corpus that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error(
        "cannot read the corpus file {path}: {source}; pass an existing text file with --data, or omit --data to use the bundled corpus"
    )]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the corpus {name} has {bytes} bytes, too few for sequences of {needed} tokens with a validation split; use a larger file or a shorter --seq-len"
    )]
    TooSmall {
        name: String,
        bytes: usize,
        needed: usize,
    },
    #[error(
        "the token file {name} has {tokens} tokens, too few for sequences of {needed} tokens with a validation split; prepare a larger corpus or use a shorter --seq-len"
    )]
    TooFewTokens {
        name: String,
        tokens: usize,
        needed: usize,
    },
}

/// Raw training text.
#[derive(Debug, Clone)]
pub struct Corpus {
    pub name: String,
    pub bytes: Cow<'static, [u8]>,
}

impl Corpus {
    /// The bundled corpus: *Paradise Lost*, 454,481 bytes of ASCII.
    pub fn bundled() -> Corpus {
        Corpus {
            name: "paradise_lost (bundled)".into(),
            bytes: Cow::Borrowed(PARADISE_LOST.as_bytes()),
        }
    }

    /// A user's file, read whole.
    pub fn from_file(path: &Path) -> Result<Corpus, CorpusError> {
        let bytes = std::fs::read(path).map_err(|source| CorpusError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Corpus {
            name: path.display().to_string(),
            bytes: Cow::Owned(bytes),
        })
    }

    /// A token file prepared by `headroom data prepare`, named only: the run's `data` key
    /// names it, and the loader memory-maps its tokens (`data::source`), so no byte of it is
    /// read here and `bytes` is empty.
    pub fn prepared(path: &Path) -> Corpus {
        Corpus {
            name: format!("{} (prepared tokens)", path.display()),
            bytes: Cow::Borrowed(&[]),
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_corpus_is_the_whole_poem() {
        let c = Corpus::bundled();
        assert_eq!(c.len(), 454_481);
        let text = std::str::from_utf8(&c.bytes).unwrap();
        assert!(text.contains("Of Mans First Disobedience"));
        assert!(text.trim_end().ends_with("THE END."));
    }

    #[test]
    fn missing_file_names_the_path_and_the_fix() {
        let e = Corpus::from_file(Path::new("/no/such/corpus.txt"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/no/such/corpus.txt") && e.contains("--data"),
            "{e}"
        );
    }
}
