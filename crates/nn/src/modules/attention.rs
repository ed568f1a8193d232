//! Causal multi-head self-attention (Vaswani et al. 2017): project to queries, keys and values
//! (one fused projection, GPT-2's, or three, the Llama family's), split into heads, rotate
//! queries and keys by position where the model has a rotary embedding, share each key/value
//! head among a group of query heads (grouped-query attention, Ainslie et al. 2023), attend
//! (causally, or within a sliding window of the last `w` keys, Mistral's, Jiang et al. 2023),
//! merge the heads and project out. The attention core is naive (scores materialised; under
//! selective recomputation recomputed in backward, Korthikanti et al. 2022) or memory-efficient
//! (the fused kernel, `Tensor::attention`).
//!
//! Under tensor parallelism (Megatron-LM's attention, Shoeybi et al. 2019, arXiv:1909.08053
//! §3) each rank holds `heads / tp` heads: the fused q/k/v projection is column-parallel (the
//! rank's query, key and value columns), the core runs on the rank's heads alone, and the
//! output projection is row-parallel over the rank's head features.
//!
//! Not for: the kernels (the tensor crate) or the residual around the layer (`decoder_block.rs`).

use super::lora_adapter::adapted;
use super::{Linear, LoraAdapter, RotaryTables, Slot};
use headroom_strategy::Attention as AttentionKind;
use headroom_tensor::{ChunkColumns, Result, Tensor, TensorError, TensorParallel, checkpoint};

/// The sizes of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// The model width (input and output features).
    pub width: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (a divisor of `heads`; `heads` itself without grouping).
    pub kv_heads: usize,
    /// Whether the projections have biases.
    pub bias: bool,
}

impl AttentionShape {
    /// Features per head.
    pub fn head_dim(&self) -> usize {
        self.width / self.heads
    }

    /// Features of the keys (and of the values): key/value heads × head dimension.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim()
    }

    /// Checks the sizes; a bad one names the fix.
    pub fn validate(&self) -> Result<()> {
        let (c, h, kv) = (self.width, self.heads, self.kv_heads);
        if h == 0 || kv == 0 || !c.is_multiple_of(h) || !h.is_multiple_of(kv) {
            return Err(TensorError::invalid(
                "attention",
                format!(
                    "width {c} must be a multiple of heads {h}, and heads a multiple of key/value heads {kv}"
                ),
            ));
        }
        Ok(())
    }

    /// The slots of a fused layer: `{name}.{qkv}` (width × (width + 2·kv_width)) and
    /// `{name}.{out}`.
    pub fn fused_slots(&self, name: &str, qkv: &str, out: &str) -> Vec<Slot> {
        let c = self.width;
        let fused = c + 2 * self.kv_width();
        let mut slots = Linear::slots(&super::join(name, qkv), c, fused, self.bias);
        slots.extend(Linear::slots(&super::join(name, out), c, c, self.bias));
        slots
    }

    /// The slots of a layer with separate projections, named `[q, k, v, out]`.
    pub fn separate_slots(&self, name: &str, names: [&str; 4]) -> Vec<Slot> {
        let (c, kv) = (self.width, self.kv_width());
        let outputs = [c, kv, kv, c];
        names
            .iter()
            .zip(outputs)
            .flat_map(|(n, out)| Linear::slots(&super::join(name, n), c, out, self.bias))
            .collect()
    }
}

/// How queries, keys and values are projected.
#[derive(Clone, Debug)]
pub enum QkvProjection {
    /// One projection split into queries, keys and values; each part may have its own adapter
    /// (LoRA on q, k or v of a fused projection).
    Fused {
        qkv: Linear,
        parts: [Option<LoraAdapter>; 3],
    },
    /// Three projections (each with its own adapter, if any).
    Separate { q: Linear, k: Linear, v: Linear },
}

/// A bound causal self-attention layer.
#[derive(Clone, Debug)]
pub struct Attention {
    pub shape: AttentionShape,
    pub qkv: QkvProjection,
    pub out: Linear,
    pub kind: AttentionKind,
    /// Dropout on the attention probabilities.
    pub dropout: f32,
    /// Recompute the naive core (scores, softmax, dropout, weighted sum) in backward.
    pub selective: bool,
    /// The rotary embedding's tables for this sequence length, if the model has one.
    pub rotary: Option<RotaryTables>,
    /// A sliding window: each query attends to the last `w` keys (itself included) only.
    pub window: Option<usize>,
    /// This rank's group when the heads are split over ranks.
    pub parallel: Option<TensorParallel>,
}

/// Scores, causal mask, softmax, dropout and the weighted sum of values, from q (B, T, H, D)
/// and k, v (B, T, Hkv, D) to (B, H, T, D). The memory-heavy part of attention (its saved
/// tensors are T² per head), as one op that materialises them as the composition of matmul,
/// causal softmax, dropout and matmul does, skipping the products the mask makes moot
/// (`Tensor::causal_attention_materialized`). Grouped key/value heads are read in place.
fn core_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dropout: f32,
    window: Option<usize>,
) -> Result<Tensor> {
    let scale = 1.0 / (q.shape()[3] as f32).sqrt();
    let [q, k, v] = [q, k, v].map(|x| x.permute(&[0, 2, 1, 3])); // (B, n, T, D)
    Tensor::causal_attention_materialized(&q?, &k?, &v?, window, scale, dropout)
}

