//! Every derivative rule in one place: `Op` lists what each recorded op keeps for backward
//! (exactly the tensors its rule reads; those are the saved activations), and `backward` holds
//! one arm per op turning the output gradient `dy` into input gradients. Inputs that do not
//! require grad get `None` and cost nothing.
//!
//! Not for: walking the tape (see `tape`) or the recompute of checkpoint scopes (see `checkpoint`).

use crate::backend::{BinaryOp, UnaryOp};
use crate::checkpoint::{self, CheckpointOp};
use crate::dtype::DType;
use crate::error::Result;
use crate::grads::Gradients;
use crate::ops::{attention, causal_attention, gelu_linear, nn, rotary, swiglu, tensor_parallel};
use crate::scope;
use crate::tensor::Tensor;

/// A recorded op with what its backward needs. Shapes are kept where the rule only needs them.
pub(crate) enum Op {
    /// y = a + b (broadcasting): da = Σ_broadcast dy, db = Σ_broadcast dy. Saves nothing.
    Add {
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
    },
    /// y = a − b: da = Σ dy, db = −Σ dy. Saves nothing.
    Sub {
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
    },
    /// y = a ⊙ b: da = Σ dy⊙b, db = Σ dy⊙a. Saves b only if a needs grad, a only if b does.
    Mul {
        a: Option<Tensor>,
        b: Option<Tensor>,
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
    },
    /// y = a / b: da = Σ dy/b, db = −Σ dy⊙a/b². Saves b, and a only if b needs grad.
    Div {
        a: Option<Tensor>,
        b: Tensor,
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
    },
    /// y = f(x): dx = dy ⊙ f'(·) from the saved input or output (see `backend::cpu::math`).
    Unary {
        op: UnaryOp,
        saved: Option<Tensor>,
    },
    /// y = Σ_axes x (keepdim): dx = broadcast(dy). Saves nothing.
    Sum {
        in_shape: Vec<usize>,
    },
    /// y = max_axes x (keepdim): dx = dy ⊙ [x = y] / #ties. Saves x and y.
    Max {
        x: Tensor,
        y: Tensor,
        axes: Vec<usize>,
    },
    /// View ops: the gradient is the inverse view. Save nothing.
    Reshape {
        in_shape: Vec<usize>,
    },
    Permute {
        perm: Vec<usize>,
    },
    Broadcast {
        in_shape: Vec<usize>,
    },
    Narrow {
        in_shape: Vec<usize>,
        axis: usize,
        start: usize,
    },
    /// y = concat(xs, axis): dxᵢ = narrow(dy). Saves the sizes.
    Cat {
        axis: usize,
        sizes: Vec<usize>,
    },
    /// y = contiguous copy of x: dx = dy.
    Contiguous,
    /// y = x as another dtype: dx = dy cast back.
    Cast {
        from: DType,
    },
    /// y = gelu(x) @ w (+ b): dx = (dy @ wᵀ) ⊙ gelu'(x), dw = gelu(x)ᵀ @ dy with gelu(x)
    /// recomputed, and with a bias db = Σ_rows dy (first, as the separate add's backward ran).
    /// Saves x, and the weight only if x needs grad.
    GeluMatmul {
        x: Tensor,
        w: Option<Tensor>,
        w_shape: Vec<usize>,
        bias_shape: Option<Vec<usize>>,
    },
    /// y = x @ dequant(w) for a frozen NF4 weight: dx = dy @ dequant(w)ᵀ, the weight
    /// dequantised again. Saves the weight's handle only.
    Nf4Matmul {
        w: std::sync::Arc<crate::nf4::Nf4Weight>,
        x_shape: Vec<usize>,
        dtype: DType,
    },
    /// y = a @ b + bias (bias broadcast over rows): the matmul's two gradients and the bias's
    /// `Σ_rows dy`, computed in the order the two separate ops' backwards ran (bias first).
    Linear {
        a: Option<Tensor>,
        b: Option<Tensor>,
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
        bias_shape: Vec<usize>,
    },
    /// Tensor parallelism's column-parallel linear (`ops::tensor_parallel`): dw and db range by
    /// range, dx summed over chunks and ranks as a tree. Saves x only if w needs grad, w only if
    /// x does.
    ColumnParallelLinear {
        x: Option<Tensor>,
        w: Option<Tensor>,
        ranges: Vec<(usize, usize)>,
        chunks: Vec<tensor_parallel::ChunkColumns>,
        tp: tensor_parallel::TensorParallel,
    },
    /// y = Σ over ranks of each rank's x: dx = dy. Saves nothing.
    SumOverRanks,
    /// y = a @ b: da = dy @ bᵀ, db = aᵀ @ dy (summed over broadcast batch dims).
    Matmul {
        a: Option<Tensor>,
        b: Option<Tensor>,
        a_shape: Vec<usize>,
        b_shape: Vec<usize>,
    },
    /// y[n] = table[ids[n]]: dtable = scatter-add of dy at ids. Saves the ids.
    Embedding {
        ids: Tensor,
        vocab: usize,
    },
    /// y[n] = x[n, idx[n]]: dx = 0 except dx[n, idx[n]] = dy[n]. Saves the indices.
    GatherLast {
        idx: Tensor,
        in_shape: Vec<usize>,
    },
    /// Softmax / log-softmax over the last axis: the rule reads only the output y.
    Softmax {
        y: Tensor,
        log: bool,
    },
    /// Causal softmax of scaled scores: the rule reads only the output y.
    CausalSoftmax {
        y: Tensor,
        scale: f32,
        window: Option<usize>,
    },
    /// Layer norm: saves x, the weight and the f32 row statistics mean and rstd.
    LayerNorm {
        x: Tensor,
        w: Tensor,
        mean: Tensor,
        rstd: Tensor,
    },
    /// RMS norm: saves x, the weight and the f32 row statistic rstd.
    RmsNorm {
        x: Tensor,
        w: Tensor,
        rstd: Tensor,
    },
    /// y = silu(gate) ⊙ up: d_up = dy ⊙ silu(gate), d_gate = silu'(gate) ⊙ dy ⊙ up, the SiLU
    /// recomputed. Saves gate, and up only if gate needs grad.
    SwiGlu {
        gate: Tensor,
        up: Option<Tensor>,
    },
    /// Rotary embedding: dx = dy rotated back (the inverse rotation). Saves the f32 tables of
    /// angles only, shared by every layer.
    Rotary {
        cos: Tensor,
        sin: Tensor,
    },
    /// Dropout: saves no mask — the counter-based generator regenerates it from (seed, offset).
    Dropout {
        p: f32,
        seed: u64,
        offset: u64,
    },
    /// Causal mask: dy with the masked (future) positions zeroed. Saves nothing.
    CausalMask,
    /// Fused attention: saves q, k, v, the output o and the f32 row log-sum-exp; backward
    /// recomputes the probabilities tile by tile (p = exp(s − lse)), with Dᵢ = dOᵢ·Oᵢ:
    /// dV = Σ pᵀ dO, dS = p ⊙ (dO Vᵀ − D), dQ = dS K·scale, dK = dSᵀ Q·scale.
    Attention {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        o: Tensor,
        lse: Tensor,
        spec: crate::backend::AttentionSpec,
    },
    /// Materialised causal attention (`ops::causal_attention`): saves q, k, v, the
    /// probabilities p and, with dropout, the dropped probabilities: dV = aᵀ dO, dP = dO Vᵀ
    /// (through dropout), dS = causal softmax's rule, dQ = dS K, dK = dSᵀ Q.
    CausalAttention {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        saved: causal_attention::Saved,
    },
    /// A checkpoint scope: saves its inputs and RNG cursor, recomputes on a sub-tape.
    Checkpoint(CheckpointOp),
    /// y = x after a parameter scope: dx = dy, once the scope's hooks were told. Saves nothing.
    ScopeMarker {
        blocks: Vec<usize>,
    },
}

