//! The byte-level tokenizer: every byte is a token (vocabulary 256), so any file trains and
//! decoding is exact. Small vocabularies keep the embedding and output head small, which suits
//! models sized for a CPU.
//!
//! [`Tokenizer`] is what `headroom data prepare` tokenizes with: byte-level, or any Hugging Face
//! `tokenizer.json` through the `tokenizers` crate (cargo feature `hf-tokenizer`, off by default
//! for its compile cost).
//!
//! Not for: training on subword tokens directly from text (prepare a token file first).

/// A tokenizer that cannot be loaded or cannot encode a text.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "{path}: Hugging Face tokenizers need the `hf-tokenizer` feature, which this build of headroom lacks; rebuild with `cargo build --release --features hf-tokenizer`, or use --tokenizer byte"
    )]
    NotBuiltIn { path: String },
    #[error("cannot load the tokenizer {path}: {message}; give a Hugging Face tokenizer.json")]
    Load { path: String, message: String },
    #[error(
        "the text is not UTF-8 at byte {offset} ({message}); a Hugging Face tokenizer reads UTF-8 text: convert the file, or use --tokenizer byte"
    )]
    NotUtf8 { offset: usize, message: String },
    #[error("the tokenizer failed: {message}")]
    Encode { message: String },
}

/// The tokenizer a corpus is prepared with.
#[derive(Debug)]
pub enum Tokenizer {
    /// Every byte a token (vocabulary 256).
    Bytes,
    /// A Hugging Face `tokenizer.json`.
    #[cfg(feature = "hf-tokenizer")]
    HuggingFace(Box<tokenizers::Tokenizer>),
}

impl Tokenizer {
    /// `byte`, or the path of a Hugging Face `tokenizer.json`.
    pub fn load(spec: &str) -> Result<Tokenizer, TokenizerError> {
        if spec == "byte" {
            return Ok(Tokenizer::Bytes);
        }
        #[cfg(feature = "hf-tokenizer")]
        {
            tokenizers::Tokenizer::from_file(spec)
                .map(|t| Tokenizer::HuggingFace(Box::new(t)))
                .map_err(|e| TokenizerError::Load {
                    path: spec.into(),
                    message: e.to_string(),
                })
        }
        #[cfg(not(feature = "hf-tokenizer"))]
        Err(TokenizerError::NotBuiltIn { path: spec.into() })
    }

    /// A Hugging Face `tokenizer.json` document held in memory (a GGUF file's tokenizer);
    /// `name` names where it came from in messages.
    pub fn from_json(text: &str, name: &str) -> Result<Tokenizer, TokenizerError> {
        #[cfg(feature = "hf-tokenizer")]
        {
            text.parse::<tokenizers::Tokenizer>()
                .map(|t| Tokenizer::HuggingFace(Box::new(t)))
                .map_err(|e| TokenizerError::Load {
                    path: name.into(),
                    message: e.to_string(),
                })
        }
        #[cfg(not(feature = "hf-tokenizer"))]
        {
            let _ = text;
            Err(TokenizerError::NotBuiltIn { path: name.into() })
        }
    }

    pub fn vocab_size(&self) -> u64 {
        match self {
            Tokenizer::Bytes => ByteTokenizer::VOCAB_SIZE as u64,
            #[cfg(feature = "hf-tokenizer")]
            Tokenizer::HuggingFace(t) => t.get_vocab_size(true) as u64,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Bytes => "byte",
            #[cfg(feature = "hf-tokenizer")]
            Tokenizer::HuggingFace(_) => "hugging-face",
        }
    }

    /// Whether it needs whole lines of UTF-8 (a subword tokenizer must not see a word cut).
    pub fn needs_lines(&self) -> bool {
        !matches!(self, Tokenizer::Bytes)
    }

    pub fn encode(&self, text: &[u8]) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Tokenizer::Bytes => Ok(ByteTokenizer.encode(text)),
            #[cfg(feature = "hf-tokenizer")]
            Tokenizer::HuggingFace(t) => {
                let text = std::str::from_utf8(text).map_err(|e| TokenizerError::NotUtf8 {
                    offset: e.valid_up_to(),
                    message: e.to_string(),
                })?;
                t.encode(text, false)
                    .map(|e| e.get_ids().to_vec())
                    .map_err(|e| TokenizerError::Encode {
                        message: e.to_string(),
                    })
            }
        }
    }
}

/// Byte-level tokenizer with a vocabulary of 256.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    pub const VOCAB_SIZE: usize = 256;

    pub fn encode(&self, text: &[u8]) -> Vec<u32> {
        text.iter().map(|&b| b as u32).collect()
    }

    /// Decodes token ids; ids outside the vocabulary become U+FFFD.
    pub fn decode(&self, tokens: &[u32]) -> String {
        let bytes: Vec<u8> = tokens
            .iter()
            .map(|&t| u8::try_from(t).unwrap_or(b'?'))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_any_text() {
        let t = ByteTokenizer;
        let text = "Sing Heav'nly Muse — ünïcödé";
        let ids = t.encode(text.as_bytes());
        assert_eq!(ids.len(), text.len());
        assert_eq!(ids[0], b'S' as u32);
        assert_eq!(t.decode(&ids), text);
    }

    #[test]
    fn byte_is_the_tokenizer_every_build_has() {
        let t = Tokenizer::load("byte").unwrap();
        assert_eq!(t.vocab_size(), 256);
        assert_eq!(t.encode(b"ab").unwrap(), [97, 98]);
        #[cfg(not(feature = "hf-tokenizer"))]
        {
            let e = Tokenizer::load("tokenizer.json").unwrap_err().to_string();
            assert!(e.contains("--features hf-tokenizer"), "{e}");
        }
    }
}
