//! What can be wrong with a checkpoint on disk, each error naming the file, the tensor and the
//! fix.
//!
//! Not for: a model configuration that headroom does not build (the model's own errors).

use std::path::PathBuf;

/// A checkpoint that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error(
        "{dir} holds no config.json; a Hugging Face model directory holds config.json and model.safetensors (or shards listed in model.safetensors.index.json)"
    )]
    NoConfig { dir: PathBuf },
    #[error(
        "{dir} holds pytorch_model.bin but no safetensors; headroom reads safetensors only: convert with `model.save_pretrained(dir, safe_serialization=True)` in transformers"
    )]
    PickleOnly { dir: PathBuf },
    #[error("{path}: not a safetensors file ({message}); is the download complete?")]
    Corrupt { path: PathBuf, message: String },
    #[error(
        "shard {shard} is missing from {dir} (model.safetensors.index.json lists it for {tensor}); download every shard the index names"
    )]
    MissingShard {
        dir: PathBuf,
        shard: String,
        tensor: String,
    },
    #[error(
        "{dir} has no tensor {tensor} that the model needs (config.json describes a model with it); is this the checkpoint config.json belongs to?"
    )]
    MissingTensor { dir: PathBuf, tensor: String },
    #[error(
        "{path}: tensor {tensor} has shape {found:?} but config.json implies {expected:?}; the weights do not belong to this config.json"
    )]
    Shape {
        path: PathBuf,
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error(transparent)]
    Gguf(#[from] super::gguf::GgufError),
    #[error("loading {dir}: {message}")]
    Load { dir: PathBuf, message: String },
    #[error(
        "{path}: tensor {tensor} is stored as {dtype}; headroom reads F32, F16, BF16 and F64 weights"
    )]
    Dtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
}

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>, e: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Io {
            path: path.into(),
            message: e.to_string(),
        }
    }
}

impl From<CheckpointError> for headroom_tensor::TensorError {
    fn from(e: CheckpointError) -> Self {
        headroom_tensor::TensorError::invalid("checkpoint", e.to_string())
    }
}
