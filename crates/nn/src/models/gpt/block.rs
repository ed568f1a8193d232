//! One GPT layer as a composition of modules: the slots of its twelve weights (layer norm,
//! fused-qkv attention with biases, layer norm, GELU MLP) and GPT-2's initialisation of them,
//! and the decoder block bound to a layer's weights, with LoRA adapters and QLoRA's NF4
//! projections where the model has them.
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
use headroom_tensor::{Result, Tensor, param_scope};

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
        };
        let mlp = w.pp("mlp");
        let ffn = Mlp {
            fc: Linear::load(&mlp, "fc", true, adapter(LoraTarget::Up))?,
            proj: Linear::load(&mlp, "proj", true, adapter(LoraTarget::Down))?,
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
