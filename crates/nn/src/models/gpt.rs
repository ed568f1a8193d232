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
//! Not for: training.

use super::limits::{MAX_BLOCKS, MAX_DIM, check_sizes};
use super::lora::{BlockAdapters, block_adapter_params, build_adapters, merge_block};
use super::qlora::{self, QUANTIZED};
use crate::init::{Init, initialise_at};
use crate::model::{Model, NamedValues, Recompute, run_blocks};
use headroom_memory::{Category, Device};
pub use headroom_strategy::Attention;
use headroom_strategy::{BaseWeights, Lora, LoraTarget};
use headroom_tensor::Nf4Weight;
use headroom_tensor::{DType, ParamBlock, Result, Tensor, TensorError, checkpoint, param_scope};
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

/// GPT-2's initialisation: normal(0, 0.02) weights, zero biases, unit norm gains.
fn gpt2_init(name: &str) -> Init {
    if name.ends_with(".b") {
        Init::Zeros
    } else if name.starts_with("ln") {
        Init::Ones
    } else {
        Init::Normal(0.02)
    }
}

/// The shapes of a block's weights in `BLOCK_WEIGHTS` order, for width `c` and MLP width `f`.
fn block_shapes(c: usize, f: usize) -> [Vec<usize>; 12] {
    [
        vec![c],
        vec![c],
        vec![c, 3 * c],
        vec![3 * c],
        vec![c, c],
        vec![c],
        vec![c],
        vec![c],
        vec![c, f],
        vec![f],
        vec![f, c],
        vec![c],
    ]
}

/// A block's weights as `(name, shape)` pairs in `BLOCK_WEIGHTS` order.
fn block_weights(shapes: &[Vec<usize>; 12]) -> Vec<(&'static str, &[usize])> {
    BLOCK_WEIGHTS
        .iter()
        .copied()
        .zip(shapes.iter().map(|s| s.as_slice()))
        .collect()
}

const BLOCK_WEIGHTS: [&str; 12] = [
    "ln1.w",
    "ln1.b",
    "attn.qkv.w",
    "attn.qkv.b",
    "attn.proj.w",
    "attn.proj.b",
    "ln2.w",
    "ln2.b",
    "mlp.fc.w",
    "mlp.fc.b",
    "mlp.proj.w",
    "mlp.proj.b",
];

/// Views of one block's weights, cheap to clone into a checkpoint scope.
#[derive(Clone)]
struct BlockParams {
    /// The block's index in the model's block list.
    index: usize,
    /// The weights held as tensors, by name (all twelve, or QLoRA's eight unquantised).
    w: Vec<(&'static str, Tensor)>,
    /// QLoRA's NF4 projections, in `QUANTIZED` order (empty otherwise).
    nf4: Vec<Arc<Nf4Weight>>,
    heads: usize,
    dropout: f32,
    /// Recompute the attention core (scores, softmax, dropout, weighted sum) in backward.
    selective: bool,
    attention: Attention,
    /// The block's LoRA adapters, if any.
    adapters: Option<BlockAdapters>,
}

/// Scores, causal mask, softmax, dropout and the weighted sum of values: (B, H, T, D) each.
/// The memory-heavy part of attention (its saved tensors are s² per head).
fn core_attention(q: &Tensor, k: &Tensor, v: &Tensor, dropout: f32) -> Result<Tensor> {
    let hd = q.shape()[3];
    let scores = q.matmul(&k.transpose(-2, -1)?)?; // (B, H, T, T)
    // Scale, causal mask and softmax in one op (the bits of the three, half the work).
    let att = scores
        .causal_softmax(1.0 / (hd as f32).sqrt())?
        .dropout(dropout)?;
    att.matmul(v) // (B, H, T, D)
}

impl BlockParams {
    fn get(&self, name: &str) -> &Tensor {
        &self
            .w
            .iter()
            .find(|(n, _)| *n == name)
            .expect("a weight the block holds")
            .1
    }

    /// Weight `name` in NF4, under QLoRA.
    fn nf4(&self, name: &str) -> Option<&Arc<Nf4Weight>> {
        let i = QUANTIZED.iter().position(|q| *q == name)?;
        self.nf4.get(i)
    }