/// The gradients of an op's inputs from the gradient of its output.
pub(crate) fn backward(
    op: Op,
    dy: &Tensor,
    needs: &[bool],
    grads: &mut Gradients,
) -> Result<Vec<Option<Tensor>>> {
    let want = |i: usize| needs.get(i).copied().unwrap_or(false);
    Ok(match op {
        Op::Add { a_shape, b_shape } => vec![
            want(0).then(|| dy.sum_to(&a_shape)).transpose()?,
            want(1).then(|| dy.sum_to(&b_shape)).transpose()?,
        ],
        Op::Sub { a_shape, b_shape } => vec![
            want(0).then(|| dy.sum_to(&a_shape)).transpose()?,
            want(1).then(|| dy.neg()?.sum_to(&b_shape)).transpose()?,
        ],
        Op::Mul {
            a,
            b,
            a_shape,
            b_shape,
        } => vec![
            b.map(|b| dy.mul(&b)?.sum_to(&a_shape)).transpose()?,
            a.map(|a| dy.mul(&a)?.sum_to(&b_shape)).transpose()?,
        ],
        Op::Div {
            a,
            b,
            a_shape,
            b_shape,
        } => vec![
            want(0).then(|| dy.div(&b)?.sum_to(&a_shape)).transpose()?,
            // d(a/b)/db = −a/b²
            a.map(|a| dy.mul(&a)?.div(&b)?.div(&b)?.neg()?.sum_to(&b_shape))
                .transpose()?,
        ],
        Op::Unary { op, saved } => vec![Some(match (op, saved) {
            (UnaryOp::Neg, _) => dy.neg()?,
            (UnaryOp::Affine { mul, .. }, _) => dy.affine(mul, 0.0)?,
            (op, Some(s)) => s.binary_raw(BinaryOp::UnaryGrad(op), dy)?,
            (op, None) => {
                return Err(crate::error::TensorError::Backward(format!(
                    "{op:?} recorded without its saved tensor"
                )));
            }
        })],
        Op::Sum { in_shape } => vec![Some(dy.broadcast_as(&in_shape)?)],
        Op::Max { x, y, axes } => {
            let mask = x.binary_raw(BinaryOp::Eq, &y.broadcast_as(x.shape())?)?;
            let ties = mask.sum_keepdim_axes(&axes)?;
            vec![Some(dy.div(&ties)?.broadcast_as(x.shape())?.mul(&mask)?)]
        }
        Op::Reshape { in_shape } => vec![Some(dy.reshape(&in_shape)?)],
        Op::Permute { perm } => {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            vec![Some(dy.permute(&inverse)?)]
        }
        Op::Broadcast { in_shape } => vec![Some(dy.sum_to(&in_shape)?)],
        Op::Narrow {
            in_shape,
            axis,
            start,
        } => vec![Some(dy.pad_into(&in_shape, axis, start)?)],
        Op::Cat { axis, sizes } => {
            let mut start = 0;
            let mut out = Vec::with_capacity(sizes.len());
            for (i, &len) in sizes.iter().enumerate() {
                out.push(
                    want(i)
                        .then(|| dy.narrow(axis as isize, start, len))
                        .transpose()?,
                );
                start += len;
            }
            out
        }
        Op::Contiguous | Op::SumOverRanks => vec![Some(dy.clone())],
        Op::ColumnParallelLinear {
            x,
            w,
            ranges,
            chunks,
            tp,
        } => tensor_parallel::column_parallel_backward(
            x.as_ref(),
            w.as_ref(),
            &ranges,
            &chunks,
            &tp,
            dy,
            want(2),
        )?,
        Op::Cast { from } => vec![Some(dy.cast(from)?)],
        Op::Matmul {
            a,
            b,
            a_shape,
            b_shape,
        } => vec![
            b.map(|b| dy.matmul(&b.transpose(-1, -2)?)?.sum_to(&a_shape))
                .transpose()?,
            a.map(|a| a.transpose(-1, -2)?.matmul(dy)?.sum_to(&b_shape))
                .transpose()?,
        ],
        Op::Linear {
            a,
            b,
            a_shape,
            b_shape,
            bias_shape,
        } => {
            let dbias = want(2).then(|| dy.sum_to(&bias_shape)).transpose()?;
            vec![
                b.map(|b| dy.matmul(&b.transpose(-1, -2)?)?.sum_to(&a_shape))
                    .transpose()?,
                a.map(|a| a.transpose(-1, -2)?.matmul(dy)?.sum_to(&b_shape))
                    .transpose()?,
                dbias,
            ]
        }
        Op::GeluMatmul {
            x,
            w,
            w_shape,
            bias_shape,
        } => {
            let db = match &bias_shape {
                Some(shape) => want(2).then(|| dy.sum_to(shape)).transpose()?,
                None => None,
            };
            let mut grads =
                gelu_linear::gelu_matmul_backward(&x, w.as_ref(), &w_shape, dy, want(1))?;
            if bias_shape.is_some() {
                grads.push(db);
            }
            grads
        }
        Op::Nf4Matmul { w, x_shape, dtype } => {
            vec![Some(crate::nf4::matmul_nf4_backward(
                &w, &x_shape, dtype, dy,
            )?)]
        }
        Op::Embedding { ids, vocab } => vec![Some(nn::embedding_backward(&ids, dy, vocab)?), None],
        Op::GatherLast { idx, in_shape } => {
            vec![Some(nn::scatter_last(&idx, dy, &in_shape)?), None]
        }
        Op::Softmax { y, log } => vec![Some(nn::softmax_backward(&y, dy, log)?)],
        Op::CausalSoftmax { y, scale, window } => {
            vec![Some(nn::causal_softmax_backward(&y, dy, scale, window)?)]
        }
        Op::LayerNorm { x, w, mean, rstd } => {
            let (dx, dw, db) = nn::layer_norm_backward(&x, &w, &mean, &rstd, dy)?;
            vec![Some(dx), Some(dw), Some(db)]
        }
        Op::RmsNorm { x, w, rstd } => {
            let (dx, dw) = nn::rms_norm_backward(&x, &w, &rstd, dy)?;
            vec![Some(dx), Some(dw)]
        }
        Op::SwiGlu { gate, up } => swiglu::swiglu_backward(&gate, up.as_ref(), dy, want(1))?,
        Op::Rotary { cos, sin } => vec![Some(rotary::rotate(dy, &cos, &sin, true)?)],
        Op::Dropout { p, seed, offset } => vec![Some(nn::dropout_with(dy, p, seed, offset)?)],
        Op::CausalMask => vec![Some(nn::causal_fill(dy, 0.0)?)],
        Op::CausalAttention { q, k, v, saved } => causal_attention::causal_attention_backward(
            [&q, &k, &v],
            &saved,
            dy,
            [want(0), want(1), want(2)],
        )?,
        Op::Attention {
            q,
            k,
            v,
            o,
            lse,
            spec,
        } => attention::attention_backward(
            &q,
            &k,
            &v,
            &o,
            &lse,
            dy,
            spec,
            [want(0), want(1), want(2)],
        )?,
        Op::Checkpoint(op) => checkpoint::backward(op, dy, grads)?,
        Op::ScopeMarker { blocks } => scope::marker_backward(&blocks, dy)?,
    })
}
