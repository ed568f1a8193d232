//! Precision modes realised on tensors (docs/sources.md §2, §3): the dtype parameters, gradients and
//! activations use (the vocabulary's `Precision` says which, whether fp32 master weights —
//! tagged `master_weight` — back them, and whether the loss is scaled). 16-bit modes store
//! activations in 16 bits while every kernel accumulates in f32 (softmax, norms, reductions and
//! the loss are computed in f32; Micikevicius et al. §3.3); the loss itself is computed on f32
//! logits.
//!
//! Not for: the optimizer rules (see the nn crate).

use headroom_memory::Category;
use headroom_nn::grad::Grads;
use headroom_strategy::{NumberFormat, Precision};
use headroom_tensor::backend::cpu::convert_slice;
use headroom_tensor::{DType, Result, Tensor};

/// The tensor dtype of parameters, gradients and activations under `precision`.
pub fn compute_dtype(precision: Precision) -> DType {
    match precision.compute() {
        NumberFormat::F32 => DType::F32,
        NumberFormat::Bf16 => DType::BF16,
        NumberFormat::F16 => DType::F16,
    }
}

/// Runs `f` on a float tensor's elements as the matching [`Grads`] view.
pub fn with_grads<R>(t: &Tensor, f: impl FnOnce(Grads<'_>) -> R) -> Result<R> {
    match t.dtype() {
        DType::BF16 => t.with_slice::<half::bf16, _>(|g| f(Grads::Bf16(g))),
        DType::F16 => t.with_slice::<half::f16, _>(|g| f(Grads::F16(g))),
        _ => t.with_slice::<f32, _>(|g| f(Grads::F32(g))),
    }
}

/// Writes f32 `values` into the first elements of a float tensor of any dtype (round to
/// nearest even); values past its end are ignored.
pub fn store_f32(dst: &Tensor, values: &[f32]) -> Result<()> {
    store_f32_at(dst, 0, &values[..values.len().min(dst.numel())])
}

/// Writes f32 `values` into elements `start..start + values.len()` of a flat float tensor of
/// any dtype (round to nearest even, the bits of `half`'s conversion), in parallel.
pub fn store_f32_at(dst: &Tensor, start: usize, values: &[f32]) -> Result<()> {
    let end = start + values.len();
    match dst.dtype() {
        DType::BF16 => {
            dst.with_slice_mut::<half::bf16, _>(|d| convert_slice(values, &mut d[start..end]))
        }
        DType::F16 => {
            dst.with_slice_mut::<half::f16, _>(|d| convert_slice(values, &mut d[start..end]))
        }
        _ => dst.with_slice_mut::<f32, _>(|d| d[start..end].copy_from_slice(values)),
    }
}

/// An fp32 copy of a flat buffer in `category` (master weights, or a pure-bf16 step's scratch).
/// On a shape-only device (a dry run) it allocates the same bytes without reading any.
pub fn f32_copy(src: &Tensor, category: Category, name: &str) -> Result<Tensor> {
    if !src.device().is_backed() {
        return Tensor::zeros(&src.device(), src.shape(), DType::F32, category, Some(name));
    }
    let values = src.to_vec_f32()?;
    Tensor::from_f32(
        &src.device(),
        src.shape(),
        &values,
        DType::F32,
        category,
        Some(name),
    )
}

/// An fp32 copy of elements `range` of a flat buffer in `category` (a ZeRO shard's master
/// weights or scratch); on a shape-only device the same bytes without reading any.
pub fn f32_range_copy(
    src: &Tensor,
    range: std::ops::Range<usize>,
    category: Category,
    name: &str,
) -> Result<Tensor> {
    let shape = [range.len()];
    if !src.device().is_backed() {
        return Tensor::zeros(&src.device(), &shape, DType::F32, category, Some(name));
    }
    let values = src.to_vec_f32()?;
    Tensor::from_f32(
        &src.device(),
        &shape,
        &values[range],
        DType::F32,
        category,
        Some(name),
    )
}
