//! Fused, memory-efficient scaled dot-product attention: `softmax(mask(q kᵀ·scale)) v` on
//! `(B, H, T, D)` tensors in one op, the FlashAttention algorithm on the CPU backend (see
//! `backend::cpu::attention`). It saves for backward only q, k, v, the output and the f32 row
//! log-sum-exp `(B, H, T)`, where the composition `matmul → causal_mask → softmax → matmul`
//! keeps the `(B, H, T, T)` probabilities alive and allocates several more of that size.
//!
//! Not for: the kernel (see `backend::cpu::attention`) or masks other than causal (with an
//! optional sliding window).

use crate::autocast::autocast_dtype;
use crate::backend::AttentionSpec;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::{float_only, same_dtype};
use crate::rng;
use crate::tape::record;
use crate::tensor::Tensor;

impl Tensor {
    /// Causal (or full) attention of queries `q` `(B, H, T, D)` over keys `k` and values `v`
    /// `(B, Hkv, T, D)`, of one float dtype: `softmax(q kᵀ·scale, masked) v`. With `Hkv < H`
    /// (grouped-query attention; `Hkv` must divide `H`) query head `h` attends over key/value
    /// head `h / (H / Hkv)`, as if each key/value head were repeated for its group (PyTorch's
    /// `repeat_interleave` on the head axis), without the repeat. With dropout of
    /// probability `dropout_p` on the attention probabilities (mask from the thread's
    /// counter-based stream, drawn at the same indices as `dropout` on the materialised
    /// `(B, H, T, T)` probabilities would use). Computed in f32 with f32 accumulation; the
    /// output has the input dtype. Under autocast the inputs are lowered to the autocast dtype,
    /// as PyTorch's `scaled_dot_product_attention`.
    ///
    /// The output is a `(B, H, T, D)` view of `(B, T, H, D)` storage, so that merging the heads
    /// back into `(B, T, H·D)` (permute, then reshape) costs no copy.
    pub fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: f32,
        dropout_p: f32,
    ) -> Result<Tensor> {
        let mask = causal.then_some(None);
        Tensor::attention_masked(q, k, v, mask, scale, dropout_p)
    }

    /// [`Tensor::attention`] with its mask given as `None` (full), `Some(None)` (causal) or
    /// `Some(Some(w))`: causal with a sliding window of `w` keys (Mistral's), query `i` seeing
    /// keys `i + 1 − w ..= i`.
    pub fn attention_masked(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<Option<usize>>,
        scale: f32,
        dropout_p: f32,
    ) -> Result<Tensor> {
        if let Some(low) = autocast_dtype()
            && [q, k, v]
                .iter()
                .any(|t| t.dtype().is_float() && t.dtype() != low)
        {
            return Tensor::attention_masked(
                &q.cast(low)?,
                &k.cast(low)?,
                &v.cast(low)?,
                mask,
                scale,
                dropout_p,
            );
        }
        if mask == Some(Some(0)) {
            return Err(TensorError::invalid(
                "attention",
                "a sliding window must keep at least one key (got 0)",
            ));
        }
        float_only("attention", q)?;
        same_dtype("attention", q, k)?;
        same_dtype("attention", q, v)?;
        if q.rank() != 4 {
            return Err(TensorError::invalid(
                "attention",
                format!("q, k and v must be (B, H, T, D), got q {:?}", q.shape()),
            ));
        }
        let (qs, ks) = (q.shape(), k.shape());
        let grouped = ks.len() == 4
            && ks[1] > 0
            && qs[1].is_multiple_of(ks[1])
            && [0, 2, 3].iter().all(|&a| qs[a] == ks[a]);
        for (other, fits) in [(k, grouped), (v, v.shape() == ks)] {
            if !fits {
                return Err(TensorError::ShapeMismatch {
                    op: "attention",
                    lhs: q.shape().to_vec(),
                    rhs: other.shape().to_vec(),
                });
            }
        }
        if !scale.is_finite() {
            return Err(TensorError::invalid(
                "attention",
                format!("scale must be finite, got {scale}"),
            ));
        }
        if !(0.0..1.0).contains(&dropout_p) {
            return Err(TensorError::invalid(
                "attention",
                format!("dropout_p must be in [0, 1), got {dropout_p}"),
            ));
        }
        let (q, k, v) = (unit_last(q)?, unit_last(k)?, unit_last(v)?);
        let [b, h, t, d] = [0, 1, 2, 3].map(|i| q.shape()[i]);
        let dropout = (dropout_p > 0.0).then(|| {
            let at = rng::advance((b * h * t * t) as u64);
            (dropout_p, at.seed, at.offset)
        });
        let spec = AttentionSpec {
            causal: mask.is_some(),
            window: mask.flatten(),
            scale,
            dropout,
        };
        let device = q.device();
        let o = Tensor::empty(&device, &[b, t, h, d], q.dtype(), "attention")?; // (B, T, H, D)
        let o = o.with_layout(o.layout().permute(&[0, 2, 1, 3])?); // (B, H, T, D) view
        let lse = Tensor::empty(&device, &[b, h, t], DType::F32, "attention.lse")?; // (B, H, T)
        q.backend().attention(
            &q.src(),
            &k.src(),
            &v.src(),
            &spec,
            &mut o.dst(),
            &mut lse.dst(),
        )?;
        let saved = o.detach();
        Ok(record(o, &[&q, &k, &v], || {
            crate::backprop::Op::Attention {
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
                o: saved,
                lse,
                spec,
            }
        }))
    }
}

/// `x` itself when its last axis has unit stride (or length ≤ 1), else a contiguous copy.
fn unit_last(x: &Tensor) -> Result<Tensor> {
    if x.shape()[3] <= 1 || x.layout().strides()[3] == 1 {
        Ok(x.clone())
    } else {
        x.contiguous()
    }
}

/// The gradients of q, k and v (those `want`ed) from the saved tensors and the output's `dy`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    lse: &Tensor,
    dy: &Tensor,
    spec: AttentionSpec,
    want: [bool; 3],
) -> Result<Vec<Option<Tensor>>> {
    same_dtype("attention_backward", o, dy)?;
    if dy.shape() != o.shape() {
        return Err(TensorError::ShapeMismatch {
            op: "attention_backward",
            lhs: o.shape().to_vec(),
            rhs: dy.shape().to_vec(),
        });
    }
    let dy = unit_last(dy)?;
    let grads = [(want[0], q), (want[1], k), (want[2], v)]
        .map(|(w, x)| {
            w.then(|| Tensor::empty(&q.device(), x.shape(), q.dtype(), "attention.grad"))
                .transpose()
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    {
        let mut dsts: Vec<_> = grads.iter().map(|g| g.as_ref().map(|g| g.dst())).collect();
        let mut it = dsts.iter_mut().map(Option::as_mut);
        let (dq, dk, dv) = (
            it.next().flatten(),
            it.next().flatten(),
            it.next().flatten(),
        );
        q.backend().attention_backward(
            [&q.src(), &k.src(), &v.src(), &o.src(), &lse.src()],
            &dy.src(),
            &spec,
            dq,
            dk,
            dv,
        )?;
    }
    Ok(grads)
}
