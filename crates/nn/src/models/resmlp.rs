//! A deep residual MLP over token embeddings — the classic test bed for activation
//! checkpointing (Chen et al. 2016), up to 1,000 blocks: embedding, N pre-norm blocks
//! x + W2·GELU(W1·LN(x)), final norm, output head. Each position is predicted from its own
//! token (a bigram model), which keeps the compute per block small and the depth large.
//!
//! Not for: attention (see `gpt`).

use super::limits::{MAX_BLOCKS, MAX_DIM, check_sizes};
use crate::init::{Init, initialise};
use crate::model::{Model, Recompute, run_blocks};
use headroom_memory::Device;
use headroom_tensor::{DType, ParamBlock, Result, Tensor, TensorError, param_scope};
use serde::{Deserialize, Serialize};

/// Shape of a residual MLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResMlpConfig {
    pub vocab: usize,
    pub width: usize,
    pub hidden: usize,
    pub depth: usize,
    pub dropout: f32,
}

impl ResMlpConfig {
    pub fn validate(&self) -> Result<()> {
        if self.vocab == 0 || self.width == 0 || self.hidden == 0 || self.depth == 0 {
            return Err(TensorError::invalid(
                "ResMlpConfig",
                format!("every size must be at least 1, got {self:?}"),
            ));
        }
        check_sizes(
            "ResMlpConfig",
            &[
                ("depth", self.depth, MAX_BLOCKS),
                ("width", self.width, MAX_DIM),
                ("hidden", self.hidden, MAX_DIM),
                ("vocab", self.vocab, MAX_DIM),
            ],
        )
    }

    /// V·C (embedding) + N·(2C + C·H + H + H·C + C) + 2C + C·V (head).
    pub fn num_params(&self) -> usize {
        let (v, c, h) = (self.vocab, self.width, self.hidden);
        v * c + self.depth * (2 * c + c * h + h + h * c + c) + 2 * c + c * v
    }
}

const BLOCK_WEIGHTS: [&str; 6] = ["ln.w", "ln.b", "fc1.w", "fc1.b", "fc2.w", "fc2.b"];

#[derive(Clone)]
struct BlockParams {
    /// The block's index in the model's block list.
    index: usize,
    w: Vec<Tensor>,
    dropout: f32,
}

impl BlockParams {
    /// The block inside its parameter scope (gathered there under ZeRO-3).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        param_scope(&[self.index], x, |x| self.compute(x))
    }

    fn compute(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.layer_norm(&self.w[0], &self.w[1], 1e-5)?;
        let h = h.linear(&self.w[2], &self.w[3])?; // (B, T, H)
        // GELU's output is recomputed in backward, not saved (see `Tensor::gelu_linear`).
        let h = h
            .gelu_linear(&self.w[4], &self.w[5])?
            .dropout(self.dropout)?; // (B, T, C)
        x.add(&h)
    }
}

/// A residual MLP on a device.
#[derive(Debug)]
pub struct ResMlp {
    name: String,
    config: ResMlpConfig,
    blocks: Vec<ParamBlock>,
}

impl ResMlp {
    /// Weights normal(0, 0.02), the second layer of each block scaled by 1/√(2N) so the residual
    /// stream's variance stays bounded at any depth (GPT-2's residual scaling).
    pub fn new(
        name: &str,
        config: ResMlpConfig,
        device: &Device,
        dtype: DType,
        seed: u64,
    ) -> Result<ResMlp> {
        config.validate()?;
        let (v, c, h) = (config.vocab, config.width, config.hidden);
        let mut blocks = Vec::with_capacity(config.depth + 2);
        blocks.push(ParamBlock::new(
            device,
            "embed",
            &[("wte", &[v, c])],
            dtype,
        )?);
        for i in 0..config.depth {
            let shapes: [&[usize]; 6] = [&[c], &[c], &[c, h], &[h], &[h, c], &[c]];
            let weights: Vec<(&str, &[usize])> =
                BLOCK_WEIGHTS.iter().copied().zip(shapes).collect();
            blocks.push(ParamBlock::new(
                device,
                &format!("block.{i}"),
                &weights,
                dtype,
            )?);
        }
        blocks.push(ParamBlock::new(
            device,
            "head",
            &[("ln_f.w", &[c]), ("ln_f.b", &[c]), ("out.w", &[c, v])],
            dtype,
        )?);
        let residual_std = 0.02 / (2.0 * config.depth as f32).sqrt();
        initialise(&blocks, seed, |name| match name {
            "ln.w" | "ln_f.w" => Init::Ones,
            s if s.ends_with(".b") => Init::Zeros,
            "fc2.w" => Init::Normal(residual_std),
            _ => Init::Normal(0.02),
        })?;
        Ok(ResMlp {
            name: name.to_string(),
            config,
            blocks,
        })
    }

    pub fn config(&self) -> &ResMlpConfig {
        &self.config
    }
}

impl Model for ResMlp {
    fn name(&self) -> &str {
        &self.name
    }

    fn blocks(&self) -> &[ParamBlock] {
        &self.blocks
    }

    fn depth(&self) -> usize {
        self.config.depth
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor, recompute: &Recompute) -> Result<Tensor> {
        let x = param_scope(&[0], inputs, |ids| {
            self.blocks[0].param("wte")?.embedding(ids)
        })?; // (B, T, C)
        let blocks = (0..self.config.depth)
            .map(|i| {
                let block = &self.blocks[1 + i];
                Ok(BlockParams {
                    index: 1 + i,
                    w: BLOCK_WEIGHTS
                        .iter()
                        .map(|n| block.param(n).cloned())
                        .collect::<Result<Vec<_>>>()?,
                    dropout: self.config.dropout,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let x = run_blocks(x, blocks, &recompute.segments, BlockParams::forward)?;
        let last = self.config.depth + 1;
        let head = &self.blocks[last];
        param_scope(&[last], &x, |x| {
            x.layer_norm(head.param("ln_f.w")?, head.param("ln_f.b")?, 1e-5)?
                .linear_cross_entropy(head.param("out.w")?, targets, recompute.loss_chunks)
        })
    }
}
