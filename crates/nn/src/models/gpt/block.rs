//! One GPT layer as a composition of modules: the slots of its twelve weights (layer norm,
//! fused-qkv attention with biases, layer norm, GELU MLP) and GPT-2's initialisation of them,
//! and the decoder block bound to a layer's weights, with LoRA adapters and QLoRA's NF4
//! projections where the model has them.
//!
//! Under tensor parallelism a rank's layer holds its slice of the four projections (see
//! [`Split`]), and the norms and the projections' output biases whole.
//!
//! Not for: the model around the blocks (see `mod.rs`) or the modules' forward (`modules`).

use super::super::lora::BlockAdapters;
use super::GptConfig;
use crate::init::Init;
use crate::modules::{
    Attention, AttentionShape, DecoderBlock, FeedForward, LayerNorm, Linear, Mlp, Norm,
    QkvProjection, Slot, Weights,
};
use headroom_strategy::{Attention as AttentionKind, LoraTarget};
use headroom_tensor::{Result, Tensor, TensorParallel, param_scope};

/// GPT-2's layer norm ε.
pub(super) const LN_EPS: f32 = 1e-5;

/// GPT-2's initialisation: normal(0, 0.02) weights, zero biases, unit norm gains.
pub(super) fn gpt2_init(name: &str) -> Init {
    if name.ends_with(".b") {
        Init::Zeros
    } else if name.starts_with("ln") {
        Init::Ones
    } else {
        Init::Normal(0.02)
    }
}

fn attention_shape(config: &GptConfig) -> AttentionShape {
    AttentionShape {
        width: config.width,
        heads: config.heads,
        kv_heads: config.heads,
        bias: true,
    }
}

/// A layer's slots: `ln1`, `attn.qkv`, `attn.proj`, `ln2`, `mlp.fc`, `mlp.proj` (weights `.w`,
/// biases and gains `.b`/`.w`), back to back in that order.
pub(super) fn layer_slots(config: &GptConfig) -> Vec<Slot> {
    let c = config.width;
    [
        LayerNorm::slots("ln1", c),
        attention_shape(config).fused_slots("attn", "qkv", "proj"),
        LayerNorm::slots("ln2", c),
        Mlp::slots("mlp", c, config.ffn, true),
    ]
    .concat()
}

/// How tensor parallelism splits a layer's slot, whatever the group's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotSplit {
    /// Every rank holds all of it.
    Whole,
    /// By columns: each of its `parts` (q, k and v of the fused projection; one otherwise) is
    /// cut into the ranks' equal slices, rank r's slices side by side.
    Columns { parts: usize },
    /// By rows, rank r's slice of them.
    Rows,
}

/// How a layer's slot `name` (`attn.qkv.w`, …) is split: the fused q/k/v projection and the
/// MLP's first linear by columns (weights and biases), the attention's output projection and
/// the MLP's second linear by rows (their biases whole).
pub fn slot_split(name: &str) -> SlotSplit {
    match name {
        "attn.qkv.w" | "attn.qkv.b" => SlotSplit::Columns { parts: 3 },
        "mlp.fc.w" | "mlp.fc.b" => SlotSplit::Columns { parts: 1 },
        "attn.proj.w" | "mlp.proj.w" => SlotSplit::Rows,
        _ => SlotSplit::Whole,
    }
}

/// Which part of an unsplit layer's slot a rank of a tensor-parallel group holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Split {
    /// All of it (norms, the row-parallel projections' biases).
    Whole,
    /// These column ranges of a (rows × width) weight, side by side (a bias is one row).
    Columns {
        width: usize,
        ranges: Vec<(usize, usize)>,
    },
    /// Rows `start..start + len` of a (rows × width) weight.
    Rows {
        width: usize,
        start: usize,
        len: usize,
    },
}

impl Split {
    /// Slot `name` of an unsplit layer, for rank `rank` of `world`: the fused q/k/v projection
    /// and the MLP's first linear by columns (rank r's heads of each of q, k and v; its slice of
    /// the hidden features), the attention's output projection and the MLP's second linear by
    /// rows (Megatron-LM's split, Shoeybi et al. 2019, arXiv:1909.08053 §3).
    pub(super) fn of(name: &str, config: &GptConfig, rank: usize, world: usize) -> Split {
        let (c, f) = (config.width, config.ffn);
        let (cl, fl) = (c / world, f / world);
        match (slot_split(name), name.starts_with("mlp")) {
            (SlotSplit::Columns { parts }, false) => Split::Columns {
                width: parts * c,
                ranges: (0..parts).map(|p| (p * c + rank * cl, cl)).collect(),
            },
            (SlotSplit::Columns { .. }, true) => Split::Columns {
                width: f,
                ranges: vec![(rank * fl, fl)],
            },
            (SlotSplit::Rows, false) => Split::Rows {
                width: c,
                start: rank * cl,
                len: cl,
            },
            (SlotSplit::Rows, true) => Split::Rows {
                width: c,
                start: rank * fl,
                len: fl,
            },
            (SlotSplit::Whole, _) => Split::Whole,
        }
    }

