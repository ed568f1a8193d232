//! Neural-network ops: softmax and log-softmax, layer norm and RMS norm, embedding lookup,
//! dropout on the counter-based generator, the causal mask and cross-entropy with integer
//! targets. Each forward sits next to the kernel call its backward rule (in `backprop`) uses.
//!
//! Not for: modules with parameters (the nn crate builds those on these ops).

use crate::autocast;
use crate::backprop::Op;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::ops::{float_only, index_dtype, out_like, same_dtype};
use crate::rng;
use crate::tape::record;
use crate::tensor::Tensor;

/// `(rows, last)` of a tensor treated as a batch of rows over its last axis.
fn rows(op: &'static str, x: &Tensor) -> Result<(usize, usize)> {
    let c = *x
        .shape()
        .last()
        .ok_or_else(|| TensorError::invalid(op, "needs at least one axis"))?;
    Ok((x.numel() / c.max(1), c))
}

fn check_weight(op: &'static str, x: &Tensor, w: &Tensor, c: usize) -> Result<()> {
    same_dtype(op, x, w)?;
    if w.shape() != [c] {
        return Err(TensorError::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: w.shape().to_vec(),
        });
    }
    Ok(())
}

impl Tensor {
    fn softmax_impl(&self, log: bool) -> Result<Tensor> {
        if let Some(f) = autocast::fp32_all(&[self])? {
            return f[0].softmax_impl(log);
        }
        float_only("softmax", self)?;
        let x = self.contiguous()?;
        let y = out_like(&x, if log { "log_softmax" } else { "softmax" })?;
        x.backend().softmax(&x.src(), log, &mut y.dst())?;
        let saved = y.detach();
        Ok(record(y, &[&x], || Op::Softmax { y: saved, log }))
    }

    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Tensor> {
        self.softmax_impl(false)
    }

    /// Log-softmax over the last axis.
    pub fn log_softmax(&self) -> Result<Tensor> {
        self.softmax_impl(true)
    }

    /// Layer norm over the last axis with weight and bias of shape `(C,)`.
    pub fn layer_norm(&self, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
        if let Some(f) = autocast::fp32_all(&[self, w, b])? {
            return f[0].layer_norm(&f[1], &f[2], eps);
        }
        float_only("layer_norm", self)?;
        let x = self.contiguous()?;
        let (n, c) = rows("layer_norm", &x)?;
        check_weight("layer_norm", &x, w, c)?;
        check_weight("layer_norm", &x, b, c)?;
        let (w, b) = (w.contiguous()?, b.contiguous()?);
        let y = out_like(&x, "layer_norm")?;
        let mean = Tensor::empty(&x.device(), &[n], DType::F32, "layer_norm.mean")?; // (N,)
        let rstd = Tensor::empty(&x.device(), &[n], DType::F32, "layer_norm.rstd")?; // (N,)
        x.backend().layer_norm(
            &x.src(),
            &w.src(),
            &b.src(),
            eps,
            &mut y.dst(),
            &mut mean.dst(),
            &mut rstd.dst(),
        )?;
        Ok(record(y, &[&x, &w, &b], || Op::LayerNorm {
            x: x.clone(),
            w: w.clone(),
            mean,
            rstd,
        }))
    }

    /// RMS norm over the last axis with weight of shape `(C,)`.
    pub fn rms_norm(&self, w: &Tensor, eps: f32) -> Result<Tensor> {
        if let Some(f) = autocast::fp32_all(&[self, w])? {
            return f[0].rms_norm(&f[1], eps);
        }
        float_only("rms_norm", self)?;
        let x = self.contiguous()?;
        let (n, c) = rows("rms_norm", &x)?;
        check_weight("rms_norm", &x, w, c)?;
        let w = w.contiguous()?;
        let y = out_like(&x, "rms_norm")?;
        let rstd = Tensor::empty(&x.device(), &[n], DType::F32, "rms_norm.rstd")?; // (N,)
        x.backend()
            .rms_norm(&x.src(), &w.src(), eps, &mut y.dst(), &mut rstd.dst())?;
        Ok(record(y, &[&x, &w], || Op::RmsNorm {
            x: x.clone(),
            w: w.clone(),
            rstd,
        }))
    }

