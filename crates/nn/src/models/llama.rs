//! The Llama family (Llama, Mistral, Qwen2; Touvron et al. 2023, Jiang et al. 2023, Qwen2
//! technical report 2024) from a Hugging Face `config.json`, as a composition of the module
//! layer: token embedding, pre-norm decoder blocks of `RmsNorm`, causal self-attention with
//! separate q/k/v/o projections, grouped key/value heads and rotary positions (`rope_theta`),
//! `RmsNorm` and `SwiGlu`, a final `RmsNorm` and a tied or separate output head.
//!
//! The families differ only in configuration: Qwen2's q, k and v projections have biases
//! (`attention_bias` gives Llama biases on all four), Mistral attends within a sliding window
//! (every layer; Qwen2's layers from `max_window_layers` on when `use_sliding_window`), and
//! small models tie the head to the embedding.
//!
//! Parameters are named as Hugging Face names them: the blocks are `embed`
//! (`model.embed_tokens.weight`), `model.layers.i` (slots `input_layernorm.weight`,
//! `self_attn.q_proj.weight`, …, `mlp.down_proj.weight`, the full name being
//! `model.layers.i.{slot}`) and `head` (`model.norm.weight`, untied `lm_head.weight`). Linear
//! weights are stored in × out, the transpose of the checkpoint's `nn.Linear` (out × in);
//! [`Llama::hf_tensors`] lists each tensor with its checkpoint shape and whether it is
//! transposed. LoRA targets are PEFT's projections (`q,k,v,o,gate,up,down`; `qkv` means q, k
//! and v).
//!
//! Not for: reading checkpoint files (the caller supplies tensors) or QLoRA's NF4 base (refused
//! with a clear error).

use super::gpt::block::Layer;
use super::gpt::scoped;
use super::limits::{MAX_BLOCKS, MAX_DIM, check_sizes};
use super::lora::{AdapterShape, BlockAdapters, build_adapter_blocks};
use crate::init::{Init, initialise_at};
use crate::model::{Model, Recompute, run_blocks};
use crate::modules::{
    Attention, AttentionShape, DecoderBlock, Embedding, FeedForward, Linear, LmHead, Naming, Norm,
    QkvProjection, RmsNorm, RotaryEmbedding, RotaryTables, Slot, SwiGlu, Weights, join, slot_pairs,
};
use headroom_memory::Device;
use headroom_strategy::{Attention as AttentionKind, BaseWeights, Lora, LoraTarget};
use headroom_tensor::{DType, ParamBlock, Result, Tensor, TensorError};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `model_type`s headroom builds.
pub const SUPPORTED: [&str; 3] = ["llama", "mistral", "qwen2"];

