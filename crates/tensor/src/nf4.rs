//! Frozen weights in 4-bit NormalFloat (NF4, Dettmers et al. 2023 — QLoRA): each block of 64
//! elements is scaled by its absolute maximum and every element stored as the index of the
//! nearest of 16 levels, the quantiles of a standard normal normalised to [−1, 1]; the block
//! maxima are themselves quantised ("double quantisation"): their mean is subtracted and each
//! group of 256 is stored as signed 8-bit values with one f32 scale (bitsandbytes uses its
//! dynamic 8-bit map for them; this linear map keeps the same bytes and a stated error).
//!
//! One device buffer of `nf4_bytes(n)` bytes, tagged `parameter`, holds a weight:
//! `[codes: ⌈n/2⌉][absmax codes: ⌈n/64⌉][group scales: 4·⌈⌈n/64⌉/256⌉][offset: 4]`, the first
//! element of a pair in the high nibble. The weight never exists in 16 or 32 bits for long:
//! [`Tensor::matmul_nf4`] dequantises it into a temporary for its GEMM and again in backward,
//! and saves nothing else (a frozen weight needs no gradient, so its input is not kept either).
//!
//! Error: an element x of a block with maximum a comes back within
//! `NF4_HALF_GAP · a + s/2`, where 0.1519 is half the widest gap between adjacent levels
//! (between −1 and −0.6962) and s the scale of its group's absmax codes.
//!
//! Not for: which weights are quantised (the model decides) or their bytes in the planner.

use crate::backprop::Op;
use crate::context::no_grad;
use crate::dtype::DType;
use crate::error::{Result, TensorError};
use crate::tape::record;
use crate::tensor::Tensor;
use headroom_memory::{Category, Device, DeviceBuffer};
use std::sync::Arc;

/// The 16 NF4 levels (QLoRA, Appendix E; bitsandbytes' `NF4` map).
pub const NF4_LEVELS: [f32; 16] = [
    -1.0,
    -0.696_192_8,
    -0.525_073_05,
    -0.394_917_5,
    -0.284_441_38,
    -0.184_773_43,
    -0.091_050_036,
    0.0,
    0.079_580_3,
    0.160_930_2,
    0.246_112_3,
    0.337_915_24,
    0.440_709_83,
    0.562_617,
    0.722_956_84,
    1.0,
];

/// Elements per absmax block.
pub const NF4_BLOCK: usize = 64;
/// Absmax values per f32 scale of the double quantisation.
pub const NF4_SCALE_GROUP: usize = 256;
/// Half the widest gap between adjacent levels: the largest error of an element relative to
/// its block's maximum, before the maximum's own quantisation error.
pub const NF4_HALF_GAP: f32 = (1.0 - 0.696_192_8) / 2.0;

/// Bytes of an NF4 weight of `n` elements: codes, absmax codes, group scales and the offset.
pub fn nf4_bytes(n: usize) -> usize {
    let blocks = n.div_ceil(NF4_BLOCK);
    n.div_ceil(2) + blocks + 4 * blocks.div_ceil(NF4_SCALE_GROUP) + 4
}

/// The index of the level nearest to `v` (in [−1, 1]).
fn nearest_level(v: f32) -> u8 {
    let mut best = 0;
    for (i, l) in NF4_LEVELS.iter().enumerate() {
        if (v - l).abs() < (v - NF4_LEVELS[best]).abs() {
            best = i;
        }
    }
    best as u8
}

