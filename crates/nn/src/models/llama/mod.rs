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

mod config;
mod hf;

pub use config::{Family, LlamaConfig, SUPPORTED};
pub use hf::HfTensor;

use super::gpt::block::Layer;
use super::gpt::scoped;
use super::lora::{BlockAdapters, build_adapter_blocks};
use crate::init::{Init, initialise_at};
use crate::model::{HuggingFace, Model, NamedValues, Recompute, run_blocks};
use crate::modules::{
    Attention, DecoderBlock, Embedding, FeedForward, Linear, LmHead, Naming, Norm, QkvProjection,
    RmsNorm, RotaryEmbedding, RotaryTables, Slot, SwiGlu, Weights, slot_pairs,
};
use headroom_memory::Device;
use headroom_strategy::{Attention as AttentionKind, LoraTarget};
use headroom_tensor::{DType, ParamBlock, Result, Tensor, TensorError};

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

    fn merged_blocks(&self, adapters: &[Vec<f32>]) -> Result<Option<NamedValues>> {
        match self.config.lora {
            Some(_) => self.merged(adapters).map(Some),
            None => Ok(None),
        }
    }

    fn hugging_face(&self) -> Option<&dyn HuggingFace> {
        Some(self)
    }
}