    /// Rows of this `(V, C)` table picked by integer `ids` of any shape: `ids.shape + (C,)`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        float_only("embedding", self)?;
        index_dtype("embedding", ids)?;
        if self.rank() != 2 {
            return Err(TensorError::invalid(
                "embedding",
                format!("the table must be (V, C), got {:?}", self.shape()),
            ));
        }
        let (table, ids) = (self.contiguous()?, ids.contiguous()?);
        let mut shape = ids.shape().to_vec();
        shape.push(table.shape()[1]);
        let out = Tensor::empty(&table.device(), &shape, table.dtype(), "embedding")?;
        table
            .backend()
            .embedding(&table.src(), &ids.src(), &mut out.dst())?;
        let vocab = table.shape()[0];
        Ok(record(out, &[&table, &ids], || Op::Embedding {
            ids: ids.clone(),
            vocab,
        }))
    }

    /// Dropout with drop probability `p`, mask drawn from the thread's counter-based stream.
    pub fn dropout(&self, p: f32) -> Result<Tensor> {
        float_only("dropout", self)?;
        if !(0.0..1.0).contains(&p) {
            return Err(TensorError::invalid(
                "dropout",
                format!("p must be in [0, 1), got {p}"),
            ));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let at = rng::advance(self.numel() as u64);
        let out = dropout_with(self, p, at.seed, at.offset)?;
        Ok(record(out, &[self], || Op::Dropout {
            p,
            seed: at.seed,
            offset: at.offset,
        }))
    }

    /// Sets positions above the diagonal of the last two axes (future keys) to −∞.
    pub fn causal_mask(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(TensorError::invalid(
                "causal_mask",
                "needs at least two axes (…, T, T)",
            ));
        }
        let out = causal_fill(self, f32::NEG_INFINITY)?;
        Ok(record(out, &[self], || Op::CausalMask))
    }

    /// `softmax(causal_mask(self · scale))` over the last axis as one op, with the bits of the
    /// three: attention probabilities from raw `(…, T, T)` scores, computing only the kept
    /// (past) half and keeping only the output for backward, where the three would also
    /// allocate the scaled and the masked scores. Under autocast with 16-bit scores it is the
    /// composition (softmax then runs in f32).
    pub fn causal_softmax(&self, scale: f32) -> Result<Tensor> {
        self.causal_softmax_window(scale, None)
    }

    /// [`Tensor::causal_softmax`] with a sliding window (Mistral's attention): row `i` of each
    /// `(Tq, Tk)` matrix keeps columns `i + 1 − w ..= i` only. `None` is the plain causal mask.
    /// Under autocast with 16-bit scores the scaled scores are rounded to their dtype, as the
    /// composition stores them, and the windowed softmax runs in f32.
    pub fn causal_softmax_window(&self, scale: f32, window: Option<usize>) -> Result<Tensor> {
        if window == Some(0) {
            return Err(TensorError::invalid(
                "causal_softmax",
                "a sliding window must keep at least one key (got 0)",
            ));
        }
        if autocast::autocast_dtype().is_some() && matches!(self.dtype(), DType::BF16 | DType::F16)
        {
            return match window {
                None => self.scale(scale)?.causal_mask()?.softmax(),
                Some(_) => self
                    .scale(scale)?
                    .cast(DType::F32)?
                    .causal_softmax_window(1.0, window),
            };
        }
        if self.rank() < 2 {
            return Err(TensorError::invalid(
                "causal_softmax",
                "needs at least two axes (…, T, T)",
            ));
        }
        float_only("causal_softmax", self)?;
        let x = self.contiguous()?;
        let y = out_like(&x, "softmax")?;
        x.backend()
            .causal_softmax(&x.src(), scale, window, &mut y.dst())?;
        let saved = y.detach();
        Ok(record(y, &[&x], || Op::CausalSoftmax {
            y: saved,
            scale,
            window,
        }))
    }

    /// Mean cross-entropy of `(…, V)` logits against integer targets of shape `(…)`:
    /// −mean(log_softmax(logits)[target]).
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        if let Some(f) = autocast::fp32_all(&[self])? {
            return f[0].cross_entropy(targets);
        }
        index_dtype("cross_entropy", targets)?;
        let (n, v) = rows("cross_entropy", self)?;
        if targets.numel() != n || targets.shape() != &self.shape()[..self.rank() - 1] {
            return Err(TensorError::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        let logp = self.log_softmax()?.reshape(&[n, v])?; // (N, V)
        let picked = logp.gather_last(&targets.reshape(&[n])?)?; // (N,)
        picked.mean_all()?.neg()
    }

    /// `out[n] = self[n, idx[n]]` for a `(N, V)` tensor.
    pub fn gather_last(&self, idx: &Tensor) -> Result<Tensor> {
        index_dtype("gather_last", idx)?;
        let (n, _) = rows("gather_last", self)?;
        if self.rank() != 2 || idx.shape() != [n] {
            return Err(TensorError::ShapeMismatch {
                op: "gather_last",
                lhs: self.shape().to_vec(),
                rhs: idx.shape().to_vec(),
            });
        }
        let (x, idx) = (self.contiguous()?, idx.contiguous()?);
        let out = Tensor::empty(&x.device(), &[n], x.dtype(), "gather")?;
        x.backend()
            .gather_last(&x.src(), &idx.src(), &mut out.dst())?;
        Ok(record(out, &[&x, &idx], || Op::GatherLast {
            idx: idx.clone(),
            in_shape: x.shape().to_vec(),
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels shared by forward and the backward rules in `backprop` (never recorded).

pub(crate) fn dropout_with(x: &Tensor, p: f32, seed: u64, offset: u64) -> Result<Tensor> {
    let x = x.contiguous()?;
    let out = out_like(&x, "dropout")?;
    x.backend()
        .dropout(&x.src(), p, seed, offset, &mut out.dst())?;
    Ok(out)
}

pub(crate) fn causal_fill(x: &Tensor, fill: f32) -> Result<Tensor> {
    float_only("causal_mask", x)?;
    let x = x.contiguous()?;
    let out = out_like(&x, "causal_mask")?;
    x.backend().causal_mask(&x.src(), fill, &mut out.dst())?;
    Ok(out)
}

pub(crate) fn softmax_backward(y: &Tensor, dy: &Tensor, log: bool) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    let dx = out_like(y, "softmax.grad")?;
    y.backend()
        .softmax_backward(&y.src(), &dy.src(), log, &mut dx.dst())?;
    Ok(dx)
}

pub(crate) fn causal_softmax_backward(
    y: &Tensor,
    dy: &Tensor,
    scale: f32,
    window: Option<usize>,
) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    let dx = out_like(y, "softmax.grad")?;
    y.backend()
        .causal_softmax_backward(&y.src(), &dy.src(), scale, window, &mut dx.dst())?;
    Ok(dx)
}

pub(crate) fn layer_norm_backward(
    x: &Tensor,
    w: &Tensor,
    mean: &Tensor,
    rstd: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dy = dy.contiguous()?;
    let (dx, dw, db) = (
        out_like(x, "layer_norm.dx")?,
        out_like(w, "layer_norm.dw")?,
        out_like(w, "layer_norm.db")?,
    );
    x.backend().layer_norm_backward(
        &x.src(),
        &w.src(),
        &mean.src(),
        &rstd.src(),
        &dy.src(),
        &mut dx.dst(),
        &mut dw.dst(),
        &mut db.dst(),
    )?;
    Ok((dx, dw, db))
}

pub(crate) fn rms_norm_backward(
    x: &Tensor,
    w: &Tensor,
    rstd: &Tensor,
    dy: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let dy = dy.contiguous()?;
    let (dx, dw) = (out_like(x, "rms_norm.dx")?, out_like(w, "rms_norm.dw")?);
    x.backend().rms_norm_backward(
        &x.src(),
        &w.src(),
        &rstd.src(),
        &dy.src(),
        &mut dx.dst(),
        &mut dw.dst(),
    )?;
    Ok((dx, dw))
}

pub(crate) fn embedding_backward(ids: &Tensor, dy: &Tensor, vocab: usize) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    let c = *dy.shape().last().unwrap_or(&1);
    let dtable = Tensor::empty(&dy.device(), &[vocab, c], dy.dtype(), "embedding.grad")?;
    dy.backend()
        .embedding_backward(&ids.src(), &dy.src(), &mut dtable.dst())?;
    Ok(dtable)
}

pub(crate) fn scatter_last(idx: &Tensor, dy: &Tensor, in_shape: &[usize]) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    let dx = Tensor::empty(&dy.device(), in_shape, dy.dtype(), "gather.grad")?;
    dy.backend()
        .scatter_last(&idx.src(), &dy.src(), &mut dx.dst())?;
    Ok(dx)
}