const HF: Naming = Naming::HuggingFace;

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
            if lora.base == BaseWeights::Nf4 {
                return fail(
                    "QLoRA's NF4 base (--lora-base nf4) is built for the GPT only; use --lora-base plain on the Llama family".to_string(),
                );
            }
            self.adapter_shapes(lora)?;
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    fn attention_shape(&self) -> AttentionShape {
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

    fn head_slots(&self) -> Vec<Slot> {
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

/// Hugging Face's initialisation: normal(0, `initializer_range`) weights and embeddings, zero
/// biases, unit norm gains.
fn init_rule(std: f32) -> impl Fn(&str) -> Init {
    move |name: &str| {
        if name.ends_with(".bias") {
            Init::Zeros
        } else if name.ends_with("norm.weight") {
            Init::Ones
        } else {
            Init::Normal(std)
        }
    }
}

/// One tensor of the checkpoint and where the model keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfTensor {
    /// Its name in the checkpoint (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// The block holding it and its slot there.
    pub block: usize,
    pub slot: String,
    /// Its shape in the checkpoint.
    pub shape: Vec<usize>,
    /// Whether the model stores it transposed (linear weights: in × out).
    pub transposed: bool,
}

/// A Llama-family decoder on a device.
#[derive(Debug)]
pub struct Llama {
    name: String,
    config: LlamaConfig,
    /// `embed`, `model.layers.i`, `head`: trainable, or frozen under LoRA.
    blocks: Vec<ParamBlock>,
    /// The LoRA adapter blocks, one per layer (empty without LoRA).
    adapters: Vec<ParamBlock>,
    /// The adapters' targets, in their blocks' order.
    targets: Vec<LoraTarget>,
    device: Device,
}

impl Llama {
    /// Allocates the parameters in `dtype` and initialises them from `seed` as Hugging Face
    /// does (see [`init_rule`]).
    pub fn new(
        name: &str,
        config: LlamaConfig,
        device: &Device,
        dtype: DType,
        seed: u64,
    ) -> Result<Llama> {
        config.validate()?;
        let frozen = config.lora.is_some();
        let new_block = |name: &str, slots: &[Slot]| match frozen {
            true => ParamBlock::frozen(device, name, &slot_pairs(slots), dtype),
            false => ParamBlock::new(device, name, &slot_pairs(slots), dtype),
        };
        let mut blocks = Vec::with_capacity(config.layers + 2);
        let embed = Embedding::slots("model.embed_tokens.weight", config.vocab, config.width);
        blocks.push(new_block("embed", &embed)?);
        let layer = config.layer_slots();
        for i in 0..config.layers {
            blocks.push(new_block(&format!("model.layers.{i}"), &layer)?);
        }
        blocks.push(new_block("head", &config.head_slots())?);
        let rule = init_rule(config.init_std);
        for (bi, block) in blocks.iter().enumerate() {
            initialise_at(block, bi, seed, &rule)?;
        }
        let (adapters, targets) = match &config.lora {
            Some(lora) => {
                let shapes = config.adapter_shapes(lora)?;
                let blocks =
                    build_adapter_blocks(&shapes, config.layers, lora, device, dtype, seed)?;
                (blocks, shapes.iter().map(|s| s.target).collect())
            }
            None => (Vec::new(), Vec::new()),
        };
        Ok(Llama {
            name: name.to_string(),
            config,
            blocks,
            adapters,
            targets,
            device: device.clone(),
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// Switches how the layers compute attention; the weights are unchanged.
    pub fn set_attention(&mut self, kind: AttentionKind) {
        self.config.attention = kind;
    }

    /// The base weights' blocks (trainable, or frozen under LoRA).
    pub fn base_blocks(&self) -> &[ParamBlock] {
        &self.blocks
    }

    /// Every tensor of the checkpoint, in the blocks' order.
    pub fn hf_tensors(&self) -> Vec<HfTensor> {
        self.blocks
            .iter()
            .enumerate()
            .flat_map(|(bi, block)| {
                let prefix = match block.name().starts_with("model.layers.") {
                    true => block.name(),
                    false => "",
                };
                block.specs().iter().map(move |s| {
                    let transposed = s.shape.len() == 2 && s.name != "model.embed_tokens.weight";
                    let mut shape = s.shape.clone();
                    if transposed {
                        shape.reverse();
                    }
                    HfTensor {
                        name: join(prefix, &s.name),
                        block: bi,
                        slot: s.name.clone(),
                        shape,
                        transposed,
                    }
                })
            })
            .collect()
    }

    /// Sets every base weight from `get(tensor)`, which returns the checkpoint's values of
    /// `tensor` (row-major in its checkpoint shape) or an error naming what is wrong with it.
    pub fn load_hf(&self, mut get: impl FnMut(&HfTensor) -> Result<Vec<f32>>) -> Result<()> {
        let tensors = self.hf_tensors();
        for (bi, block) in self.blocks.iter().enumerate() {
            let mut values = vec![0f32; block.numel()];
            for t in tensors.iter().filter(|t| t.block == bi) {
                let spec = block
                    .specs()
                    .iter()
                    .find(|s| s.name == t.slot)
                    .ok_or_else(|| TensorError::invalid("load", format!("no slot {}", t.slot)))?;
                let got = get(t)?;
                let n: usize = t.shape.iter().product();
                if got.len() != n {
                    return Err(TensorError::invalid(
                        "load",
                        format!(
                            "tensor {} has {} values, expected {n} ({:?})",
                            t.name,
                            got.len(),
                            t.shape
                        ),
                    ));
                }
                let out = &mut values[spec.offset..spec.offset + n];
                match t.transposed {
                    true => transpose_into(&got, t.shape[0], t.shape[1], out),
                    false => out.copy_from_slice(&got),
                }
            }
            block.set_values(&values)?;
        }
        Ok(())
    }

    /// Layer `i` bound to its weights and adapters.
    fn layer(&self, i: usize, selective: bool, rotary: &RotaryTables) -> Result<Layer> {
        let c = &self.config;
        let adapters = match &c.lora {
            Some(lora) => Some(BlockAdapters::of_targets(
                &self.adapters[i],
                &self.targets,
                lora,
            )?),
            None => None,
        };
        let adapter = |t: LoraTarget| adapters.as_ref().and_then(|a| a.get(t));
        let no_nf4 = [];
        let w = Weights::new(&self.blocks[1 + i], &no_nf4);
        let lin = |name: &str, bias, t| Linear::load_as(HF, &w, name, bias, adapter(t));
        let attention = Attention {
            shape: c.attention_shape(),
            qkv: QkvProjection::Separate {
                q: lin("self_attn.q_proj", c.qkv_bias, LoraTarget::Q)?,
                k: lin("self_attn.k_proj", c.qkv_bias, LoraTarget::K)?,
                v: lin("self_attn.v_proj", c.qkv_bias, LoraTarget::V)?,
            },
            out: lin("self_attn.o_proj", c.o_bias, LoraTarget::O)?,
            kind: c.attention,
            dropout: c.dropout,
            selective,
            rotary: Some(rotary.clone()),
            window: c.window(i),
        };
        let ffn = SwiGlu {
            gate: lin("mlp.gate_proj", c.mlp_bias, LoraTarget::Gate)?,
            up: lin("mlp.up_proj", c.mlp_bias, LoraTarget::Up)?,
            down: lin("mlp.down_proj", c.mlp_bias, LoraTarget::Down)?,
        };
        let norm = |name| RmsNorm::load_as(HF, &w, name, c.rms_eps).map(Norm::RmsNorm);
        Ok(Layer {
            // The layer's trainable block: its adapters under LoRA, else its own weights.
            index: if adapters.is_some() { i } else { 1 + i },
            block: DecoderBlock {
                norm1: norm("input_layernorm")?,
                attention,
                norm2: norm("post_attention_layernorm")?,
                ffn: FeedForward::SwiGlu(Box::new(ffn)),
                dropout: 0.0,
            },
        })
    }

    fn forward_loss(
        &self,
        inputs: &Tensor,
        targets: &Tensor,
        recompute: &Recompute,
    ) -> Result<Tensor> {
        let c = &self.config;
        if inputs.rank() != 2 {
            return Err(TensorError::invalid(
                "Llama",
                format!("inputs must be (B, T), got {:?}", inputs.shape()),
            ));
        }
        let t = inputs.shape()[1];
        if t > c.context {
            return Err(TensorError::invalid(
                "Llama",
                format!(
                    "sequence length {t} exceeds max_position_embeddings {}; use a shorter --seq-len",
                    c.context
                ),
            ));
        }
        let rotary = RotaryEmbedding {
            head_dim: c.head_dim(),
            base: c.rope_theta,
        }
        .tables(&self.device, t)?;
        let no_nf4 = [];
        let embed = Weights::new(&self.blocks[0], &no_nf4);
        let lora = c.lora.is_some();
        let x = scoped(lora, &[0], inputs, |ids| {
            Embedding::load(&embed, "model.embed_tokens.weight")?.forward(ids)
        })?;
        let layers = (0..c.layers)
            .map(|i| self.layer(i, recompute.selective, &rotary))
            .collect::<Result<Vec<_>>>()?;
        let x = run_blocks(x, layers, &recompute.segments, Layer::forward)?;
        let last = c.layers + 1;
        let head = Weights::new(&self.blocks[last], &no_nf4);
        let scope: &[usize] = if c.tied { &[last, 0] } else { &[last] };
        scoped(lora, scope, &x, |x| {
            let x = RmsNorm::load_as(HF, &head, "model.norm", c.rms_eps)?.forward(x)?;
            // The head binds inside the scope, where a tied head's table is gathered.
            let lm_head = match c.tied {
                true => LmHead::tied(&Embedding::load(&embed, "model.embed_tokens.weight")?)?,
                false => LmHead {
                    w: head.get("lm_head.weight")?,
                },
            };
            lm_head.loss(&x, targets, recompute.loss_chunks)
        })
    }
}

/// `out` (cols × rows) = the transpose of row-major `x` (rows × cols).
fn transpose_into(x: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    for r in 0..rows {
        for (c, &v) in x[r * cols..(r + 1) * cols].iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
}

impl Model for Llama {
    fn name(&self) -> &str {
        &self.name
    }

    fn blocks(&self) -> &[ParamBlock] {
        match self.config.lora {
            Some(_) => &self.adapters,
            None => &self.blocks,
        }
    }

    fn frozen_blocks(&self) -> &[ParamBlock] {
        match self.config.lora {
            Some(_) => &self.blocks,
            None => &[],
        }
    }

    fn depth(&self) -> usize {
        self.config.layers
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor, recompute: &Recompute) -> Result<Tensor> {
        self.forward_loss(inputs, targets, recompute)
    }
}
