//! Materialised causal attention as one op: `softmax(mask(q kᵀ·scale)) v` that keeps the
//! `(B, H, T, T)` probabilities for backward, as the composition `matmul → causal_softmax →
//! dropout → matmul` does: the same tensors are saved (naive attention's memory, which the
//! planner models after PyTorch's), and the scores are freed as soon as the softmax has read
//! them. What changes is the work: every product is told which triangle the causal mask makes
//! moot (`Backend::matmul_causal`), about 5/8 of the full products at a sequence of 256 on the
//! CPU. Outputs and gradients are the composition's bit for bit up to 512 positions and to
//! rounding beyond (see `backend::cpu::matmul_causal`). Under autocast it is the composition
//! itself, whose softmax PyTorch runs in f32.
//!
//! Grouped-query heads (`Hkv < H`) are read in place: query head `h = kv·G + j` is batch
//! `(kv, j)` of `(B, Hkv, G, T, ·)` views, and each key/value head is broadcast over its group,
//! as `repeat_interleave` would lay it out, without the copy.
//!
//! Not for: attention that never materialises the scores (see `attention`).

use crate::autocast::autocast_dtype;
use crate::backend::CausalProduct;
use crate::backprop::Op;
use crate::error::{Result, TensorError};
use crate::ops::nn::{causal_softmax_backward, dropout_with};
use crate::ops::{float_only, same_dtype};
use crate::rng;
use crate::shape::Layout;
use crate::tape::record;
use crate::tensor::Tensor;

/// What backward needs beyond q, k, v: the probabilities, and with dropout its draw and the
/// dropped probabilities the second product read.
pub(crate) struct Saved {
    pub p: Tensor,
    pub dropout: Option<(f32, u64, u64, Tensor)>,
    pub scale: f32,
    pub window: Option<usize>,
}

impl Tensor {
    /// Causal attention of queries `q` `(B, H, T, D)` over keys `k` and values `v`
    /// `(B, Hkv, T, D)` (`Hkv` divides `H`) with the scores and probabilities materialised:
    /// `softmax(mask(q kᵀ·scale)) v`, query `i` seeing keys `0..=i` (the last `w` of them with
    /// a sliding `window` of `w`), dropout of `dropout_p` on the probabilities. The output is
    /// `(B, H, T, D)`; up to 512 positions its bits are those of
    /// `q.matmul(kᵀ).causal_softmax_window(scale, window).dropout(p).matmul(v)` with each
    /// key/value head repeated for its group, and it saves what that composition saves but
    /// the repeated keys and values (it reads the shared heads in place).
    pub fn causal_attention_materialized(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<usize>,
        scale: f32,
        dropout_p: f32,
    ) -> Result<Tensor> {
        let (b, h, t, d, kv) = check(q, k, v)?;
        if window == Some(0) {
            return Err(TensorError::invalid(
                "causal_attention_materialized",
                "a sliding window must keep at least one key (got 0)",
            ));
        }
        if !(0.0..1.0).contains(&dropout_p) {
            return Err(TensorError::invalid(
                "causal_attention_materialized",
                format!("dropout_p must be in [0, 1), got {dropout_p}"),
            ));
        }
        if autocast_dtype().is_some() {
            return composition(q, k, v, window, scale, dropout_p);
        }
        let g = h / kv;
        let (qg, kg, vg) = (grouped(q, kv), shared(k, g), shared(v, g));
        let (device, dtype, backend) = (q.device(), q.dtype(), q.backend());
        let scores = Tensor::empty(&device, &[b, kv, g, t, t], dtype, "matmul")?;
        backend.matmul_causal(
            &qg.src(),
            &kg.transpose(-2, -1)?.src(),
            &mut scores.dst(),
            CausalProduct::LowerOut,
        )?;
        let p = Tensor::empty(&device, &[b, kv, g, t, t], dtype, "softmax")?;
        backend.causal_softmax(&scores.src(), scale, window, &mut p.dst())?;
        drop(scores);
        let dropout = (dropout_p > 0.0)
            .then(|| -> Result<_> {
                let at = rng::advance(p.numel() as u64);
                let dropped = dropout_with(&p, dropout_p, at.seed, at.offset)?;
                Ok((dropout_p, at.seed, at.offset, dropped))
            })
            .transpose()?;
        let att = dropout.as_ref().map_or(&p, |x| &x.3);
        let out = Tensor::empty(&device, &[b, kv, g, t, d], dtype, "matmul")?;
        backend.matmul_causal(
            &att.src(),
            &vg.src(),
            &mut out.dst(),
            CausalProduct::LowerLeft,
        )?;
        let out = out.reshape(&[b, h, t, d])?;
        Ok(record(out, &[q, k, v], || Op::CausalAttention {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            saved: Saved {
                p,
                dropout,
                scale,
                window,
            },
        }))
    }
}

