//! GGUF, the single-file model format of ggml and llama.cpp (ggml-org/ggml `docs/gguf.md`),
//! read into what a Hugging Face Llama checkpoint holds: `GgufFile::open` maps the file and
//! checks its structure; `llama_config` / `hf_config_json` give the model's configuration,
//! `hf_tensor` / `hf_loader` each Hugging Face tensor dequantised to f32 in Hugging Face's
//! layout (for `Llama::load_hf`), and `tokenizer_json` the tokenizer as a `tokenizer.json`
//! document.
//!
//! Files: `reader.rs` (the container), `value.rs` (metadata values), `file.rs` (the mapped
//! file), `ggml_type.rs` (tensor types), `blocks.rs` and `kquants.rs` (the block formats),
//! `llama.rs` (names, layout, configuration), `tokenizer.rs`.
//!
//! Not for: writing GGUF, or computing in quantised formats (everything is dequantised).

mod blocks;
mod error;
mod file;
mod ggml_type;
mod kquants;
mod llama;
mod reader;
mod tokenizer;
mod value;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use ggml_type::GgmlType;
pub use llama::{ARCHITECTURES, gguf_name, unpermute_rows};
pub use reader::{DEFAULT_ALIGNMENT, MAGIC, TensorInfo};
pub use tokenizer::PRE_TOKENIZERS;
pub use value::Value;