impl Attention {
    /// Part `i` (0: queries, 1: keys, 2: values) of width (B, T, n·D) → (B, T, n, D): split
    /// into its n heads (H for queries, Hkv for keys and values, this rank's share under tensor
    /// parallelism) and rotated by position (queries and keys, with a rotary embedding).
    /// Neither core repeats a key/value head for its group of query heads: both read it in
    /// place.
    fn heads(
        &self,
        shape: &AttentionShape,
        i: usize,
        x: Tensor,
        b: usize,
        t: usize,
    ) -> Result<Tensor> {
        let (nh, hd) = (shape.heads, shape.head_dim());
        let n = if i == 0 { nh } else { shape.kv_heads };
        let x = x.reshape(&[b, t, n, hd])?; // (B, T, n, D)
        match self.rotary.as_ref().filter(|_| i < 2) {
            Some(rotary) => rotary.apply(&x),
            None => Ok(x),
        }
    }

    /// Queries (B, T, H, D), keys and values (B, T, Hkv, D) of `h`.
    fn project(
        &self,
        shape: &AttentionShape,
        h: &Tensor,
        b: usize,
        t: usize,
    ) -> Result<[Tensor; 3]> {
        match &self.qkv {
            QkvProjection::Fused { qkv, parts } => {
                let (c, kv) = (shape.width, shape.kv_width());
                let all = match &self.parallel {
                    Some(tp) if parts.iter().all(Option::is_none) => {
                        qkv.forward_column_parallel(h, tp, &fused_chunks(shape, tp)?)?
                    }
                    Some(_) => return Err(not_split("LoRA adapters on q, k or v")),
                    None => qkv.forward(h)?,
                }; // (B, T, C + 2·KV)
                let (starts, lens) = ([0, c, c + kv], [c, kv, kv]);
                let split = |i: usize| -> Result<Tensor> {
                    let part = all.narrow(2, starts[i], lens[i])?;
                    self.heads(shape, i, adapted(parts[i].as_ref(), h, part)?, b, t)
                };
                Ok([split(0)?, split(1)?, split(2)?])
            }
            QkvProjection::Separate { .. } if self.parallel.is_some() => {
                Err(not_split("separate q, k and v projections"))
            }
            QkvProjection::Separate { q, k, v } => Ok([
                self.heads(shape, 0, q.forward(h)?, b, t)?,
                self.heads(shape, 1, k.forward(h)?, b, t)?,
                self.heads(shape, 2, v.forward(h)?, b, t)?,
            ]),
        }
    }

    /// The sizes this rank computes: all of them, or under tensor parallelism its share of the
    /// heads (and of the width).
    fn local_shape(&self) -> Result<AttentionShape> {
        let Some(tp) = &self.parallel else {
            return Ok(self.shape);
        };
        let (h, kv, n) = (self.shape.heads, self.shape.kv_heads, tp.world());
        if !h.is_multiple_of(n) || !kv.is_multiple_of(n) {
            return Err(TensorError::invalid(
                "tensor parallelism",
                format!(
                    "{h} attention heads ({kv} key/value heads) do not split over {n} ranks; use a tensor-parallel size that divides the heads"
                ),
            ));
        }
        Ok(AttentionShape {
            width: self.shape.width / n,
            heads: h / n,
            kv_heads: kv / n,
            bias: self.shape.bias,
        })
    }

    /// (B, T, C) → (B, T, C).
    pub fn forward(&self, h: &Tensor) -> Result<Tensor> {
        self.shape.validate()?;
        if h.rank() != 3 || h.shape()[2] != self.shape.width {
            return Err(TensorError::invalid(
                "attention",
                format!(
                    "input must be (B, T, {}), got {:?}",
                    self.shape.width,
                    h.shape()
                ),
            ));
        }
        let (b, t) = (h.shape()[0], h.shape()[1]);
        let shape = self.local_shape()?;
        let c = shape.width;
        let [q, k, v] = self.project(&shape, h, b, t)?;
        let y = if self.kind == AttentionKind::MemoryEfficient {
            // Fused: saves q, k, v, y and a (B, H, T) statistic only, so there is nothing
            // T×T for selective recomputation to drop. Grouped heads are read in place.
            let scale = 1.0 / (shape.head_dim() as f32).sqrt();
            let [q, k, v] = [q, k, v].map(|x| x.permute(&[0, 2, 1, 3])); // (B, n, T, D)
            Tensor::attention_masked(&q?, &k?, &v?, Some(self.window), scale, self.dropout)? // (B, H, T, D)
        } else if self.selective {
            let (p, w) = (self.dropout, self.window);
            checkpoint(&[&q, &k, &v], move |t| {
                core_attention(&t[0], &t[1], &t[2], p, w)
            })?
        } else {
            core_attention(&q, &k, &v, self.dropout, self.window)?
        };
        let y = y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?; // (B, T, C)
        match &self.parallel {
            Some(tp) => self.out.forward_row_parallel(&y, tp),
            None => self.out.forward(&y),
        }
    }
}

/// This rank's chunks of a fused projection's columns: chunk j holds the j-th slice of the
/// rank's query columns, of its key columns and of its value columns.
fn fused_chunks(shape: &AttentionShape, tp: &TensorParallel) -> Result<Vec<ChunkColumns>> {
    let per = tp.chunks_per_rank();
    let (c, kv) = (shape.width, shape.kv_width());
    if !c.is_multiple_of(per) || !kv.is_multiple_of(per) {
        return Err(TensorError::invalid(
            "tensor parallelism",
            format!(
                "a rank's {c} query and {kv} key/value features do not split into {per} reduction chunks; use a width that {} divides",
                tp.chunks()
            ),
        ));
    }
    let (cw, kw) = (c / per, kv / per);
    Ok((0..per)
        .map(|j| vec![(j * cw, cw), (c + j * kw, kw), (c + kv + j * kw, kw)])
        .collect())
}

fn not_split(what: &str) -> TensorError {
    TensorError::invalid(
        "tensor parallelism",
        format!("{what} are not split over ranks; train this model without --tensor-parallel"),
    )
}
