//! A GPT-style decoder (Radford et al. 2019; the nanoGPT layout): token and learned position
//! embeddings, pre-norm blocks of causal multi-head self-attention and a GELU MLP with residual
//! connections, a final layer norm, and an output head tied to the token embedding or separate.
//! Parameters live in one flat block per layer (`embed`, `block.i`, `head`).
//!
//! Attention is naive (scores materialised) or memory-efficient (the fused kernel), chosen per
//! model with [`Gpt::set_attention`]. The MLP's GELU output is never saved: its projection
//! recomputes it in backward (`Tensor::gelu_linear`), so a block keeps `x`, its two norm
//! outputs, q/k/v, the attention output and the MLP's pre-activation.
//!
//! With `lora` set, every base block is frozen and the trainable blocks are the adapters
//! (`lora.i`, see `lora.rs`): [`Model::blocks`] lists those, [`Model::frozen_blocks`] the base.
//!
//! The model is a composition of modules (`crate::modules`): token and position embeddings,
//! decoder blocks, a final layer norm and the output head; a layer's slots and binding are in
//! `block.rs`, the base in the plain layout (merged
//! exports, `--init-from`) in `base.rs`.
//!
//! Split over a tensor-parallel group ([`Gpt::new_parallel`]), each rank's layers hold its
//! share of the heads and of the MLP's hidden features (`block.rs`); the embeddings, the norms
//! and the output head stay whole on every rank, so their gradients come out the same on each.
//!
//! Not for: training.

mod base;
pub(crate) mod block;

pub use block::{SlotSplit, slot_split};

use super::limits::{MAX_BLOCKS, MAX_DIM, check_sizes};
use super::lora::{BlockAdapters, block_adapter_params, build_adapters};
use super::qlora::{self, QUANTIZED};
use crate::init::{block_values, initialise_at};
use crate::model::{Model, NamedValues, Recompute, run_blocks};
use crate::modules::{Embedding, LayerNorm, LmHead, Slot, Weights, slot_pairs};
use block::{LN_EPS, Layer, gpt2_init, layer_slots, layer_slots_of, shard_values};
use headroom_memory::{Category, Device};
pub use headroom_strategy::Attention;
use headroom_strategy::{BaseWeights, Lora};
use headroom_tensor::Nf4Weight;
use headroom_tensor::{
    DType, ParamBlock, ParamSpec, Result, Tensor, TensorError, TensorParallel, param_scope,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Shape of a GPT.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    pub vocab: usize,
    /// Context length: the longest sequence (learned positions).
    pub context: usize,
    pub layers: usize,
    pub width: usize,
    pub heads: usize,
    /// Hidden width of the MLP (4 × width in GPT-2).
    pub ffn: usize,
    pub dropout: f32,
    /// Output head shares the token embedding's weights.
    pub tied: bool,
    /// How attention is computed (`naive` or `memory-efficient`).
    #[serde(default)]
    pub attention: Attention,
    /// Low-rank adapters on a frozen base (LoRA); `None` trains every weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<Lora>,
}