    /// The rank's part of `values` (the unsplit slot's, row-major).
    pub(super) fn take(&self, values: &[f32]) -> Vec<f32> {
        match self {
            Split::Whole => values.to_vec(),
            Split::Columns { width, ranges } => values
                .chunks_exact(*width)
                .flat_map(|row| ranges.iter().flat_map(move |&(s, l)| &row[s..s + l]))
                .copied()
                .collect(),
            Split::Rows { width, start, len } => {
                values[start * width..(start + len) * width].to_vec()
            }
        }
    }

    /// The shape of the rank's part of a slot of `shape`.
    fn shape(&self, shape: &[usize]) -> Vec<usize> {
        match self {
            Split::Whole => shape.to_vec(),
            Split::Columns { ranges, .. } => {
                let cols = ranges.iter().map(|r| r.1).sum();
                let mut s = shape.to_vec();
                *s.last_mut().expect("a slot has a shape") = cols;
                s
            }
            Split::Rows { len, .. } => {
                let mut s = shape.to_vec();
                s[0] = *len;
                s
            }
        }
    }
}

/// A layer's slots as rank `rank` of `world` holds them (the unsplit ones for a world of 1).
pub(super) fn layer_slots_of(config: &GptConfig, rank: usize, world: usize) -> Vec<Slot> {
    layer_slots(config)
        .into_iter()
        .map(|s| {
            let shape = Split::of(&s.name, config, rank, world).shape(&s.shape);
            Slot::new(s.name, &shape)
        })
        .collect()
}

/// Rank `rank` of `world`'s part of a layer's unsplit `values` (its slots back to back).
pub(super) fn shard_values(
    config: &GptConfig,
    rank: usize,
    world: usize,
    values: &[f32],
) -> Vec<f32> {
    let mut offset = 0;
    let mut out = Vec::new();
    for s in layer_slots(config) {
        let n = s.numel();
        out.extend(Split::of(&s.name, config, rank, world).take(&values[offset..offset + n]));
        offset += n;
    }
    out
}

/// A decoder block in the parameter scope of its trainable block (gathered there under
/// ZeRO-3), cheap to clone into a checkpoint scope.
#[derive(Clone)]
pub(crate) struct Layer {
    /// The trainable block's index in the model's block list.
    pub(crate) index: usize,
    pub(crate) block: DecoderBlock,
}

impl Layer {
    /// Binds layer `w`'s modules, with `adapters` on the projections they target.
    pub(super) fn bind(
        index: usize,
        w: &Weights,
        config: &GptConfig,
        adapters: Option<&BlockAdapters>,
        kind: AttentionKind,
        selective: bool,
        parallel: Option<&TensorParallel>,
    ) -> Result<Layer> {
        let adapter = |t: LoraTarget| adapters.and_then(|a| a.get(t));
        let attn = w.pp("attn");
        let attention = Attention {
            shape: attention_shape(config),
            qkv: QkvProjection::Fused {
                qkv: Linear::load(&attn, "qkv", true, adapter(LoraTarget::Qkv))?,
                parts: [
                    adapter(LoraTarget::Q),
                    adapter(LoraTarget::K),
                    adapter(LoraTarget::V),
                ],
            },
            out: Linear::load(&attn, "proj", true, adapter(LoraTarget::O))?,
            kind,
            dropout: config.dropout,
            selective,
            rotary: None,
            window: None,
            parallel: parallel.cloned(),
        };
        let mlp = w.pp("mlp");
        let ffn = Mlp {
            fc: Linear::load(&mlp, "fc", true, adapter(LoraTarget::Up))?,
            proj: Linear::load(&mlp, "proj", true, adapter(LoraTarget::Down))?,
            parallel: parallel.cloned(),
        };
        Ok(Layer {
            index,
            block: DecoderBlock {
                norm1: Norm::LayerNorm(LayerNorm::load(w, "ln1", LN_EPS)?),
                attention,
                norm2: Norm::LayerNorm(LayerNorm::load(w, "ln2", LN_EPS)?),
                ffn: FeedForward::Mlp(Box::new(ffn)),
                dropout: config.dropout,
            },
        })
    }

    /// The block inside its parameter scope.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        param_scope(&[self.index], x, |x| self.block.forward(x))
    }
}