/// `(B, H, T, D, Hkv)` after checking shapes and dtypes.
fn check(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(usize, usize, usize, usize, usize)> {
    float_only("causal_attention_materialized", q)?;
    same_dtype("causal_attention_materialized", q, k)?;
    same_dtype("causal_attention_materialized", q, v)?;
    let (qs, ks) = (q.shape(), k.shape());
    let grouped = qs.len() == 4
        && ks.len() == 4
        && ks[1] > 0
        && qs[1].is_multiple_of(ks[1])
        && [0, 2, 3].iter().all(|&a| qs[a] == ks[a]);
    if !grouped || v.shape() != ks {
        return Err(TensorError::ShapeMismatch {
            op: "causal_attention_materialized",
            lhs: qs.to_vec(),
            rhs: if grouped { v.shape() } else { ks }.to_vec(),
        });
    }
    Ok((qs[0], qs[1], qs[2], qs[3], ks[1]))
}

/// The op as its composition of recorded ops, which autocast lowers one by one: query head
/// `h = kv·G + j` is batch `(kv, j)` of `(B, Hkv, G, T, D)` and each key/value head
/// `(B, Hkv, 1, T, D)` is broadcast over its group by the batched product.
fn composition(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
    scale: f32,
    dropout_p: f32,
) -> Result<Tensor> {
    let [b, h, t, d] = [0, 1, 2, 3].map(|a| q.shape()[a]);
    let kv = k.shape()[1];
    if kv == h {
        let att = q
            .matmul(&k.transpose(-2, -1)?)?
            .causal_softmax_window(scale, window)?
            .dropout(dropout_p)?;
        return att.matmul(v);
    }
    let g = h / kv;
    // From (B, T, n, D) order, as the heads come out of their projection.
    let q = q
        .transpose(1, 2)?
        .reshape(&[b, t, kv, g, d])?
        .permute(&[0, 2, 3, 1, 4])?;
    let one =
        |x: &Tensor, perm: &[usize]| x.transpose(1, 2)?.reshape(&[b, t, kv, 1, d])?.permute(perm);
    let kt = one(k, &[0, 2, 3, 4, 1])?; // (B, Hkv, 1, D, T)
    let v = one(v, &[0, 2, 3, 1, 4])?; // (B, Hkv, 1, T, D)
    let att = q
        .matmul(&kt)?
        .reshape(&[b, h, t, t])?
        .causal_softmax_window(scale, window)?
        .dropout(dropout_p)?
        .reshape(&[b, kv, g, t, t])?;
    att.matmul(&v)?.reshape(&[b, h, t, d])
}

/// Queries `x` `(B, H, T, D)` as an untracked `(B, Hkv, G, T, D)` view: heads split into their
/// groups of `G = H / Hkv`.
fn grouped(x: &Tensor, kv: usize) -> Tensor {
    let (s, st) = (x.shape(), x.layout().strides());
    let g = s[1] / kv;
    x.detach().with_layout(Layout::new(
        vec![s[0], kv, g, s[2], s[3]],
        vec![st[0], st[1] * g, st[1], st[2], st[3]],
        x.layout().offset(),
    ))
}

/// Keys or values `x` `(B, Hkv, T, D)` as an untracked `(B, Hkv, G, T, D)` view, each head
/// repeated over its group of `g` query heads by a zero stride.
fn shared(x: &Tensor, g: usize) -> Tensor {
    let (s, st) = (x.shape(), x.layout().strides());
    x.detach().with_layout(Layout::new(
        vec![s[0], s[1], g, s[2], s[3]],
        vec![st[0], st[1], 0, st[2], st[3]],
        x.layout().offset(),
    ))
}

/// The gradients of q, k and v (those `want`ed) from the output's `dy`.
pub(crate) fn causal_attention_backward(
    [q, k, v]: [&Tensor; 3],
    saved: &Saved,
    dy: &Tensor,
    want: [bool; 3],
) -> Result<Vec<Option<Tensor>>> {
    let (b, h, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let kv = k.shape()[1];
    let g = h / kv;
    let (device, dtype, backend) = (q.device(), q.dtype(), q.backend());
    let dyg = grouped(dy, kv);
    let product = |a: &Tensor, x: &Tensor, n: usize, kind, name| -> Result<Tensor> {
        let out = Tensor::empty(&device, &[b, kv, g, t, n], dtype, name)?;
        backend.matmul_causal(&a.src(), &x.src(), &mut out.dst(), kind)?;
        Ok(out)
    };
    // A key/value head's gradient sums its group's.
    let per_kv_head =
        |x: Tensor| -> Result<Tensor> { x.sum_to(&[b, kv, 1, t, d])?.reshape(&[b, kv, t, d]) };
    let att = saved.dropout.as_ref().map_or(&saved.p, |x| &x.3);
    let dv = want[2]
        .then(|| {
            let dv = product(
                &att.transpose(-2, -1)?,
                &dyg,
                d,
                CausalProduct::UpperLeft,
                "matmul",
            )?;
            per_kv_head(dv)
        })
        .transpose()?;
    if !want[0] && !want[1] {
        return Ok(vec![None, None, dv]);
    }
    let vt = shared(v, g).transpose(-2, -1)?;
    let dp = match saved.dropout {
        Some((p, seed, offset, _)) => {
            // Dropout's rule reads every entry, so the product is taken in full here.
            let datt = Tensor::empty(&device, &[b, kv, g, t, t], dtype, "matmul")?;
            backend.matmul(&dyg.src(), &vt.src(), &mut datt.dst())?;
            dropout_with(&datt, p, seed, offset)?
        }
        None => product(&dyg, &vt, t, CausalProduct::LowerOut, "matmul")?,
    };
    let ds = causal_softmax_backward(&saved.p, &dp, saved.scale, saved.window)?;
    drop(dp);
    let dq = want[0]
        .then(|| {
            product(&ds, &shared(k, g), d, CausalProduct::LowerLeft, "matmul")?
                .reshape(&[b, h, t, d])
        })
        .transpose()?;
    let dk = want[1]
        .then(|| {
            let dk = product(
                &ds.transpose(-2, -1)?,
                &grouped(q, kv),
                d,
                CausalProduct::UpperLeft,
                "matmul",
            )?;
            per_kv_head(dk)
        })
        .transpose()?;
    Ok(vec![dq, dk, dv])
}
