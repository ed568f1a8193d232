//! Named model presets, model TOML files and Hugging Face model directories: what `--model`
//! accepts for a run of headroom's engine, with `--layers`, `--width`, `--heads` and
//! `--seq-len` overriding a preset's shape.
//!
//! Not for: building strategies (the planner) or training.

use super::gpt::{Attention, Gpt, GptConfig};
use super::llama::{Llama, LlamaConfig, SUPPORTED};
use super::resmlp::{ResMlp, ResMlpConfig};
use crate::checkpoint::gguf::GgufFile;
use crate::checkpoint::{is_gguf, is_hf_dir};
use crate::model::Model;
use headroom_memory::Device;
use headroom_tensor::{DType, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A model's architecture and shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    Gpt(GptConfig),
    Resmlp(ResMlpConfig),
    /// The Llama family (Llama, Mistral, Qwen2), from a Hugging Face `config.json`.
    Llama(LlamaConfig),
}

/// The longest default sequence of a Llama-family run: its context is thousands of tokens,
/// more than a first run on a CPU wants.
pub const LLAMA_DEFAULT_SEQ_LEN: usize = 256;

/// Preset names, for messages.
pub const PRESETS: [&str; 4] = ["gpt-small", "gpt-tiny", "gpt-medium", "resmlp"];

/// A preset by name: `gpt-small` (the default: 4 layers, width 128, context 128, 0.84 M
/// parameters), `gpt-tiny` (tests), `gpt-medium` (8 layers, width 256), `resmlp` (16 blocks).
pub fn preset(name: &str) -> Option<ModelSpec> {
    let gpt = |layers, width, heads, context| {
        ModelSpec::Gpt(GptConfig {
            vocab: 256,
            context,
            layers,
            width,
            heads,
            ffn: 4 * width,
            dropout: 0.0,
            tied: true,
            attention: Attention::Naive,
            lora: None,
        })
    };
    Some(match name {
        "gpt-small" => gpt(4, 128, 4, 128),
        "gpt-tiny" => gpt(2, 32, 2, 32),
        "gpt-medium" => gpt(8, 256, 8, 256),
        "resmlp" => ModelSpec::Resmlp(ResMlpConfig {
            vocab: 256,
            width: 128,
            hidden: 512,
            depth: 16,
            dropout: 0.0,
        }),
        _ => return None,
    })
}

/// A model that cannot be resolved; names the input and the accepted values.
#[derive(Debug, thiserror::Error)]
pub enum ModelSpecError {
    #[error("unknown model '{0}': not a preset ({presets}) and no such file; give a preset name, a model TOML with kind = \"gpt\", \"resmlp\" or \"llama\", or a Hugging Face model directory ({families}: config.json and model.safetensors)", presets = PRESETS.join(", "), families = SUPPORTED.join(", "))]
    Unknown(String),
    #[error("model file {path}: {message}")]
    File { path: String, message: String },
}

