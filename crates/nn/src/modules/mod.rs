//! The module layer (as candle-nn and burn structure it): layers that know their parameter
//! slots (names and shapes inside a model's flat parameter block) and run their forward on the
//! tape. A model is a composition of them: it lays out each flat block from its modules' slots,
//! binds the modules to views of the block through [`Weights`], and calls their `forward`.
//!
//! - [`Linear`]: `x·W (+ b)`, over a plain weight or a frozen NF4 one, with an optional LoRA
//!   adapter ([`LoraAdapter`]);
//! - [`Embedding`], [`LayerNorm`], [`RmsNorm`], [`RotaryEmbedding`];
//! - [`Attention`]: causal self-attention over the naive and memory-efficient kernels, with a
//!   fused or separate q/k/v projection, grouped key/value heads and rotary positions;
//! - [`Mlp`] (GELU) and [`SwiGlu`] (SiLU-gated);
//! - [`DecoderBlock`]: norm + attention + norm + feed-forward with residual connections;
//! - [`LmHead`]: the output projection and its cross-entropy, whole or in chunks.
//!
//! Slots are named `w`/`b` ([`Naming::Short`]) or as Hugging Face checkpoints name them
//! ([`Naming::HuggingFace`]: `weight`/`bias`).
//!
//! Not for: which slots a model has or how they start (each model says so), parameter storage
//! (`headroom_tensor::ParamBlock`) or the kernels (the tensor crate).

mod attention;
mod decoder_block;
mod embedding;
mod layer_norm;
mod linear;
mod lm_head;
mod lora_adapter;
mod mlp;
mod rms_norm;
mod rotary;
mod swiglu;

pub use attention::{Attention, AttentionShape, QkvProjection};
pub use decoder_block::{DecoderBlock, FeedForward, Norm};
pub use embedding::Embedding;
pub use layer_norm::LayerNorm;
pub use linear::{Linear, LinearWeight};
pub use lm_head::LmHead;
pub use lora_adapter::LoraAdapter;
pub use mlp::Mlp;
pub use rms_norm::RmsNorm;
pub use rotary::{RotaryEmbedding, RotaryTables};
pub use swiglu::SwiGlu;

use headroom_tensor::{Nf4Weight, ParamBlock, Result, Tensor, TensorError};
use std::sync::Arc;

/// One parameter of a module: its full name inside the flat block and its shape. A block's
/// layout is its modules' slots back to back, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub name: String,
    pub shape: Vec<usize>,
}

impl Slot {
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Slot {
        Slot {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// Elements of the parameter.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// How a module names its weight and bias slots: headroom's short `w` and `b` (the GPT's), or
/// Hugging Face's `weight` and `bias` (the Llama family's, so that slot names are the
/// checkpoint's tensor names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Naming {
    #[default]
    Short,
    HuggingFace,
}

impl Naming {
    pub fn weight(self) -> &'static str {
        match self {
            Naming::Short => "w",
            Naming::HuggingFace => "weight",
        }
    }

    pub fn bias(self) -> &'static str {
        match self {
            Naming::Short => "b",
            Naming::HuggingFace => "bias",
        }
    }
}

/// `prefix.name`, or `name` under an empty prefix.
pub fn join(prefix: &str, name: &str) -> String {
    match prefix {
        "" => name.to_string(),
        p => format!("{p}.{name}"),
    }
}

/// Slots as the `(name, shape)` pairs `ParamBlock::new` takes.
pub fn slot_pairs(slots: &[Slot]) -> Vec<(&str, &[usize])> {
    slots
        .iter()
        .map(|s| (s.name.as_str(), s.shape.as_slice()))
        .collect()
}

/// Where modules find their weights (candle-nn's `VarBuilder`): views of one flat parameter
/// block by name, and the frozen NF4 weights stored beside it, under a name prefix.
#[derive(Clone, Debug)]
pub struct Weights<'a> {
    block: &'a ParamBlock,
    quantized: &'a [(&'static str, Arc<Nf4Weight>)],
    prefix: String,
}

impl<'a> Weights<'a> {
    /// The weights of `block`, with `quantized` the NF4 weights by full name (QLoRA's).
    pub fn new(block: &'a ParamBlock, quantized: &'a [(&'static str, Arc<Nf4Weight>)]) -> Self {
        Weights {
            block,
            quantized,
            prefix: String::new(),
        }
    }

    /// The same weights under `prefix.name` (candle-nn's `pp`).
    pub fn pp(&self, name: &str) -> Weights<'a> {
        Weights {
            prefix: join(&self.prefix, name),
            ..self.clone()
        }
    }

    /// The full name of `name` under this prefix.
    pub fn path(&self, name: &str) -> String {
        join(&self.prefix, name)
    }

    /// The tracked view of parameter `name`; a missing one names the block.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let full = self.path(name);
        self.block.param(&full).cloned().map_err(|_| {
            TensorError::invalid(
                "module",
                format!("block {} has no parameter {full}", self.block.name()),
            )
        })
    }

    /// Parameter `name` when it is stored in NF4.
    pub fn nf4(&self, name: &str) -> Option<Arc<Nf4Weight>> {
        let full = self.path(name);
        self.quantized
            .iter()
            .find(|(n, _)| *n == full)
            .map(|(_, w)| w.clone())
    }
}
