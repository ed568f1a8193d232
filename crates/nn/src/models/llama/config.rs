//! A Llama-family model's shape, read from a Hugging Face `config.json`: the keys each
//! family uses (`num_key_value_heads`, `rope_theta`, Qwen2's `use_sliding_window` and
//! `max_window_layers`, Mistral's `sliding_window`, `tie_word_embeddings`), the slots of a layer
//! and the LoRA adapters a configuration admits.
//!
//! Not for: the weights (`hf`) or the forward pass (`mod.rs`).

use super::HF;
use crate::models::limits::{MAX_BLOCKS, MAX_DIM, check_sizes};
use crate::models::lora::AdapterShape;
use crate::modules::{AttentionShape, Linear, RmsNorm, Slot};
use headroom_strategy::{Attention as AttentionKind, Lora, LoraTarget};
use headroom_tensor::{Result, TensorError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `model_type`s headroom builds.
pub const SUPPORTED: [&str; 3] = ["llama", "mistral", "qwen2"];

/// A member of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
}

/// Shape of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaConfig {
    pub family: Family,
    pub vocab: usize,
    /// `max_position_embeddings`: the longest sequence accepted.
    pub context: usize,
    pub layers: usize,
    pub width: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// `intermediate_size`.
    pub ffn: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    pub tied: bool,
    /// Biases on the q, k and v projections (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on the output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on the MLP's projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
    /// The sliding window of the layers from `sliding_from` on, if any.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    #[serde(default)]
    pub sliding_from: usize,
    /// Dropout on the attention probabilities (`attention_dropout`).
    #[serde(default)]
    pub dropout: f32,
    /// The standard deviation of the initial weights (`initializer_range`).
    pub init_std: f32,
    #[serde(default)]
    pub attention: AttentionKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

fn bad(msg: String) -> TensorError {
    TensorError::invalid("config.json", msg)
}

