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
//! QLoRA (`--lora-base nf4`) stores each layer's seven projections as frozen NF4 weights, as
//! bitsandbytes' `Linear4bit` replaces every `nn.Linear` of the layers under PEFT's QLoRA
//! recipe; norms, embeddings and the head stay in the parameter dtype.
//!
//! Not for: reading checkpoint files (`crate::checkpoint`; the caller supplies tensors).

mod config;
mod hf;

pub use config::{Family, LlamaConfig, SUPPORTED};
pub use hf::HfTensor;

use super::gpt::block::Layer;
use super::gpt::scoped;
use super::lora::{BlockAdapters, build_adapter_blocks};
use super::qlora;
use crate::init::{Init, initialise_at};
use crate::model::{HuggingFace, Model, NamedValues, Recompute, run_blocks};
use crate::modules::{
    Attention, DecoderBlock, Embedding, FeedForward, Linear, LmHead, Naming, Norm, QkvProjection,
    RmsNorm, RotaryEmbedding, RotaryTables, Slot, SwiGlu, Weights, slot_pairs,
};
use headroom_memory::Device;
use headroom_strategy::{Attention as AttentionKind, BaseWeights, LoraTarget};
use headroom_tensor::{DType, Nf4Weight, ParamBlock, ParamSpec, Result, Tensor, TensorError};
use std::sync::Arc;

/// The weights of a layer that QLoRA stores in NF4, in this order.
pub const QUANTIZED: [&str; 7] = [
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

const HF: Naming = Naming::HuggingFace;

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
    /// QLoRA: each layer's projections in NF4, in [`QUANTIZED`] order (empty otherwise).
    quantized: Vec<Vec<Arc<Nf4Weight>>>,
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
        let nf4 = config
            .lora
            .as_ref()
            .is_some_and(|l| l.base == BaseWeights::Nf4);
        let rule = init_rule(config.init_std);
        let mut quantized = Vec::new();
        for i in 0..config.layers {
            let name = format!("model.layers.{i}");
            if nf4 {
                // Filled as they are quantised, with the plain model's values for the seed.
                let weights = slot_pairs(&layer);
                let (block, q) = qlora::build_with(
                    &QUANTIZED,
                    device,
                    &name,
                    1 + i,
                    &weights,
                    dtype,
                    seed,
                    &rule,
                )?;
                blocks.push(block);
                quantized.push(q);
            } else {
                blocks.push(new_block(&name, &layer)?);
            }
        }
        blocks.push(new_block("head", &config.head_slots())?);
        for (bi, block) in blocks.iter().enumerate() {
            let layer = bi.checked_sub(1).filter(|&l| l < config.layers);
            if layer.is_none_or(|l| quantized.get(l).is_none()) {
                initialise_at(block, bi, seed, &rule)?;
            }
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
            quantized,
            device: device.clone(),
        })
    }

    /// The layer of block `bi` whose projections are in NF4, if it is one.
    fn quantized_layer(&self, bi: usize) -> Option<&[Arc<Nf4Weight>]> {
        let layer = bi.checked_sub(1).filter(|&l| l < self.config.layers)?;
        self.quantized.get(layer).map(Vec::as_slice)
    }

    /// Block `bi`'s weights in the plain model's layout: its own, or a QLoRA layer's full
    /// layout with the NF4 projections in place.
    fn plain_specs(&self, bi: usize) -> Vec<ParamSpec> {
        match self.quantized_layer(bi) {
            Some(_) => qlora::layout(&slot_pairs(&self.config.layer_slots())),
            None => self.blocks[bi].specs().to_vec(),
        }
    }

    /// Block `bi`'s values in the plain layout (NF4 projections dequantised).
    fn plain_values(&self, bi: usize) -> Result<Vec<f32>> {
        match self.quantized_layer(bi) {
            Some(q) => qlora::full_values_with(
                &QUANTIZED,
                &self.blocks[bi],
                q,
                &slot_pairs(&self.config.layer_slots()),
            ),
            None => self.blocks[bi].flat().to_vec_f32(),
        }
    }

    /// Sets block `bi` from its plain layout's values: a QLoRA layer's projections
    /// re-quantised into their NF4 weights, the rest into the frozen block.
    fn set_plain_values(&mut self, bi: usize, values: &[f32]) -> Result<()> {
        let specs = self.plain_specs(bi);
        let Some(layer) = bi
            .checked_sub(1)
            .filter(|_| self.quantized_layer(bi).is_some())
        else {
            return self.blocks[bi].set_values(values);
        };
        let mut kept = Vec::new();
        for spec in &specs {
            let n: usize = spec.shape.iter().product();
            let part = &values[spec.offset..spec.offset + n];
            match QUANTIZED.iter().position(|q| *q == spec.name) {
                Some(i) => {
                    let bytes = headroom_tensor::nf4::quantize_nf4(part);
                    Nf4Weight::set_bytes(&mut self.quantized[layer][i], &bytes)?;
                }
                None => kept.extend_from_slice(part),
            }
        }
        self.blocks[bi].set_values(&kept)
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
        let nf4: Vec<(&'static str, Arc<Nf4Weight>)> = match self.quantized.get(i) {
            Some(q) => QUANTIZED.iter().copied().zip(q.iter().cloned()).collect(),
            None => Vec::new(),
        };
        let w = Weights::new(&self.blocks[1 + i], &nf4);
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
            parallel: None,
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

    fn quantized(&self) -> Vec<Arc<Nf4Weight>> {
        self.quantized.iter().flatten().cloned().collect()
    }

    fn quantized_mut(&mut self) -> Vec<&mut Arc<Nf4Weight>> {
        self.quantized.iter_mut().flatten().collect()
    }

    fn plain_blocks(&self) -> Vec<(String, usize)> {
        (0..self.blocks.len())
            .map(|bi| {
                let n = self
                    .plain_specs(bi)
                    .iter()
                    .map(|s| s.shape.iter().product::<usize>())
                    .sum();
                (self.blocks[bi].name().to_string(), n)
            })
            .collect()
    }

    fn load_plain_block(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let bi = self
            .blocks
            .iter()
            .position(|b| b.name() == name)
            .ok_or_else(|| TensorError::invalid("load", format!("no block {name}")))?;
        self.set_plain_values(bi, values)
    }

    fn merged_blocks(&self, adapters: &[Vec<f32>]) -> Result<Option<NamedValues>> {
        match self.config.lora {
            Some(_) => self.merged(adapters).map(Some),
            None => Ok(None),
        }
    }

    fn hugging_face(&self) -> Option<&dyn HuggingFace> {
        Some(self)
    }

    fn hugging_face_mut(&mut self) -> Option<&mut dyn HuggingFace> {
        Some(self)
    }
}
