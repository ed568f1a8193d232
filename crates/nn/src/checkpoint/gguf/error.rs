//! What can be wrong with a GGUF file, each error naming the file, the key or tensor at fault,
//! and what to do about it.
//!
//! Not for: errors of the model the tensors are loaded into (those are `TensorError`s).

use std::path::PathBuf;

/// Result alias of the GGUF reader.
pub type Result<T> = std::result::Result<T, GgufError>;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: cannot read the file: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path}: not a GGUF file (it starts with {found:?}, a GGUF file with \"GGUF\"); pass the .gguf file itself"
    )]
    BadMagic { path: PathBuf, found: [u8; 4] },
    #[error(
        "{path}: GGUF version {version} is not supported; headroom reads little-endian versions 2 and 3 (convert the model again with a current llama.cpp convert_hf_to_gguf.py)"
    )]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error(
        "{path}: truncated or corrupt: {what} needs bytes {start}..{end} but the file has {len}; the file is incomplete, download it again"
    )]
    Truncated {
        path: PathBuf,
        what: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error(
        "{path}: metadata key '{key}' has value type {type_id}, which GGUF does not define (0 to 12); the file is corrupt or from a newer GGUF version"
    )]
    UnknownValueType {
        path: PathBuf,
        key: String,
        type_id: u32,
    },
    #[error(
        "{path}: tensor '{tensor}' has ggml type {type_id}, which headroom does not know; the file is corrupt or uses a newer ggml type"
    )]
    UnknownTensorType {
        path: PathBuf,
        tensor: String,
        type_id: u32,
    },
    #[error(
        "{path}: tensor '{tensor}' is {type_name}, which headroom cannot dequantise; it reads {supported}; quantise the model again to one of them (llama.cpp llama-quantize)"
    )]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        type_name: &'static str,
        supported: String,
    },
    #[error(
        "{path}: tensor '{tensor}' lies at bytes {start}..{end}, past the end of the file ({len} bytes); the file is truncated or corrupt, download it again"
    )]
    TensorPastEnd {
        path: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("{path}: corrupt {item}: {what}; the file is damaged, download or convert it again")]
    Corrupt {
        path: PathBuf,
        item: String,
        what: String,
    },
    #[error("{path}: no metadata key '{key}'; {hint}")]
    MissingKey {
        path: PathBuf,
        key: String,
        hint: &'static str,
    },
    #[error("{path}: metadata key '{key}' is {found}, expected {expected}")]
    WrongKeyType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{path}: no tensor '{tensor}'; {hint}")]
    MissingTensor {
        path: PathBuf,
        tensor: String,
        hint: String,
    },
    #[error(
        "{path}: tensor '{tensor}' has shape {found:?} (Hugging Face order) but the configuration expects {expected:?}; the metadata and the tensors disagree"
    )]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: {what}")]
    Unsupported { path: PathBuf, what: String },
}