impl ModelSpec {
    /// A preset name, a path to a model TOML, or a Hugging Face model directory.
    pub fn resolve(name: &str) -> std::result::Result<ModelSpec, ModelSpecError> {
        if let Some(spec) = preset(name) {
            return Ok(spec);
        }
        let path = Path::new(name);
        if is_gguf(path) {
            let file = |message: String| ModelSpecError::File {
                path: name.to_string(),
                message,
            };
            let gguf = GgufFile::open(path).map_err(|e| file(e.to_string()))?;
            let llama = gguf.llama_config().map_err(|e| file(e.to_string()))?;
            return Ok(ModelSpec::Llama(llama));
        }
        if is_hf_dir(path) {
            let config = path.join("config.json");
            let file = |message: String| ModelSpecError::File {
                path: config.display().to_string(),
                message,
            };
            let text = std::fs::read_to_string(&config).map_err(|e| file(e.to_string()))?;
            let llama = LlamaConfig::from_hf_json(&text).map_err(|e| file(e.to_string()))?;
            return Ok(ModelSpec::Llama(llama));
        }
        if !path.is_file() {
            return Err(ModelSpecError::Unknown(name.to_string()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| ModelSpecError::File {
            path: name.into(),
            message: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| ModelSpecError::File {
            path: name.into(),
            message: e.to_string(),
        })
    }

    /// Applies shape overrides; `seq_len` raises a GPT's context if needed.
    pub fn with_overrides(
        mut self,
        layers: Option<usize>,
        width: Option<usize>,
        heads: Option<usize>,
        seq_len: Option<usize>,
    ) -> ModelSpec {
        match &mut self {
            ModelSpec::Gpt(c) => {
                if let Some(l) = layers {
                    c.layers = l;
                }
                if let Some(w) = width {
                    c.width = w;
                    c.ffn = 4 * w;
                }
                if let Some(h) = heads {
                    c.heads = h;
                }
                if let Some(s) = seq_len {
                    c.context = c.context.max(s);
                }
            }
            ModelSpec::Resmlp(c) => {
                if let Some(l) = layers {
                    c.depth = l;
                }
                if let Some(w) = width {
                    c.width = w;
                    c.hidden = 4 * w;
                }
            }
            // A checkpoint's shape is its config.json's: these resize a model started afresh
            // (loading weights into a resized model fails naming the first tensor that differs).
            // The context stays max_position_embeddings.
            ModelSpec::Llama(c) => {
                if let Some(l) = layers {
                    c.layers = l;
                }
                if let Some(w) = width {
                    c.width = w;
                }
                if let Some(h) = heads {
                    c.heads = h;
                    c.kv_heads = c.kv_heads.min(h);
                }
            }
        }
        self
    }

    /// Sequence length a run uses by default: the GPT's context, 64 for the MLP, a Llama's
    /// context up to [`LLAMA_DEFAULT_SEQ_LEN`].
    pub fn default_seq_len(&self) -> usize {
        match self {
            ModelSpec::Gpt(c) => c.context,
            ModelSpec::Resmlp(_) => 64,
            ModelSpec::Llama(c) => c.context.min(LLAMA_DEFAULT_SEQ_LEN),
        }
    }

    /// Number of repeated blocks.
    pub fn depth(&self) -> usize {
        match self {
            ModelSpec::Gpt(c) => c.layers,
            ModelSpec::Resmlp(c) => c.depth,
            ModelSpec::Llama(c) => c.layers,
        }
    }

    pub fn num_params(&self) -> usize {
        match self {
            ModelSpec::Gpt(c) => c.num_params(),
            ModelSpec::Resmlp(c) => c.num_params(),
            ModelSpec::Llama(c) => c.num_params(),
        }
    }

    /// Parameters training updates (the adapters' under LoRA).
    pub fn trainable_params(&self) -> Result<usize> {
        match self {
            ModelSpec::Gpt(c) => c.trainable_params(),
            ModelSpec::Resmlp(c) => Ok(c.num_params()),
            ModelSpec::Llama(c) => c.trainable_params(),
        }
    }

    /// The attention's heads and head dimension; `None` for the residual MLP, which has none.
    pub fn attention_heads(&self) -> Option<(usize, usize)> {
        match self {
            ModelSpec::Gpt(c) => Some((c.heads, c.width / c.heads)),
            ModelSpec::Llama(c) => Some((c.heads, c.head_dim())),
            ModelSpec::Resmlp(_) => None,
        }
    }

    /// The block's width and its MLP's hidden width.
    pub fn mlp_widths(&self) -> (usize, usize) {
        match self {
            ModelSpec::Gpt(c) => (c.width, c.ffn),
            ModelSpec::Llama(c) => (c.width, c.ffn),
            ModelSpec::Resmlp(c) => (c.width, c.hidden),
        }
    }

    /// Tokens the embedding holds.
    pub fn vocab(&self) -> usize {
        match self {
            ModelSpec::Gpt(c) => c.vocab,
            ModelSpec::Resmlp(c) => c.vocab,
            ModelSpec::Llama(c) => c.vocab,
        }
    }
}

impl ModelSpec {
    /// Checks the shape; a bad one names the field.
    pub fn validate(&self) -> Result<()> {
        match self {
            ModelSpec::Gpt(c) => c.validate(),
            ModelSpec::Resmlp(c) => c.validate(),
            ModelSpec::Llama(c) => c.validate(),
        }
    }
}

/// Rank `tp.rank()` of `spec` split over `tp` (tensor parallelism: headroom's GPT only).
pub fn build_parallel_model(
    name: &str,
    spec: &ModelSpec,
    device: &Device,
    dtype: DType,
    seed: u64,
    tp: headroom_tensor::TensorParallel,
) -> Result<Box<dyn Model>> {
    match spec {
        ModelSpec::Gpt(c) => Ok(Box::new(Gpt::new_parallel(
            name,
            c.clone(),
            device,
            dtype,
            seed,
            tp,
        )?)),
        _ => Err(headroom_tensor::TensorError::invalid(
            "tensor parallelism",
            format!(
                "{name} is not a GPT: tensor parallelism splits headroom's GPT only; run it without --tensor-parallel"
            ),
        )),
    }
}

/// Builds the model on `device` with parameters in `dtype`.
pub fn build_model(
    name: &str,
    spec: &ModelSpec,
    device: &Device,
    dtype: DType,
    seed: u64,
) -> Result<Box<dyn Model>> {
    Ok(match spec {
        ModelSpec::Gpt(c) => Box::new(Gpt::new(name, c.clone(), device, dtype, seed)?),
        ModelSpec::Resmlp(c) => Box::new(ResMlp::new(name, c.clone(), device, dtype, seed)?),
        ModelSpec::Llama(c) => Box::new(Llama::new(name, c.clone(), device, dtype, seed)?),
    })
}
