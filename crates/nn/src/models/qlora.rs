//! QLoRA's base on the GPT (Dettmers et al. 2023): each layer's four projections (`attn.qkv.w`,
//! `attn.proj.w`, `mlp.fc.w`, `mlp.proj.w`) stored as frozen NF4 weights
//! (`headroom_tensor::nf4`), the layer's norms and biases in a frozen flat block of the
//! parameter dtype, as bitsandbytes' `Linear4bit` keeps biases; embeddings and the head stay
//! in the parameter dtype. The values quantised are the plain model's for the same seed, drawn
//! on the host, so no full-precision copy of a layer ever takes device bytes.
//!
//! Not for: the adapters (`lora.rs`) or the NF4 format (the tensor crate).

use crate::init::{Init, block_values};
use headroom_memory::Device;
use headroom_tensor::{DType, Nf4Weight, ParamBlock, ParamSpec, Result, TensorError};
use std::sync::Arc;

/// The weights of a GPT block that QLoRA stores in NF4, in this order.
pub const QUANTIZED: [&str; 4] = ["attn.qkv.w", "attn.proj.w", "mlp.fc.w", "mlp.proj.w"];

/// The plain model's layout of `weights` (back to back, in order).
pub fn layout(weights: &[(&str, &[usize])]) -> Vec<ParamSpec> {
    let mut offset = 0;
    weights
        .iter()
        .map(|(name, shape)| {
            let spec = ParamSpec {
                name: name.to_string(),
                shape: shape.to_vec(),
                offset,
            };
            offset += shape.iter().product::<usize>();
            spec
        })
        .collect()
}

/// A frozen GPT layer with its projections in NF4: the flat block of the other weights and
/// the NF4 weights in [`QUANTIZED`] order, holding the values the plain model's block `bi`
/// starts with.
pub fn build(
    device: &Device,
    name: &str,
    bi: usize,
    weights: &[(&str, &[usize])],
    dtype: DType,
    seed: u64,
    rule: &impl Fn(&str) -> Init,
) -> Result<(ParamBlock, Vec<Arc<Nf4Weight>>)> {
    build_with(&QUANTIZED, device, name, bi, weights, dtype, seed, rule)
}

/// [`build`] with the weights named in `quantized` stored in NF4, in that order (a model's
/// own projections).
#[allow(clippy::too_many_arguments)]
pub fn build_with(
    quantized: &[&str],
    device: &Device,
    name: &str,
    bi: usize,
    weights: &[(&str, &[usize])],
    dtype: DType,
    seed: u64,
    rule: &impl Fn(&str) -> Init,
) -> Result<(ParamBlock, Vec<Arc<Nf4Weight>>)> {
    let full = layout(weights);
    let kept: Vec<(&str, &[usize])> = weights
        .iter()
        .copied()
        .filter(|(w, _)| !quantized.contains(w))
        .collect();
    let block = ParamBlock::frozen(device, name, &kept, dtype)?;
    let values = device
        .is_backed()
        .then(|| block_values(bi, &full, seed, rule));
    let slice = |spec: &ParamSpec| {
        values.as_ref().map(|v| {
            let n: usize = spec.shape.iter().product();
            &v[spec.offset..spec.offset + n]
        })
    };
    if values.is_some() {
        let plain: Vec<f32> = full
            .iter()
            .filter(|s| !quantized.contains(&s.name.as_str()))
            .flat_map(|s| slice(s).unwrap_or_default().iter().copied())
            .collect();
        block.set_values(&plain)?;
    }
    let nf4 = quantized
        .iter()
        .map(|q| {
            let spec = full.iter().find(|s| s.name == *q).ok_or_else(|| {
                TensorError::invalid("QLoRA", format!("block {name} has no weight {q}"))
            })?;
            let shape = [spec.shape[0], spec.shape[1]];
            Nf4Weight::new(device, &format!("{name}.{q}"), shape, slice(spec))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((block, nf4))
}

/// The plain layout's values of a quantised layer (the NF4 weights dequantised to f32), as
/// `layout(weights)` places them: the base a merged export folds the adapters into.
pub fn full_values(
    block: &ParamBlock,
    nf4: &[Arc<Nf4Weight>],
    weights: &[(&str, &[usize])],
) -> Result<Vec<f32>> {
    full_values_with(&QUANTIZED, block, nf4, weights)
}

/// [`full_values`] of a layer whose NF4 weights are those named in `quantized`.
pub fn full_values_with(
    quantized: &[&str],
    block: &ParamBlock,
    nf4: &[Arc<Nf4Weight>],
    weights: &[(&str, &[usize])],
) -> Result<Vec<f32>> {
    let kept = block.flat().to_vec_f32()?;
    let mut out = Vec::new();
    for (name, shape) in weights {
        let n: usize = shape.iter().product();
        match quantized.iter().position(|q| q == name) {
            Some(i) => {
                let bytes = nf4[i].bytes().ok_or_else(|| {
                    TensorError::invalid("QLoRA", "a dry run's weights hold no values")
                })?;
                let start = out.len();
                out.resize(start + n, 0.0);
                headroom_tensor::nf4::dequantize_nf4(bytes, n, |j, v| out[start + j] = v);
            }
            None => {
                let spec = block
                    .specs()
                    .iter()
                    .find(|s| s.name == *name)
                    .ok_or_else(|| {
                        TensorError::invalid(
                            "QLoRA",
                            format!("no weight {name} in {}", block.name()),
                        )
                    })?;
                out.extend_from_slice(&kept[spec.offset..spec.offset + n]);
            }
        }
    }
    Ok(out)
}