impl LlamaConfig {
    /// The configuration of a Hugging Face `config.json`; an unsupported `model_type`, a
    /// missing field or a variant headroom does not build (scaled rotary frequencies, an
    /// activation other than SiLU, a head dimension other than width / heads) is an error
    /// naming it.
    pub fn from_hf_json(text: &str) -> Result<LlamaConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let supported = SUPPORTED.join(", ");
        let family = match v.get("model_type").and_then(Value::as_str) {
            Some("llama") => Family::Llama,
            Some("mistral") => Family::Mistral,
            Some("qwen2") => Family::Qwen2,
            Some(other) => {
                return Err(bad(format!(
                    "unsupported model_type '{other}'; headroom builds {supported}"
                )));
            }
            None => return Err(bad(format!("no model_type (one of {supported})"))),
        };
        let size = |key: &str| -> Result<usize> {
            v.get(key)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| bad(format!("{key} is missing or not a non-negative integer")))
        };
        let opt_size = |key: &str| v.get(key).and_then(Value::as_u64).map(|n| n as usize);
        let float = |key: &str, default: f64| v.get(key).and_then(Value::as_f64).unwrap_or(default);
        let flag =
            |key: &str, default: bool| v.get(key).and_then(Value::as_bool).unwrap_or(default);
        let (width, heads) = (size("hidden_size")?, size("num_attention_heads")?);
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str)
            && act != "silu"
        {
            return Err(bad(format!(
                "hidden_act '{act}' is not supported; the family's SwiGLU uses silu"
            )));
        }
        if let Some(d) = opt_size("head_dim")
            && heads > 0
            && d * heads != width
        {
            return Err(bad(format!(
                "head_dim {d} × num_attention_heads {heads} is not hidden_size {width}; headroom builds head_dim = hidden_size / num_attention_heads"
            )));
        }
        let rope = v.get("rope_parameters").or_else(|| v.get("rope_scaling"));
        if let Some(kind) = rope
            .and_then(|r| r.get("rope_type").or_else(|| r.get("type")))
            .and_then(Value::as_str)
            && kind != "default"
        {
            return Err(bad(format!(
                "rope_type '{kind}' is not supported; headroom builds the default rotary frequencies"
            )));
        }
        let rope_theta = v
            .get("rope_theta")
            .or_else(|| v.get("rope_parameters").and_then(|r| r.get("rope_theta")))
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0);
        let layers = size("num_hidden_layers")?;
        let attention_bias = flag("attention_bias", false);
        let (sliding_window, sliding_from) = match family {
            Family::Llama => (None, 0),
            Family::Mistral => (opt_size("sliding_window"), 0),
            Family::Qwen2 => qwen2_window(&v, layers)?,
        };
        let default_context = match family {
            Family::Llama => 2048,
            Family::Mistral => 131_072,
            Family::Qwen2 => 32_768,
        };
        Ok(LlamaConfig {
            family,
            vocab: size("vocab_size")?,
            context: opt_size("max_position_embeddings").unwrap_or(default_context),
            layers,
            width,
            heads,
            kv_heads: opt_size("num_key_value_heads").unwrap_or(heads),
            ffn: size("intermediate_size")?,
            rms_eps: float("rms_norm_eps", 1e-6) as f32,
            rope_theta,
            tied: flag("tie_word_embeddings", false),
            qkv_bias: family == Family::Qwen2 || attention_bias,
            o_bias: attention_bias,
            mlp_bias: flag("mlp_bias", false),
            sliding_window,
            sliding_from,
            dropout: float("attention_dropout", 0.0) as f32,
            init_std: float("initializer_range", 0.02) as f32,
            attention: AttentionKind::default(),
            lora: None,
        })
    }

    /// The Hugging Face `config.json` of this configuration (what [`LlamaConfig::from_hf_json`]
    /// reads back to the same configuration, LoRA and the attention kernel aside, which are
    /// not the checkpoint's).
    pub fn to_hf_json(&self) -> String {
        let (model_type, architecture) = match self.family {
            Family::Llama => ("llama", "LlamaForCausalLM"),
            Family::Mistral => ("mistral", "MistralForCausalLM"),
            Family::Qwen2 => ("qwen2", "Qwen2ForCausalLM"),
        };
        let mut v = serde_json::json!({
            "architectures": [architecture],
            "model_type": model_type,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.context,
            "num_hidden_layers": self.layers,
            "hidden_size": self.width,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "intermediate_size": self.ffn,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "tie_word_embeddings": self.tied,
            "attention_dropout": self.dropout,
            "initializer_range": self.init_std,
            "torch_dtype": "float32",
        });
        let o = v.as_object_mut().expect("an object");
        match self.family {
            Family::Llama => {
                o.insert("attention_bias".into(), self.o_bias.into());
                o.insert("mlp_bias".into(), self.mlp_bias.into());
            }
            Family::Mistral => {
                o.insert("sliding_window".into(), self.sliding_window.into());
            }
            Family::Qwen2 => {
                o.insert(
                    "use_sliding_window".into(),
                    self.sliding_window.is_some().into(),
                );
                o.insert("sliding_window".into(), self.sliding_window.into());
                o.insert("max_window_layers".into(), self.sliding_from.into());
            }
        }
        serde_json::to_string_pretty(&v).expect("JSON of plain values")
    }

    /// Checks the shape; a bad one names the field.
    pub fn validate(&self) -> Result<()> {
        let fail = |msg: String| Err(TensorError::invalid("LlamaConfig", msg));
        let sizes = [
            ("vocab", self.vocab),
            ("context", self.context),
            ("layers", self.layers),
            ("width", self.width),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn", self.ffn),
        ];
        if let Some((field, _)) = sizes.iter().find(|(_, n)| *n == 0) {
            return fail(format!("{field} must be at least 1"));
        }
        let mut limits: Vec<(&str, usize, usize)> =
            sizes.iter().map(|&(f, n)| (f, n, MAX_DIM)).collect();
        limits[2].2 = MAX_BLOCKS;
        check_sizes("LlamaConfig", &limits)?;
        self.attention_shape().validate()?;
        if !self.head_dim().is_multiple_of(2) {
            return fail(format!(
                "the head dimension {} must be even (rotary pairs)",
                self.head_dim()
            ));
        }
        if self.sliding_window == Some(0) {
            return fail("sliding_window must be at least 1".to_string());
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return fail(format!("dropout {} is not in [0, 1)", self.dropout));
        }
        if let Some(lora) = &self.lora {
            self.adapter_shapes(lora)?;
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    pub(super) fn attention_shape(&self) -> AttentionShape {
        AttentionShape {
            width: self.width,
            heads: self.heads,
            kv_heads: self.kv_heads,
            bias: self.qkv_bias,
        }
    }

    /// The sliding window of layer `i`, if it has one.
    pub fn window(&self, i: usize) -> Option<usize> {
        self.sliding_window.filter(|_| i >= self.sliding_from)
    }

    /// A layer's slots, named as in the checkpoint under `model.layers.i`.
    pub fn layer_slots(&self) -> Vec<Slot> {
        let (c, f) = (self.width, self.ffn);
        let kv = self.attention_shape().kv_width();
        let lin = |name: &str, i, o, b| Linear::slots_as(HF, name, i, o, b);
        [
            RmsNorm::slots_as(HF, "input_layernorm", c),
            lin("self_attn.q_proj", c, c, self.qkv_bias),
            lin("self_attn.k_proj", c, kv, self.qkv_bias),
            lin("self_attn.v_proj", c, kv, self.qkv_bias),
            lin("self_attn.o_proj", c, c, self.o_bias),
            RmsNorm::slots_as(HF, "post_attention_layernorm", c),
            lin("mlp.gate_proj", c, f, self.mlp_bias),
            lin("mlp.up_proj", c, f, self.mlp_bias),
            lin("mlp.down_proj", f, c, self.mlp_bias),
        ]
        .concat()
    }

    pub(super) fn head_slots(&self) -> Vec<Slot> {
        let mut head = RmsNorm::slots_as(HF, "model.norm", self.width);
        if !self.tied {
            head.push(Slot::new("lm_head.weight", &[self.width, self.vocab]));
        }
        head
    }

    /// Every parameter: embedding, layers, final norm and an untied head.
    pub fn num_params(&self) -> usize {
        let layer: usize = self.layer_slots().iter().map(Slot::numel).sum();
        let head: usize = self.head_slots().iter().map(Slot::numel).sum();
        self.vocab * self.width + self.layers * layer + head
    }

    /// Parameters training updates (the adapters' under LoRA).
    pub fn trainable_params(&self) -> Result<usize> {
        match &self.lora {
            None => Ok(self.num_params()),
            Some(lora) => Ok(self.layers
                * self
                    .adapter_shapes(lora)?
                    .iter()
                    .map(|s| lora.adapter_params(s.input, s.output))
                    .sum::<usize>()),
        }
    }

    /// The adapters of one layer: `qkv` stands for the three separate projections.
    pub fn adapter_shapes(&self, lora: &Lora) -> Result<Vec<AdapterShape>> {
        let (c, f, kv) = (self.width, self.ffn, self.attention_shape().kv_width());
        let mut targets: Vec<LoraTarget> = Vec::new();
        for &t in lora.targets.as_slice() {
            match t {
                LoraTarget::Qkv => targets.extend([LoraTarget::Q, LoraTarget::K, LoraTarget::V]),
                t => targets.push(t),
            }
        }
        targets.sort();
        targets.dedup();
        Ok(targets
            .into_iter()
            .map(|target| {
                let (input, output) = match target {
                    LoraTarget::Q | LoraTarget::O | LoraTarget::Qkv => (c, c),
                    LoraTarget::K | LoraTarget::V => (c, kv),
                    LoraTarget::Gate | LoraTarget::Up => (c, f),
                    LoraTarget::Down => (f, c),
                };
                AdapterShape {
                    target,
                    input,
                    output,
                }
            })
            .collect())
    }
}

/// Qwen2's window and the first layer it applies to: from `layer_types` where given (a run of
/// full-attention layers, then sliding ones), else from `use_sliding_window` and
/// `max_window_layers`.
fn qwen2_window(v: &Value, layers: usize) -> Result<(Option<usize>, usize)> {
    let window = v
        .get("sliding_window")
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .filter(|_| v.get("use_sliding_window").and_then(Value::as_bool) == Some(true));
    let Some(window) = window else {
        return Ok((None, 0));
    };
    let from = match v.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            let sliding: Vec<bool> = types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect();
            let from = sliding.iter().position(|&s| s).unwrap_or(layers);
            if sliding[from..].iter().any(|&s| !s) {
                return Err(bad(format!(
                    "layer_types {types:?}: headroom builds sliding layers only as a final run"
                )));
            }
            from
        }
        None => v
            .get("max_window_layers")
            .and_then(Value::as_u64)
            .map_or(28, |n| n as usize),
    };
    Ok((Some(window), from))
}
