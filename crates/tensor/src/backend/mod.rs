//! The backend boundary: every kernel the engine runs goes through the [`Backend`] trait. Ops
//! and autodiff build on it and never call CPU code directly, so a CUDA backend can be added
//! behind the same trait later. Kernels write into output storage the caller has already taken
//! from the allocator, so allocation (and therefore accounting) stays above the backend.
//!
//! Two backends exist: `cpu` (real host memory) and `shape_only` (a device without bytes: every
//! kernel is a no-op, so a forward/backward on it measures exact allocator traffic for a dry run).
//!
//! Not for: shape checks or broadcasting rules (the ops layer resolves those before calling in).

pub mod cpu;
pub mod shape_only;
pub mod work;

use crate::dtype::DType;
use crate::error::Result;
use crate::shape::Layout;
use headroom_memory::{Device, DeviceBuffer};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// A kernel input: a read-locked buffer seen through a layout.
#[derive(Debug)]
pub struct Src<'a> {
    pub buf: RwLockReadGuard<'a, DeviceBuffer>,
    pub dtype: DType,
    pub layout: &'a Layout,
}

/// A kernel output: a write-locked buffer seen through a layout (contiguous unless stated).
#[derive(Debug)]
pub struct Dst<'a> {
    pub buf: RwLockWriteGuard<'a, DeviceBuffer>,
    pub dtype: DType,
    pub layout: &'a Layout,
}

/// Element-wise functions of one input. Their derivatives are `BinaryOp::UnaryGrad`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Tanh,
    Sigmoid,
    Relu,
    /// GELU, tanh approximation (GPT-2's `gelu_new`).
    Gelu,
    Silu,
    /// `x * mul + add`.
    Affine {
        mul: f32,
        add: f32,
    },
    /// `x ^ p`.
    Powf(f32),
}

impl UnaryOp {
    /// Whether the derivative is computed from the op's output (`true`) or its input.
    pub fn grad_from_output(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp | UnaryOp::Sqrt | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Relu
        )
    }

    /// Whether the derivative needs any saved tensor at all.
    pub fn grad_needs_saved(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Affine { .. })
    }
}

/// Element-wise functions of two same-shaped inputs (the ops layer broadcasts by layout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// 1.0 where `a == b`, else 0.0.
    Eq,
    /// The derivative of a unary op: `a` is its saved input or output, `b` the incoming gradient.
    UnaryGrad(UnaryOp),
    /// `silu(a) · b`, with `silu(a)` rounded to the storage dtype before the product: the bits
    /// of `Silu` then `Mul`, in one pass and without the intermediate tensor (SwiGLU's).
    SiluMul,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
}

/// The kernels of a device. All float arithmetic is in f32; 16-bit storage is widened on load.
pub trait Backend: std::fmt::Debug + Send + Sync {
    fn name(&self) -> &'static str;

    /// Sets every element of `dst` to `value`.
    fn fill(&self, dst: &mut Dst, value: f32) -> Result<()>;
    /// Strided copy, converting between float dtypes; `dst` may be strided.
    fn copy(&self, src: &Src, dst: &mut Dst) -> Result<()>;
    /// `dst += src` (same shape; used to accumulate gradients in place).
    fn add_assign(&self, dst: &mut Dst, src: &Src) -> Result<()>;
    fn upload_f32(&self, data: &[f32], dst: &mut Dst) -> Result<()>;
    fn upload_i64(&self, data: &[i64], dst: &mut Dst) -> Result<()>;
    fn download_f32(&self, src: &Src) -> Result<Vec<f32>>;
    fn download_i64(&self, src: &Src) -> Result<Vec<i64>>;