impl GptConfig {
    /// Checks the shape; a bad one names the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(TensorError::invalid("GptConfig", msg));
        if self.vocab == 0
            || self.context == 0
            || self.layers == 0
            || self.width == 0
            || self.heads == 0
            || self.ffn == 0
        {
            return bad(format!("every size must be at least 1, got {self:?}"));
        }
        check_sizes(
            "GptConfig",
            &[
                ("layers", self.layers, MAX_BLOCKS),
                ("width", self.width, MAX_DIM),
                ("heads", self.heads, MAX_DIM),
                ("ffn", self.ffn, MAX_DIM),
                ("vocab", self.vocab, MAX_DIM),
                ("context", self.context, MAX_DIM),
            ],
        )?;
        if !self.width.is_multiple_of(self.heads) {
            return bad(format!(
                "width {} is not a multiple of heads {}",
                self.width, self.heads
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return bad(format!("dropout {} is not in [0, 1)", self.dropout));
        }
        if let Some(lora) = &self.lora {
            block_adapter_params(self, lora)?;
        }
        Ok(())
    }

    /// Parameters training updates: every one, or with LoRA the adapters' r·(in + out) per
    /// targeted projection and layer.
    pub fn trainable_params(&self) -> Result<usize> {
        match &self.lora {
            None => Ok(self.num_params()),
            Some(lora) => Ok(self.layers * block_adapter_params(self, lora)?),
        }
    }

    /// Exact parameter count: embeddings V·C + S·C; per block 2·2C (norms) + C·3C + 3C (qkv) +
    /// C·C + C (projection) + C·F + F + F·C + C (MLP); final norm 2C; untied head C·V.
    pub fn num_params(&self) -> usize {
        let (v, s, c, f) = (self.vocab, self.context, self.width, self.ffn);
        let block = 4 * c + c * 3 * c + 3 * c + c * c + c + c * f + f + f * c + c;
        v * c + s * c + self.layers * block + 2 * c + if self.tied { 0 } else { c * v }
    }
}

/// A GPT on a device.
#[derive(Debug)]
pub struct Gpt {
    name: String,
    config: GptConfig,
    /// The base weights: trainable, or frozen under LoRA.
    blocks: Vec<ParamBlock>,
    /// The LoRA adapter blocks, one per layer (empty without LoRA).
    adapters: Vec<ParamBlock>,
    /// QLoRA's NF4 projections of each layer (empty otherwise).
    quantized: Vec<Vec<Arc<Nf4Weight>>>,
    device: Device,
    attention: Attention,
    /// This rank's tensor-parallel group, when the layers are split over one.
    parallel: Option<TensorParallel>,
}

impl GptConfig {
    /// Checks that the model splits over `tp`: the heads and the MLP's hidden features divide
    /// by its size, the width and the hidden features by its reduction chunks, no dropout (each
    /// rank would draw its own masks) and no adapters.
    pub fn validate_parallel(&self, tp: &TensorParallel) -> Result<()> {
        let (n, chunks) = (tp.world(), tp.chunks());
        let bad = |msg: String| Err(TensorError::invalid("tensor parallelism", msg));
        if !self.heads.is_multiple_of(n) || !self.ffn.is_multiple_of(n) {
            return bad(format!(
                "{} heads and an MLP of {} hidden features must both divide by the tensor-parallel size {n}; use a size that divides both",
                self.heads, self.ffn
            ));
        }
        if !self.width.is_multiple_of(chunks) || !self.ffn.is_multiple_of(chunks) {
            return bad(format!(
                "width {} and MLP width {} must both divide by the {chunks} chunks tensor-parallel sums are cut into; use widths that {chunks} divides",
                self.width, self.ffn
            ));
        }
        if n > 1 && self.dropout > 0.0 {
            return bad(format!(
                "dropout {} with tensor parallelism: each rank would draw its own masks; set dropout to 0",
                self.dropout
            ));
        }
        if self.lora.is_some() {
            return bad(
                "LoRA adapters are not split over ranks; train them without --tensor-parallel"
                    .into(),
            );
        }
        Ok(())
    }
}

impl Gpt {
    /// Allocates the parameters in `dtype` and initialises them from `seed`: normal(0, 0.02)
    /// weights (GPT-2), zero biases, unit norm gains.
    pub fn new(
        name: &str,
        config: GptConfig,
        device: &Device,
        dtype: DType,
        seed: u64,
    ) -> Result<Gpt> {
        Gpt::build(name, config, device, dtype, seed, None)
    }

    /// Rank `tp.rank()` of a GPT split over `tp`: its layers hold the rank's slices of the
    /// unsplit model's weights (drawn from `seed` as [`Gpt::new`] draws them, then sliced),
    /// the rest whole.
    pub fn new_parallel(
        name: &str,
        config: GptConfig,
        device: &Device,
        dtype: DType,
        seed: u64,
        tp: TensorParallel,
    ) -> Result<Gpt> {
        config.validate()?;
        config.validate_parallel(&tp)?;
        Gpt::build(name, config, device, dtype, seed, Some(tp))
    }