/// The NF4 bytes of `values` (laid out as the module header says).
pub fn quantize_nf4(values: &[f32]) -> Vec<u8> {
    let n = values.len();
    let blocks = n.div_ceil(NF4_BLOCK);
    let absmax: Vec<f32> = values
        .chunks(NF4_BLOCK)
        .map(|b| b.iter().fold(0.0f32, |m, v| m.max(v.abs())))
        .collect();
    let mut out = vec![0u8; nf4_bytes(n)];
    for (i, v) in values.iter().enumerate() {
        let a = absmax[i / NF4_BLOCK];
        let code = if a > 0.0 { nearest_level(v / a) } else { 7 };
        out[i / 2] |= if i % 2 == 0 { code << 4 } else { code };
    }
    let offset = absmax.iter().map(|&a| a as f64).sum::<f64>() as f32 / blocks.max(1) as f32;
    let rest = &mut out[n.div_ceil(2)..];
    let (absmax_codes, rest) = rest.split_at_mut(blocks);
    let (scales, tail) = rest.split_at_mut(rest.len() - 4);
    for (g, group) in absmax.chunks(NF4_SCALE_GROUP).enumerate() {
        let spread = group.iter().fold(0.0f32, |m, a| m.max((a - offset).abs()));
        let scale = if spread > 0.0 { spread / 127.0 } else { 1.0 };
        for (j, a) in group.iter().enumerate() {
            let q = ((a - offset) / scale).round().clamp(-127.0, 127.0) as i8;
            absmax_codes[g * NF4_SCALE_GROUP + j] = q as u8;
        }
        scales[4 * g..4 * g + 4].copy_from_slice(&scale.to_le_bytes());
    }
    tail.copy_from_slice(&offset.to_le_bytes());
    out
}

/// The `n` values NF4 `bytes` stand for, each passed to `put(index, value)`.
pub fn dequantize_nf4(bytes: &[u8], n: usize, mut put: impl FnMut(usize, f32)) {
    let blocks = n.div_ceil(NF4_BLOCK);
    let (codes, rest) = bytes.split_at(n.div_ceil(2));
    let (absmax_codes, rest) = rest.split_at(blocks);
    let (scales, tail) = rest.split_at(rest.len() - 4);
    let offset = f32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    for (b, &q) in absmax_codes.iter().enumerate() {
        let g = 4 * (b / NF4_SCALE_GROUP);
        let scale = f32::from_le_bytes([scales[g], scales[g + 1], scales[g + 2], scales[g + 3]]);
        let a = q as i8 as f32 * scale + offset;
        for i in b * NF4_BLOCK..((b + 1) * NF4_BLOCK).min(n) {
            let byte = codes[i / 2];
            let code = if i % 2 == 0 { byte >> 4 } else { byte & 0xF };
            put(i, NF4_LEVELS[code as usize] * a);
        }
    }
}

/// A frozen (in × out) weight stored in NF4 on a device.
#[derive(Debug)]
pub struct Nf4Weight {
    name: String,
    shape: [usize; 2],
    buffer: DeviceBuffer,
}