    fn unary(&self, op: UnaryOp, x: &Src, dst: &mut Dst) -> Result<()>;
    fn binary(&self, op: BinaryOp, a: &Src, b: &Src, dst: &mut Dst) -> Result<()>;
    /// GELU's backward from its contiguous input `x`, in place: `grad` holds `dy` on entry and
    /// `dx` on return; also writes GELU's output `y` (recomputed, the bits of `unary(Gelu)`).
    /// One pass and no third buffer for an op that saves only x.
    fn gelu_backward_with_output(&self, x: &Src, grad: &mut Dst, y: &mut Dst) -> Result<()>;
    /// Reduces `axes` of `x` into `dst`, whose shape is `x`'s with those axes set to 1.
    fn reduce(&self, op: ReduceOp, x: &Src, axes: &[usize], dst: &mut Dst) -> Result<()>;
    /// `(…, M, K) @ (…, K, N) -> (…, M, N)`; batch dims already broadcast to `dst`'s.
    fn matmul(&self, a: &Src, b: &Src, dst: &mut Dst) -> Result<()>;
    /// [`Backend::matmul`] on square `T × T` matrices of causal attention, allowed to skip
    /// the products a causal mask makes moot (see [`CausalProduct`]). Under the kind's
    /// precondition the result equals the full product's, to rounding, wherever it is
    /// specified; the default runs the full product.
    fn matmul_causal(&self, a: &Src, b: &Src, dst: &mut Dst, kind: CausalProduct) -> Result<()> {
        let _ = kind;
        self.matmul(a, b, dst)
    }
    /// `(M, K) @ (K, N) + bias (N)`, the bias added to every row: a linear layer's forward in
    /// one pass over the output, with the bits of the two ops (the product rounded to the
    /// dtype, then the sum rounded again).
    fn matmul_bias(&self, a: &Src, b: &Src, bias: &Src, dst: &mut Dst) -> Result<()>;

    /// Row-wise (last axis) softmax or log-softmax of a contiguous input.
    fn softmax(&self, x: &Src, log: bool, dst: &mut Dst) -> Result<()>;
    /// Gradient of softmax (`log == false`) or log-softmax from its output `y` and `dy`.
    fn softmax_backward(&self, y: &Src, dy: &Src, log: bool, dst: &mut Dst) -> Result<()>;
    /// `softmax(mask(x · scale))` over the last axis of `(…, Tq, Tk)` scores, row `i` keeping
    /// columns `0..=i`, or with a sliding `window` of w the last w of them (the masked outputs
    /// are 0): the bits of scale, mask and softmax.
    fn causal_softmax(
        &self,
        x: &Src,
        scale: f32,
        window: Option<usize>,
        dst: &mut Dst,
    ) -> Result<()>;
    /// Its gradient from the output `y` and `dy`: `scale · mask(softmax'(y, dy))`.
    fn causal_softmax_backward(
        &self,
        y: &Src,
        dy: &Src,
        scale: f32,
        window: Option<usize>,
        dst: &mut Dst,
    ) -> Result<()>;
    /// Layer norm over the last axis; writes `y` and the f32 row statistics `mean`, `rstd`.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm(
        &self,
        x: &Src,
        w: &Src,
        b: &Src,
        eps: f32,
        y: &mut Dst,
        mean: &mut Dst,
        rstd: &mut Dst,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_backward(
        &self,
        x: &Src,
        w: &Src,
        mean: &Src,
        rstd: &Src,
        dy: &Src,
        dx: &mut Dst,
        dw: &mut Dst,
        db: &mut Dst,
    ) -> Result<()>;
    /// RMS norm over the last axis; writes `y` and the f32 row statistic `rstd`.
    fn rms_norm(&self, x: &Src, w: &Src, eps: f32, y: &mut Dst, rstd: &mut Dst) -> Result<()>;
    fn rms_norm_backward(
        &self,
        x: &Src,
        w: &Src,
        rstd: &Src,
        dy: &Src,
        dx: &mut Dst,
        dw: &mut Dst,
    ) -> Result<()>;

    /// Rotary position embedding of a contiguous `(…, T, H, D)` input (D even) by the f32
    /// `(T, D/2)` tables `cos` and `sin` ("rotate half" pairs `(i, i + D/2)`); `inverse`
    /// rotates by the negated angles (the gradient).
    fn rope(&self, x: &Src, cos: &Src, sin: &Src, inverse: bool, dst: &mut Dst) -> Result<()>;

