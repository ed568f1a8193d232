//! Training data: the bundled corpus (or a user's text file), the byte-level tokenizer, and the
//! deterministic batch sampler with its train/validation split.

pub mod corpus;
pub mod sampler;
pub mod tokenizer;

pub use corpus::{Corpus, CorpusError};
pub use sampler::{DataPosition, Split, TokenBatch, TokenSampler};
pub use tokenizer::ByteTokenizer;
