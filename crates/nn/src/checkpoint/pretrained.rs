//! A pretrained model on disk, whichever format it comes in: a Hugging Face model directory
//! with weights, or a GGUF file. Both give the model's `config.json`, each Hugging Face tensor
//! as f32 in its checkpoint layout, and the tokenizer, so a model loads either through one path.
//!
//! Not for: the formats themselves (`hf_dir`, `gguf`).

use super::gguf::GgufFile;
use super::{CheckpointError, HfCheckpoint, is_hf_dir};
use std::path::{Path, PathBuf};

/// A model's pretrained weights and what comes with them.
#[derive(Debug)]
pub enum Pretrained {
    /// A Hugging Face directory holding weights.
    Dir(HfCheckpoint),
    /// A GGUF file (quantised tensors dequantised on reading).
    Gguf(Box<GgufFile>),
}

/// The tokenizer that comes with a pretrained model.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenizerSource {
    /// A `tokenizer.json` file.
    File(PathBuf),
    /// A `tokenizer.json` document built from a GGUF file's metadata.
    Json(String),
}

impl TokenizerSource {
    /// The document's bytes (read from the file when it is one).
    pub fn bytes(&self) -> Result<Vec<u8>, CheckpointError> {
        match self {
            TokenizerSource::File(p) => std::fs::read(p).map_err(|e| CheckpointError::io(p, e)),
            TokenizerSource::Json(text) => Ok(text.clone().into_bytes()),
        }
    }
}

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

impl Pretrained {
    /// The pretrained model `path` names: a directory with `config.json` and weights, or a
    /// `.gguf` file; `None` for anything else (a preset, a model TOML, a directory with a
    /// `config.json` alone).
    pub fn open(path: &Path) -> Result<Option<Pretrained>, CheckpointError> {
        if is_gguf(path) {
            return Ok(Some(Pretrained::Gguf(Box::new(GgufFile::open(path)?))));
        }
        if !is_hf_dir(path) {
            return Ok(None);
        }
        let dir = HfCheckpoint::open(path)?;
        Ok(dir.has_weights().then_some(Pretrained::Dir(dir)))
    }

    /// The file or directory, for messages.
    pub fn location(&self) -> &Path {
        match self {
            Pretrained::Dir(d) => d.dir(),
            Pretrained::Gguf(f) => f.path(),
        }
    }

    /// Hugging Face tensor `name` as f32 in its checkpoint layout, checked against `shape`.
    pub fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        match self {
            Pretrained::Dir(d) => d.tensor_f32(name, shape),
            Pretrained::Gguf(f) => {
                let (found, values) = f.hf_tensor_named(name)?;
                if found != shape {
                    return Err(CheckpointError::Shape {
                        path: f.path().into(),
                        tensor: name.into(),
                        found,
                        expected: shape.to_vec(),
                    });
                }
                Ok(values)
            }
        }
    }

    /// The model's `config.json`.
    pub fn config_json(&self) -> Result<String, CheckpointError> {
        match self {
            Pretrained::Dir(d) => Ok(d.config_json().to_string()),
            Pretrained::Gguf(f) => Ok(f.hf_config_json()?),
        }
    }

    /// The tokenizer that comes with the model, if any.
    pub fn tokenizer(&self) -> Result<Option<TokenizerSource>, CheckpointError> {
        match self {
            Pretrained::Dir(d) => Ok(d.tokenizer_path().map(TokenizerSource::File)),
            Pretrained::Gguf(f) => Ok(Some(TokenizerSource::Json(f.tokenizer_json()?))),
        }
    }
}