    fn build(
        name: &str,
        config: GptConfig,
        device: &Device,
        dtype: DType,
        seed: u64,
        parallel: Option<TensorParallel>,
    ) -> Result<Gpt> {
        config.validate()?;
        let (v, s, c) = (config.vocab, config.context, config.width);
        let frozen = config.lora.is_some();
        let new_block = |name: &str, weights: &[(&str, &[usize])]| match frozen {
            true => ParamBlock::frozen(device, name, weights, dtype),
            false => ParamBlock::new(device, name, weights, dtype),
        };
        let nf4 = config
            .lora
            .as_ref()
            .is_some_and(|l| l.base == BaseWeights::Nf4);
        let mut blocks = Vec::with_capacity(config.layers + 2);
        let mut quantized = Vec::new();
        let embed = [Embedding::slots("wte", v, c), Embedding::slots("wpe", s, c)].concat();
        blocks.push(new_block("embed", &slot_pairs(&embed))?);
        let (rank, world) = parallel
            .as_ref()
            .map_or((0, 1), |tp| (tp.rank(), tp.world()));
        let layer = layer_slots_of(&config, rank, world);
        let weights = slot_pairs(&layer);
        for i in 0..config.layers {
            let name = format!("block.{i}");
            if nf4 {
                let (block, q) =
                    qlora::build(device, &name, 1 + i, &weights, dtype, seed, &gpt2_init)?;
                blocks.push(block);
                quantized.push(q);
            } else {
                blocks.push(new_block(&name, &weights)?);
            }
        }
        let mut head: Vec<Slot> = LayerNorm::slots("ln_f", c);
        if !config.tied {
            head.extend(LmHead::slots("lm_head", c, v));
        }
        blocks.push(new_block("head", &slot_pairs(&head))?);
        let config_attention = config.attention;
        let mut gpt = Gpt {
            name: name.to_string(),
            config,
            blocks,
            adapters: Vec::new(),
            quantized,
            device: device.clone(),
            attention: config_attention,
            parallel,
        };
        if world > 1 {
            gpt.initialise_shards(seed)?;
        }
        for (bi, block) in gpt.blocks.iter().enumerate().filter(|_| world == 1) {
            // QLoRA's layers were filled as they were quantised.
            if gpt.quantized.is_empty() || !block.name().starts_with("block.") {
                initialise_at(block, bi, seed, &gpt2_init)?;
            }
        }
        if let Some(lora) = &gpt.config.lora {
            gpt.adapters = build_adapters(&gpt.config, lora, device, dtype, seed)?;
        }
        Ok(gpt)
    }

    /// Fills a rank's blocks: the layers with its slices of the unsplit layers' initial values,
    /// the rest as [`Gpt::new`] fills them.
    fn initialise_shards(&self, seed: u64) -> Result<()> {
        let Some(tp) = &self.parallel else {
            return Ok(());
        };
        let mut offset = 0;
        let full: Vec<ParamSpec> = layer_slots(&self.config)
            .into_iter()
            .map(|s| {
                let spec = ParamSpec {
                    offset,
                    name: s.name.clone(),
                    shape: s.shape.clone(),
                };
                offset += s.numel();
                spec
            })
            .collect();
        for (bi, block) in self.blocks.iter().enumerate() {
            if !block.name().starts_with("block.") {
                initialise_at(block, bi, seed, &gpt2_init)?;
            } else if block.flat().device().is_backed() {
                let values = block_values(bi, &full, seed, &gpt2_init);
                block.set_values(&shard_values(&self.config, tp.rank(), tp.world(), &values))?;
            }
        }
        Ok(())
    }

    /// This rank's tensor-parallel group, if the model is split over one.
    pub fn parallel(&self) -> Option<&TensorParallel> {
        self.parallel.as_ref()
    }

    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// How the blocks compute attention (naive unless set).
    pub fn attention(&self) -> Attention {
        self.attention
    }

    /// Switches how the blocks compute attention; the weights are unchanged.
    pub fn set_attention(&mut self, kind: Attention) {
        self.attention = kind;
    }

    /// This model with attention computed as `kind`.
    pub fn with_attention(mut self, kind: Attention) -> Gpt {
        self.set_attention(kind);
        self
    }

    /// Layer `i` bound to its weights, its adapters and its NF4 projections.
    fn layer(&self, i: usize, selective: bool) -> Result<Layer> {
        let quantized: Vec<(&'static str, Arc<Nf4Weight>)> = match self.quantized.get(i) {
            Some(q) => QUANTIZED.iter().copied().zip(q.iter().cloned()).collect(),
            None => Vec::new(),
        };
        let adapters = match &self.config.lora {
            Some(lora) => Some(BlockAdapters::of(&self.adapters[i], lora)?),
            None => None,
        };
        Layer::bind(
            // The layer's trainable block: its adapters under LoRA, else its own weights.
            if adapters.is_some() { i } else { 1 + i },
            &Weights::new(&self.blocks[1 + i], &quantized),
            &self.config,
            adapters.as_ref(),
            self.attention,
            selective,
            self.parallel.as_ref(),
        )
    }