impl Nf4Weight {
    /// Allocates the weight's `parameter` bytes on `device` and, on a device with memory,
    /// stores `values` (row-major, `shape[0]·shape[1]` of them) quantised.
    pub fn new(
        device: &Device,
        name: &str,
        shape: [usize; 2],
        values: Option<&[f32]>,
    ) -> Result<Arc<Nf4Weight>> {
        let n = shape[0] * shape[1];
        let mut buffer = device.alloc(nf4_bytes(n) as u64, Category::Parameter, Some(name))?;
        if let (Some(v), Some(bytes)) = (values, buffer.as_bytes_mut()) {
            if v.len() != n {
                return Err(TensorError::ShapeMismatch {
                    op: "Nf4Weight::new",
                    lhs: shape.to_vec(),
                    rhs: vec![v.len()],
                });
            }
            bytes.copy_from_slice(&quantize_nf4(v));
        }
        Ok(Arc::new(Nf4Weight {
            name: name.to_string(),
            shape,
            buffer,
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// (in, out).
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// The stored bytes (`None` on a shape-only device).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.buffer.as_bytes()
    }

    /// Bytes on the device: `nf4_bytes(in · out)`.
    pub fn len_bytes(&self) -> u64 {
        self.buffer.len_bytes()
    }

    /// Replaces the stored bytes (a resumed run's), which must be `len_bytes` long.
    ///
    /// Takes `&mut`: call it before the weight is shared.
    pub fn set_bytes(this: &mut Arc<Nf4Weight>, data: &[u8]) -> Result<()> {
        let w = Arc::get_mut(this).ok_or_else(|| {
            TensorError::invalid("Nf4Weight", "the weight is in use; restore it first")
        })?;
        if data.len() as u64 != w.buffer.len_bytes() {
            return Err(TensorError::ShapeMismatch {
                op: "Nf4Weight::set_bytes",
                lhs: vec![w.buffer.len_bytes() as usize],
                rhs: vec![data.len()],
            });
        }
        if let Some(b) = w.buffer.as_bytes_mut() {
            b.copy_from_slice(data);
        }
        Ok(())
    }

    /// The weight dequantised into a `temporary` tensor of `dtype` on `device`.
    pub fn dequantize(&self, device: &Device, dtype: DType) -> Result<Tensor> {
        let t = Tensor::empty_in(
            device,
            &self.shape,
            dtype,
            Category::Temporary,
            Some("nf4 dequantised"),
        )?;
        let Some(bytes) = self.buffer.as_bytes() else {
            return Ok(t); // a dry run: the bytes, no values
        };
        let n = self.shape[0] * self.shape[1];
        match dtype {
            DType::BF16 => t.with_slice_mut::<half::bf16, _>(|s| {
                dequantize_nf4(bytes, n, |i, v| s[i] = half::bf16::from_f32(v))
            })?,
            DType::F16 => t.with_slice_mut::<half::f16, _>(|s| {
                dequantize_nf4(bytes, n, |i, v| s[i] = half::f16::from_f32(v))
            })?,
            _ => t.with_slice_mut::<f32, _>(|s| dequantize_nf4(bytes, n, |i, v| s[i] = v))?,
        }
        Ok(t)
    }
}

impl Tensor {
    /// `self @ w` for a frozen NF4 weight: the weight is dequantised into a temporary of
    /// `self`'s dtype for the GEMM and released after it; backward dequantises it again for
    /// `dx = dy @ wᵀ`. Nothing is saved but the weight's handle.
    pub fn matmul_nf4(&self, w: &Arc<Nf4Weight>) -> Result<Tensor> {
        let out = no_grad(|| {
            let dense = w.dequantize(&self.device(), self.dtype())?;
            self.matmul(&dense)
        })?;
        Ok(record(out, &[self], || Op::Nf4Matmul {
            w: w.clone(),
            x_shape: self.shape().to_vec(),
            dtype: self.dtype(),
        }))
    }
}

impl Tensor {
    /// `self @ w + b` for a frozen NF4 weight, the bias lowered under autocast as in
    /// [`Tensor::linear`].
    pub fn linear_nf4(&self, w: &Arc<Nf4Weight>, b: &Tensor) -> Result<Tensor> {
        self.matmul_nf4(w)?.add(&crate::autocast::lower_bias(b)?)
    }
}

/// The input gradient of `x @ w` for an NF4 weight: `dy @ dequant(w)ᵀ`, summed to `x_shape`.
pub(crate) fn matmul_nf4_backward(
    w: &Nf4Weight,
    x_shape: &[usize],
    dtype: DType,
    dy: &Tensor,
) -> Result<Tensor> {
    let dense = w.dequantize(&dy.device(), dtype)?;
    dy.matmul(&dense.transpose(-1, -2)?)?.sum_to(x_shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_has_the_stated_bytes() {
        // 4096²: 8,388,608 code bytes, 262,144 absmax codes, 1,024 scales, one offset.
        assert_eq!(nf4_bytes(4096 * 4096), 8_388_608 + 262_144 + 4 * 1024 + 4);
        assert_eq!(quantize_nf4(&[0.5; 100]).len(), nf4_bytes(100));
        assert_eq!(nf4_bytes(65), 33 + 2 + 4 + 4);
    }

    #[test]
    fn every_element_comes_back_within_the_stated_bound() {
        // Normal(0, 0.02) weights as the GPT draws them, plus outliers, over several groups.
        let n = 3 * NF4_BLOCK * NF4_SCALE_GROUP + 37;
        let v: Vec<f32> = (0..n)
            .map(|i| {
                let u = crate::rng::uniform(7, i as u64) - 0.5;
                if i % 997 == 0 { 0.5 * u } else { 0.04 * u }
            })
            .collect();
        let bytes = quantize_nf4(&v);
        let mut back = vec![0.0; n];
        dequantize_nf4(&bytes, n, |i, x| back[i] = x);
        let blocks = n.div_ceil(NF4_BLOCK);
        let scales = &bytes[n.div_ceil(2) + blocks..bytes.len() - 4];
        let mut worst = 0.0f32;
        for (i, (x, y)) in v.iter().zip(&back).enumerate() {
            let b = i / NF4_BLOCK;
            let a = v[b * NF4_BLOCK..((b + 1) * NF4_BLOCK).min(n)]
                .iter()
                .fold(0.0f32, |m, x| m.max(x.abs()));
            let g = 4 * (b / NF4_SCALE_GROUP);
            let s = f32::from_le_bytes([scales[g], scales[g + 1], scales[g + 2], scales[g + 3]]);
            let bound = NF4_HALF_GAP * a + s / 2.0 + 1e-7;
            assert!(
                (x - y).abs() <= bound,
                "element {i}: {x} came back as {y}, bound {bound}"
            );
            worst = worst.max((x - y).abs() / bound);
        }
        // The bound is tight enough to be approached.
        assert!(worst > 0.5, "{worst}");
    }

    #[test]
    fn the_input_gradient_is_the_dequantised_weights() {
        use crate::{Gradients, Tape};
        use headroom_memory::AllocatorConfig;
        let device = Device::cpu(16 << 20, AllocatorConfig::default());
        let (k, n) = (64, 48);
        let values: Vec<f32> = (0..k * n)
            .map(|i| crate::rng::uniform(3, i as u64) - 0.5)
            .collect();
        let w = Nf4Weight::new(&device, "w", [k, n], Some(&values)).unwrap();
        let dense = w.dequantize(&device, DType::F32).unwrap();
        let xs: Vec<f32> = (0..5 * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::from_f32(&device, &[5, k], &xs, DType::F32, Category::Input, None)
            .unwrap()
            .track();
        let run = |f: &dyn Fn(&Tensor) -> Result<Tensor>| {
            let mut grads = Gradients::new();
            let tape = Tape::new();
            let y = tape.record(|| f(&x)?.sum_all()).unwrap();
            tape.backward(&y, &mut grads).unwrap();
            (
                y.to_scalar_f32().unwrap(),
                grads.get(&x).unwrap().to_vec_f32().unwrap(),
            )
        };
        let (y4, g4) = run(&|x| x.matmul_nf4(&w));
        let (yd, gd) = run(&|x| x.matmul(&dense.detach()));
        // The same GEMMs on the same dequantised values: the same bits.
        assert_eq!(y4.to_bits(), yd.to_bits());
        assert_eq!(g4, gd);
        // The weight's bytes are the only parameter bytes: nothing kept in f32.
        let params = device.stats().category_bytes[Category::Parameter.index()].current;
        assert_eq!(params as usize, nf4_bytes(k * n).div_ceil(512) * 512);
    }

    #[test]
    fn levels_and_zero_blocks_come_back_exactly() {
        // A block whose maximum is 2: every level × 2 is representable; the absmax codes are
        // exact when every block has the same maximum (spread 0 around the mean).
        let mut v: Vec<f32> = (0..64).map(|i| 2.0 * NF4_LEVELS[i % 16]).collect();
        v.extend(std::iter::repeat_n(0.0, 64));
        v[64] = 2.0;
        let bytes = quantize_nf4(&v);
        let mut back = vec![f32::NAN; v.len()];
        dequantize_nf4(&bytes, v.len(), |i, x| back[i] = x);
        assert_eq!(back, v);
    }
}
