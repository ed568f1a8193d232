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
//! Not for: training.

use super::limits::{MAX_BLOCKS, MAX_DIM, check_sizes};
use crate::init::{Init, initialise};
use crate::model::{Model, Recompute, run_blocks};
use headroom_memory::{Category, Device};
pub use headroom_strategy::Attention;
use headroom_tensor::{DType, ParamBlock, Result, Tensor, TensorError, checkpoint, param_scope};
use serde::{Deserialize, Serialize};

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
        Ok(())
    }

    /// Exact parameter count: embeddings V·C + S·C; per block 2·2C (norms) + C·3C + 3C (qkv) +
    /// C·C + C (projection) + C·F + F + F·C + C (MLP); final norm 2C; untied head C·V.
    pub fn num_params(&self) -> usize {
        let (v, s, c, f) = (self.vocab, self.context, self.width, self.ffn);
        let block = 4 * c + c * 3 * c + 3 * c + c * c + c + c * f + f + f * c + c;
        v * c + s * c + self.layers * block + 2 * c + if self.tied { 0 } else { c * v }
    }
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
    w: Vec<Tensor>,
    heads: usize,
    dropout: f32,
    /// Recompute the attention core (scores, softmax, dropout, weighted sum) in backward.
    selective: bool,
    attention: Attention,
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
        &self.w[BLOCK_WEIGHTS
            .iter()
            .position(|n| *n == name)
            .expect("known weight")]
    }

    /// Causal self-attention: (B, T, C) → (B, T, C), scores materialised.
    fn attention(&self, h: &Tensor) -> Result<Tensor> {
        let (b, t, c) = (h.shape()[0], h.shape()[1], h.shape()[2]);
        let (nh, hd) = (self.heads, c / self.heads);
        let qkv = h.linear(self.get("attn.qkv.w"), self.get("attn.qkv.b"))?; // (B, T, 3C)
        let split = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * c, c)?
                .reshape(&[b, t, nh, hd])?
                .permute(&[0, 2, 1, 3]) // (B, H, T, D)
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
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
        y.linear(self.get("attn.proj.w"), self.get("attn.proj.b"))?
            .dropout(self.dropout)
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
        let fc = h.linear(self.get("mlp.fc.w"), self.get("mlp.fc.b"))?; // (B, T, F)
        // GELU's (B, T, F) output is recomputed in backward, never saved (under every policy).
        let m = fc.gelu_linear(self.get("mlp.proj.w"), self.get("mlp.proj.b"))?;
        x.add(&m.dropout(self.dropout)?)
    }
}

/// A GPT on a device.
#[derive(Debug)]
pub struct Gpt {
    name: String,
    config: GptConfig,
    blocks: Vec<ParamBlock>,
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
        let mut blocks = Vec::with_capacity(config.layers + 2);
        blocks.push(ParamBlock::new(
            device,
            "embed",
            &[("wte", &[v, c]), ("wpe", &[s, c])],
            dtype,
        )?);
        for i in 0..config.layers {
            let shapes: [&[usize]; 12] = [
                &[c],
                &[c],
                &[c, 3 * c],
                &[3 * c],
                &[c, c],
                &[c],
                &[c],
                &[c],
                &[c, f],
                &[f],
                &[f, c],
                &[c],
            ];
            let weights: Vec<(&str, &[usize])> =
                BLOCK_WEIGHTS.iter().copied().zip(shapes).collect();
            blocks.push(ParamBlock::new(
                device,
                &format!("block.{i}"),
                &weights,
                dtype,
            )?);
        }
        let (norm_shape, lm_shape) = ([c], [c, v]);
        let mut head: Vec<(&str, &[usize])> =
            vec![("ln_f.w", &norm_shape), ("ln_f.b", &norm_shape)];
        if !config.tied {
            head.push(("lm_head.w", &lm_shape));
        }
        blocks.push(ParamBlock::new(device, "head", &head, dtype)?);
        let config_attention = config.attention;
        let gpt = Gpt {
            name: name.to_string(),
            config,
            blocks,
            device: device.clone(),
            attention: config_attention,
        };
        gpt.initialise(seed)?;
        Ok(gpt)
    }

    /// GPT-2's initialisation: normal(0, 0.02) weights, zero biases, unit norm gains.
    fn initialise(&self, seed: u64) -> Result<()> {
        initialise(&self.blocks, seed, |name| {
            if name.ends_with(".b") {
                Init::Zeros
            } else if name.starts_with("ln") {
                Init::Ones
            } else {
                Init::Normal(0.02)
            }
        })
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
        let w = BLOCK_WEIGHTS
            .iter()
            .map(|n| block.param(n).cloned())
            .collect::<Result<Vec<_>>>()?;
        Ok(BlockParams {
            index: 1 + i,
            w,
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
        let x = param_scope(&[0], inputs, |inputs| {
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
        param_scope(scope, &x, |x| {
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

impl Model for Gpt {
    fn name(&self) -> &str {
        &self.name
    }

    fn blocks(&self) -> &[ParamBlock] {
        &self.blocks
    }

    fn depth(&self) -> usize {
        self.config.layers
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor, recompute: &Recompute) -> Result<Tensor> {
        self.forward_loss(inputs, targets, recompute)
    }
}