    /// Mean cross-entropy of integer ids `(B, T)` against targets `(B, T)`: the blocks, the
    /// final norm, and the output projection with its loss in f32 whatever the compute dtype
    /// (autocast's fp32 policy for losses), whole or in `recompute.loss_chunks` chunks.
    fn forward_loss(
        &self,
        inputs: &Tensor,
        targets: &Tensor,
        recompute: &Recompute,
    ) -> Result<Tensor> {
        if inputs.rank() != 2 {
            return Err(TensorError::invalid(
                "Gpt",
                format!("inputs must be (B, T), got {:?}", inputs.shape()),
            ));
        }
        let t = inputs.shape()[1];
        if t > self.config.context {
            return Err(TensorError::invalid(
                "Gpt",
                format!(
                    "sequence length {t} exceeds the model's context {}; use a shorter --seq-len",
                    self.config.context
                ),
            ));
        }
        let no_nf4 = [];
        let embed = Weights::new(&self.blocks[0], &no_nf4);
        let positions: Vec<i64> = (0..t as i64).collect();
        let pos_ids = Tensor::from_i64(
            &self.device,
            &[t],
            &positions,
            DType::I64,
            Category::Input,
            Some("positions"),
        )?;
        // Frozen base blocks have no scope: nothing of theirs is gathered or reduced.
        let lora = self.config.lora.is_some();
        let x = scoped(lora, &[0], inputs, |inputs| {
            let tok = Embedding::load(&embed, "wte")?.forward(inputs)?; // (B, T, C)
            let pos = Embedding::load(&embed, "wpe")?.forward(&pos_ids)?; // (T, C)
            tok.add(&pos)?.dropout(self.config.dropout)
        })?;
        let layers = (0..self.config.layers)
            .map(|i| self.layer(i, recompute.selective))
            .collect::<Result<Vec<_>>>()?;
        let x = run_blocks(x, layers, &recompute.segments, Layer::forward)?;
        let last = self.config.layers + 1;
        let head = Weights::new(&self.blocks[last], &no_nf4);
        // Tied weights: the output projection reads the embedding block too.
        let scope: &[usize] = if self.config.tied {
            &[last, 0]
        } else {
            &[last]
        };
        scoped(lora, scope, &x, |x| {
            let x = LayerNorm::load(&head, "ln_f", LN_EPS)?.forward(x)?;
            // The head binds inside the scope, where a tied head's table is gathered.
            let lm_head = match self.config.tied {
                true => LmHead::tied(&Embedding::load(&embed, "wte")?)?,
                false => LmHead::load(&head, "lm_head")?,
            };
            lm_head.loss(&x, targets, recompute.loss_chunks)
        })
    }
}

/// `f(x)` inside a parameter scope of `blocks`, or plainly when they are `frozen`.
pub(crate) fn scoped(
    frozen: bool,
    blocks: &[usize],
    x: &Tensor,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    match frozen {
        true => f(x),
        false => param_scope(blocks, x, f),
    }
}

impl Model for Gpt {
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

    fn plain_blocks(&self) -> Vec<(String, usize)> {
        self.plain_layout()
    }

    fn load_plain_block(&mut self, name: &str, values: &[f32]) -> Result<()> {
        self.load_plain(name, values)
    }

    fn quantized(&self) -> Vec<Arc<Nf4Weight>> {
        self.quantized.iter().flatten().cloned().collect()
    }

    fn quantized_mut(&mut self) -> Vec<&mut Arc<Nf4Weight>> {
        self.quantized.iter_mut().flatten().collect()
    }

    fn merged_blocks(&self, adapters: &[Vec<f32>]) -> Result<Option<NamedValues>> {
        match self.config.lora {
            Some(_) => Ok(Some(Gpt::merged_blocks(self, adapters)?)),
            None => Ok(None),
        }
    }

    fn depth(&self) -> usize {
        self.config.layers
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor, recompute: &Recompute) -> Result<Tensor> {
        self.forward_loss(inputs, targets, recompute)
    }
}