    /// Causal self-attention: (B, T, C) → (B, T, C), scores materialised.
    fn attention(&self, h: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (h.shape()[0], h.shape()[1], h.shape()[2]);
        let (nh, hd) = (self.heads, c / self.heads);
        let qkv = self.project(h, "attn.qkv", LoraTarget::Qkv)?; // (B, T, 3C)
        let split = |i: usize, target: LoraTarget| -> Result<Tensor> {
            let part = qkv.narrow(2, i * c, c)?;
            let part = match &self.adapters {
                Some(a) => a.add_update(target, h, part)?,
                None => part,
            };
            part.reshape(&[b, t, nh, hd])?.permute(&[0, 2, 1, 3]) // (B, H, T, D)
        };
        let (q, k, v) = (
            split(0, LoraTarget::Q)?,
            split(1, LoraTarget::K)?,
            split(2, LoraTarget::V)?,
        );
        let y = if self.attention == Attention::MemoryEfficient {
            // Fused: saves q, k, v, y and a (B, H, T) statistic only, so there is nothing
            // T×T for selective recomputation to drop.
            let scale = 1.0 / (hd as f32).sqrt();
            Tensor::attention(&q, &k, &v, true, scale, self.dropout)? // (B, H, T, D)
        } else if self.selective {
            let p = self.dropout;
            checkpoint(&[&q, &k, &v], move |t| {
                core_attention(&t[0], &t[1], &t[2], p)
            })?
        } else {
            core_attention(&q, &k, &v, self.dropout)?
        };
        let y = y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?; // (B, T, C)
        self.project(&y, "attn.proj", LoraTarget::O)?
            .dropout(self.dropout)
    }

    /// `x·W + b` for weight `{name}.w`, plus the adapter's update when `target` has one.
    fn project(&self, x: &Tensor, name: &str, target: LoraTarget) -> Result<Tensor> {
        let (w, b) = (format!("{name}.w"), format!("{name}.b"));
        let y = match self.nf4(&w) {
            Some(q) => x.linear_nf4(q, self.get(&b))?,
            None => x.linear(self.get(&w), self.get(&b))?,
        };
        match &self.adapters {
            Some(a) => a.add_update(target, x, y),
            None => Ok(y),
        }
    }

    /// The block inside its parameter scope (gathered there under ZeRO-3).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        param_scope(&[self.index], x, |x| self.compute(x))
    }

