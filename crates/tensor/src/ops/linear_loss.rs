//! The output projection and its cross-entropy, `mean CE(x · W, targets)`, plain or chunked.
//!
//! Plain, the logits of every token (`N × V`, cast to f32 for the loss) exist at once, and the
//! log-softmax keeps its `N × V` output for backward. Chunked (the idea of torchtune's
//! `CEWithChunkedOutputLoss` and Liger's fused linear cross-entropy), the rows are cut into
//! `chunks` pieces of ⌈N / chunks⌉ tokens; each piece's projection and loss run inside a
//! checkpoint scope, so forward keeps only the inputs (`x`, `W`, the targets) and the per-token
//! losses, and backward recomputes one piece's logits at a time. The price is the projection
//! computed once more in backward: 2·N·C·V more FLOPs.
//!
//! Numerics: every token's loss comes from the same row kernels as the plain path and the mean
//! runs over the same `(N,)` vector in the same order, so the loss is bitwise the plain one
//! whenever the GEMM gives a row the same value in a piece as in the whole (true of the CPU
//! kernels here). The input gradient is bitwise the plain one likewise; the weight gradient sums
//! the pieces' contributions chunk by chunk instead of in one GEMM over all N rows, so it equals
//! the plain one within float rounding, not bitwise.
//!
//! Not for: choosing the number of chunks (the strategy's `--loss`).

use crate::checkpoint::checkpoint;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tensor::Tensor;

impl Tensor {
    /// Mean cross-entropy of the projection `self · w` (`self`: `(…, C)`, `w`: `(C, V)`)
    /// against integer targets of shape `(…)`, computed in f32 whatever the compute dtype. With
    /// `chunks` ≤ 1 the logits are materialised whole; with more, one chunk of rows at a time
    /// (see the module header).
    pub fn linear_cross_entropy(
        &self,
        w: &Tensor,
        targets: &Tensor,
        chunks: usize,
    ) -> Result<Tensor> {
        if chunks <= 1 {
            return self.matmul(w)?.cast(DType::F32)?.cross_entropy(targets);
        }
        let c = *self.shape().last().ok_or_else(|| {
            TensorError::invalid("linear_cross_entropy", "needs at least one axis")
        })?;
        let n = self.numel() / c.max(1);
        if targets.shape() != &self.shape()[..self.rank() - 1] {
            return Err(TensorError::ShapeMismatch {
                op: "linear_cross_entropy",
                lhs: self.shape().to_vec(),
                rhs: targets.shape().to_vec(),
            });
        }
        let (x, t) = (self.reshape(&[n, c])?, targets.reshape(&[n])?);
        let rows = n.div_ceil(chunks).max(1);
        let mut picked = Vec::with_capacity(chunks);
        let mut start = 0;
        while start < n {
            let len = rows.min(n - start);
            let (xk, tk) = (x.narrow(0, start, len)?, t.narrow(0, start, len)?);
            picked.push(checkpoint(&[&xk, w, &tk], |i| {
                let logits = i[0].matmul(&i[1])?.cast(DType::F32)?; // (len, V)
                logits.log_softmax()?.gather_last(&i[2])
            })?);
            start += len;
        }
        let refs: Vec<&Tensor> = picked.iter().collect();
        Tensor::cat(&refs, 0)?.mean_all()?.neg()
    }
}