    /// `dst[n, :] = table[ids[n], :]`.
    fn embedding(&self, table: &Src, ids: &Src, dst: &mut Dst) -> Result<()>;
    /// `dtable = 0; dtable[ids[n], :] += dy[n, :]` in order of `n` (deterministic).
    fn embedding_backward(&self, ids: &Src, dy: &Src, dtable: &mut Dst) -> Result<()>;
    /// `dst[n] = x[n, idx[n]]` for a contiguous `(N, V)` input.
    fn gather_last(&self, x: &Src, idx: &Src, dst: &mut Dst) -> Result<()>;
    /// `dst = 0; dst[n, idx[n]] = dy[n]`.
    fn scatter_last(&self, idx: &Src, dy: &Src, dst: &mut Dst) -> Result<()>;
    /// `dst = x * keep / (1 - p)`, `keep` drawn from the counter-based generator at
    /// `(seed, offset + linear index)`; the same call on a gradient applies the same mask.
    fn dropout(&self, x: &Src, p: f32, seed: u64, offset: u64, dst: &mut Dst) -> Result<()>;
    /// `dst[…, i, j] = if j > i { fill } else { x[…, i, j] }` over the last two axes.
    fn causal_mask(&self, x: &Src, fill: f32, dst: &mut Dst) -> Result<()>;

    /// Fused attention on `(B, H, T, D)` views with unit stride along D (k and v may have
    /// fewer heads, `Hkv` dividing `H`: grouped-query attention): writes the output `o` (q's
    /// shape, any such strides) and the f32 row log-sum-exp `lse` `(B, H, T)`, never a T×T
    /// buffer (see `cpu::attention`).
    fn attention(
        &self,
        q: &Src,
        k: &Src,
        v: &Src,
        spec: &AttentionSpec,
        o: &mut Dst,
        lse: &mut Dst,
    ) -> Result<()>;
    /// Backward of [`Backend::attention`] from its saved inputs, output and `lse`, recomputing
    /// the score tiles; writes contiguous `dq`, `dk`, `dv` (those that are `Some`).
    fn attention_backward(
        &self,
        saved: [&Src; 5],
        d_o: &Src,
        spec: &AttentionSpec,
        dq: Option<&mut Dst>,
        dk: Option<&mut Dst>,
        dv: Option<&mut Dst>,
    ) -> Result<()>;
}

/// What a fused attention computes: `softmax(mask(q kᵀ · scale)) v`, with dropout on the
/// probabilities drawn from the counter-based generator at `offset + ((b·H + h)·T + i)·T + j`
/// (the index the same dropout on a materialised `(B, H, T, T)` tensor would use).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub causal: bool,
    /// With `causal`, a sliding window (Mistral's): query `i` attends to keys
    /// `i + 1 − w ..= i` only.
    pub window: Option<usize>,
    pub scale: f32,
    /// `(p, seed, offset)` when dropout is on (`0 < p < 1`).
    pub dropout: Option<(f32, u64, u64)>,
}

/// A product of causal attention whose `T × T` operand or result is triangular, so that a
/// kernel may skip the blocks that are zero or unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CausalProduct {
    /// `dst (…, T, T) = a (…, T, K) @ b (…, K, T)` of which only the lower triangle (`j ≤ i`)
    /// is used: the entries above the diagonal are unspecified (the scores that a causal
    /// softmax, which reads only `j ≤ i`, is about to mask).
    LowerOut,
    /// `dst (…, T, N) = a (…, T, T) @ b (…, T, N)` with `a` zero above its diagonal (causal
    /// probabilities or their gradient).
    LowerLeft,
    /// `dst (…, T, N) = a (…, T, T) @ b (…, T, N)` with `a` zero below its diagonal (the
    /// transpose of a `LowerLeft` operand).
    UpperLeft,
}

/// The backend that runs kernels for `device`.
pub fn backend_for(device: &Device) -> &'static dyn Backend {
    if device.is_backed() {
        &cpu::CpuBackend
    } else {
        &shape_only::ShapeOnlyBackend
    }
}