    /// x + attn(ln1(x)), then + mlp(ln2(x)).
    fn compute(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.layer_norm(self.get("ln1.w"), self.get("ln1.b"), 1e-5)?;
        let x = x.add(&self.attention(&h)?)?;
        let h = x.layer_norm(self.get("ln2.w"), self.get("ln2.b"), 1e-5)?;
        let fc = self.project(&h, "mlp.fc", LoraTarget::Up)?; // (B, T, F)
        // GELU's (B, T, F) output is recomputed in backward, never saved (under every policy)
        // unless an adapter on the down projection reads it.
        let b = self.get("mlp.proj.b");
        let down = self
            .adapters
            .as_ref()
            .filter(|a| a.adapts(LoraTarget::Down));
        let m = match (self.nf4("mlp.proj.w"), down) {
            // An NF4 projection saves nothing, so GELU's output is not kept for it either.
            (Some(q), _) => {
                let g = fc.gelu()?;
                let m = g.linear_nf4(q, b)?;
                match down {
                    Some(a) => a.add_update(LoraTarget::Down, &g, m)?,
                    None => m,
                }
            }
            (None, Some(a)) => {
                let m = fc.gelu_linear(self.get("mlp.proj.w"), b)?;
                a.add_update(LoraTarget::Down, &fc.gelu()?, m)?
            }
            (None, None) => fc.gelu_linear(self.get("mlp.proj.w"), b)?,
        };
        x.add(&m.dropout(self.dropout)?)
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
        config.validate()?;
        let (v, s, c, f) = (config.vocab, config.context, config.width, config.ffn);
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
        blocks.push(new_block("embed", &[("wte", &[v, c]), ("wpe", &[s, c])])?);
        let shapes = block_shapes(c, f);
        let weights = block_weights(&shapes);
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
        let (norm_shape, lm_shape) = ([c], [c, v]);
        let mut head: Vec<(&str, &[usize])> =
            vec![("ln_f.w", &norm_shape), ("ln_f.b", &norm_shape)];
        if !config.tied {
            head.push(("lm_head.w", &lm_shape));
        }
        blocks.push(new_block("head", &head)?);
        let config_attention = config.attention;
        let mut gpt = Gpt {
            name: name.to_string(),
            config,
            blocks,
            adapters: Vec::new(),
            quantized,
            device: device.clone(),
            attention: config_attention,
        };
        for (bi, block) in gpt.blocks.iter().enumerate() {
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

    /// The plain layout of every base block's weights, with layer i's adapters (the values
    /// of `adapters[i]`, laid out as the adapter block) folded in: what a merged export writes,
    /// under the plain model's block names. QLoRA's NF4 projections are dequantised first.
    pub fn merged_blocks(&self, adapters: &[Vec<f32>]) -> Result<NamedValues> {
        let Some(lora) = &self.config.lora else {
            return Err(TensorError::invalid(
                "merge",
                "the model has no LoRA adapters",
            ));
        };
        let shapes = block_shapes(self.config.width, self.config.ffn);
        let weights = block_weights(&shapes);
        let specs = qlora::layout(&weights);
        let mut out = Vec::with_capacity(self.blocks.len());
        for (bi, block) in self.blocks.iter().enumerate() {
            let layer = bi.checked_sub(1).filter(|&l| l < self.config.layers);
            let mut values = match layer.and_then(|l| self.quantized.get(l)) {
                Some(q) => qlora::full_values(block, q, &weights)?,
                None => block.flat().to_vec_f32()?,
            };
            if let Some(l) = layer {
                let a = adapters.get(l).ok_or_else(|| {
                    TensorError::invalid("merge", format!("no adapter values for layer {l}"))
                })?;
                merge_block(&self.config, lora, &specs, &mut values, a)?;
            }
            out.push((block.name().to_string(), values));
        }
        Ok(out)
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

    fn block_params(&self, i: usize) -> Result<BlockParams> {
        let block = &self.blocks[1 + i];
        let nf4 = self.quantized.get(i).cloned().unwrap_or_default();
        let w = BLOCK_WEIGHTS
            .iter()
            .filter(|n| nf4.is_empty() || !QUANTIZED.contains(n))
            .map(|&n| Ok((n, block.param(n)?.clone())))
            .collect::<Result<Vec<_>>>()?;
        let adapters = match &self.config.lora {
            Some(lora) => Some(BlockAdapters::of(&self.adapters[i], lora)?),
            None => None,
        };
        Ok(BlockParams {
            // The block's trainable block: its adapters under LoRA, else its own weights.
            index: if adapters.is_some() { i } else { 1 + i },
            adapters,
            w,
            nf4,
            heads: self.config.heads,
            dropout: self.config.dropout,
            selective: false,
            attention: self.attention,
        })
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
        let embed = &self.blocks[0];
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
            let tok = embed.param("wte")?.embedding(inputs)?; // (B, T, C)
            let pos = embed.param("wpe")?.embedding(&pos_ids)?; // (T, C)
            tok.add(&pos)?.dropout(self.config.dropout)
        })?;
        let blocks = (0..self.config.layers)
            .map(|i| {
                let mut p = self.block_params(i)?;
                p.selective = recompute.selective;
                Ok(p)
            })
            .collect::<Result<Vec<_>>>()?;
        let x = run_blocks(x, blocks, &recompute.segments, BlockParams::forward)?;
        let last = self.config.layers + 1;
        let head = &self.blocks[last];
        // Tied weights: the output projection reads the embedding block too.
        let scope: &[usize] = if self.config.tied {
            &[last, 0]
        } else {
            &[last]
        };
        scoped(lora, scope, &x, |x| {
            let x = x.layer_norm(head.param("ln_f.w")?, head.param("ln_f.b")?, 1e-5)?;
            let w_out = if self.config.tied {
                embed.param("wte")?.transpose(0, 1)?
            } else {
                head.param("lm_head.w")?.clone()
            };
            x.linear_cross_entropy(&w_out, targets, recompute.loss_chunks)
        })
    }
}

/// `f(x)` inside a parameter scope of `blocks`, or plainly when they are `frozen`.
fn scoped(
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
        let full: usize = block_shapes(self.config.width, self.config.ffn)
            .iter()
            .map(|s| s.iter().product::<usize>())
            .sum();
        self.blocks
            .iter()
            .map(|b| match b.name().starts_with("block.") {
                true => (b.name().to_string(), full),
                false => (b.name().to_string(), b.numel()),
            })
            .collect()
    }

    fn load_plain_block(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let bi = self
            .blocks
            .iter()
            .position(|b| b.name() == name)
            .ok_or_else(|| TensorError::invalid("load", format!("no block {name}")))?;
        let Some(nf4) = bi.checked_sub(1).and_then(|l| self.quantized.get_mut(l)) else {
            return self.blocks[bi].set_values(values);
        };
        // QLoRA: the plain layout's projections re-quantised, the rest into the frozen block.
        let shapes = block_shapes(self.config.width, self.config.ffn);
        let weights = block_weights(&shapes);
        let mut kept = Vec::new();
        for spec in qlora::layout(&weights) {
            let n: usize = spec.shape.iter().product();
            let part = &values[spec.offset..spec.offset + n];
            match QUANTIZED.iter().position(|q| *q == spec.name) {
                Some(i) => {
                    let bytes = headroom_tensor::nf4::quantize_nf4(part);
                    Nf4Weight::set_bytes(&mut nf4[i], &bytes)?;
                }
                None => kept.extend_from_slice(part),
            }
        }
        self.blocks[bi].set_values(&kept)
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
