//! Training data: the bundled corpus (or a user's text file, or a token file prepared once
//! with `headroom data prepare` and memory-mapped), the tokenizers, the datasets of windows
//! (map-style and iterable), the samplers (sequential, shuffled, distributed), and the loader
//! whose worker threads collate batches into staging buffers ahead of the trainer.

pub mod corpus;
pub mod dataset;
pub mod error;
pub mod loader;
pub mod order;
pub mod prepare;
pub mod sampler;
pub mod source;
pub mod space;
pub mod staging;
pub mod token_file;
pub mod tokenizer;
mod worker;

pub use corpus::{Corpus, CorpusError};
pub use dataset::{IterableDataset, MapDataset, Tokens, Windows};
pub use error::DataError;
pub use loader::{Loader, LoaderConfig, LoaderReport, StagedBatch};
pub use order::{DistributedSampler, SamplerKind};
pub use sampler::{DataPosition, Split, TokenBatch, TokenSampler};
pub use token_file::{TokenFile, TokenFileError};
pub use tokenizer::ByteTokenizer;
