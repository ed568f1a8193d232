//! A Hugging Face model directory on disk: `config.json`, the weights in `model.safetensors` or
//! in shards listed by `model.safetensors.index.json` (its `weight_map`: tensor name → shard
//! file; transformers' `save_pretrained` format), and the `tokenizer.json` when present. The
//! shards are memory-mapped and read tensor by tensor, so loading holds one tensor's f32 copy
//! at a time beside the model.
//!
//! A directory with `config.json` and no weights is a model to initialise afresh.
//!
//! Not for: the model's shapes (`LlamaConfig::from_hf_json`) or writing (`hf_write`).

use super::CheckpointError;
use super::safetensors_io::SafetensorsFile;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// A model directory: its configuration and, when it has them, its weights.
#[derive(Debug)]
pub struct HfCheckpoint {
    dir: PathBuf,
    config: String,
    /// The weight files, opened.
    shards: Vec<SafetensorsFile>,
    /// Tensor name → index into `shards`.
    location: BTreeMap<String, usize>,
}

/// Whether `path` is a directory holding a `config.json`.
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

impl HfCheckpoint {
    /// Opens `dir`: reads `config.json`, opens every weight file and checks that the shards the
    /// index names are all there.
    pub fn open(dir: &Path) -> Result<HfCheckpoint, CheckpointError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(CheckpointError::NoConfig { dir: dir.into() });
        }
        let config = std::fs::read_to_string(&config_path)
            .map_err(|e| CheckpointError::io(&config_path, e))?;
        let mut shards = Vec::new();
        let mut location = BTreeMap::new();
        if dir.join(INDEX).is_file() {
            for (file, tensors) in read_index(dir)? {
                let path = dir.join(&file);
                if !path.is_file() {
                    return Err(CheckpointError::MissingShard {
                        dir: dir.into(),
                        shard: file,
                        tensor: tensors.first().cloned().unwrap_or_default(),
                    });
                }
                let shard = SafetensorsFile::open(&path)?;
                for t in tensors {
                    if !shard.contains(&t) {
                        return Err(CheckpointError::MissingTensor {
                            dir: path.clone(),
                            tensor: t,
                        });
                    }
                    location.insert(t, shards.len());
                }
                shards.push(shard);
            }
        } else if dir.join(SINGLE).is_file() {
            let shard = SafetensorsFile::open(&dir.join(SINGLE))?;
            for t in shard.names() {
                location.insert(t, 0);
            }
            shards.push(shard);
        } else if dir.join("pytorch_model.bin").is_file() {
            return Err(CheckpointError::PickleOnly { dir: dir.into() });
        }
        Ok(HfCheckpoint {
            dir: dir.into(),
            config,
            shards,
            location,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The text of `config.json`.
    pub fn config_json(&self) -> &str {
        &self.config
    }

    /// Whether the directory holds weights (else the model starts from its initialisation).
    pub fn has_weights(&self) -> bool {
        !self.shards.is_empty()
    }

    /// The tokenizer beside the weights, if any.
    pub fn tokenizer_path(&self) -> Option<PathBuf> {
        Some(self.dir.join("tokenizer.json")).filter(|p| p.is_file())
    }

    /// Whether the checkpoint holds tensor `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.location.contains_key(name)
    }

    /// Tensor `name` as f32 in its checkpoint layout, checked against `shape`.
    pub fn tensor_f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        let shard = self
            .location
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                dir: self.dir.clone(),
                tensor: name.into(),
            })?;
        self.shards[*shard].read_f32(name, shape)
    }

    /// The weight files, for messages.
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(SafetensorsFile::path).collect()
    }
}

/// The index's shards, each with the tensors it holds, in file-name order.
fn read_index(dir: &Path) -> Result<BTreeMap<String, Vec<String>>, CheckpointError> {
    let path = dir.join(INDEX);
    let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
    let corrupt = |message: String| CheckpointError::Corrupt {
        path: path.clone(),
        message,
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| corrupt("no weight_map object".into()))?;
    let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| corrupt(format!("weight_map[{tensor}] is not a file name")))?;
        if file.contains('/') || file.contains("..") {
            return Err(corrupt(format!(
                "weight_map[{tensor}] = {file} points outside the directory"
            )));
        }
        shards.entry(file.into()).or_default().push(tensor.clone());
    }
    Ok(shards)
}
