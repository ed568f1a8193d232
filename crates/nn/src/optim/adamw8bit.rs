//! AdamW with 8-bit block-wise states (bitsandbytes' `AdamW8bit`, Dettmers et al. 2022): per
//! block of [`BLOCK`] elements, both moments are dequantized, the ordinary f32 AdamW update runs
//! (the weights move by the f32 moments), and the new moments are quantized again with the
//! block's new absmax. Blocks are independent, so they run in parallel over the rayon pool with
//! the same result in any order.
//!
//! headroom quantizes each flat buffer in blocks from its start; bitsandbytes quantizes each
//! tensor separately and keeps tensors under 4,096 elements in f32 (docs/sources.md §16).
//!
//! Not for: the code or the block arithmetic (`quant8`), f32/bf16 states (`adamw`).

use super::adamw::{AdamStep, next_moments};
use super::quant8::{BLOCK, DynamicCode};
use crate::grad::Grads;
use rayon::prelude::*;

/// One step over `params` with states `m`, `v` as codes and per-block absmax.
pub fn adamw8bit_update(
    params: &mut [f32],
    grads: Grads<'_>,
    (m_codes, v_codes): (&mut [u8], &mut [u8]),
    (m_absmax, v_absmax): (&mut [f32], &mut [f32]),
    h: AdamStep,
) {
    let n = params.len();
    assert!(
        grads.len() == n && m_codes.len() == n && v_codes.len() == n,
        "8-bit AdamW over {n} parameters with {} gradients and {}/{} codes",
        grads.len(),
        m_codes.len(),
        v_codes.len()
    );
    assert!(m_absmax.len() == n.div_ceil(BLOCK) && v_absmax.len() == m_absmax.len());
    let (bc1, bc2) = h.bias_corrections();
    let step_size = h.lr / bc1;
    let bc2_sqrt = bc2.sqrt();
    let decay = 1.0 - h.lr * h.weight_decay;
    let (signed, unsigned) = (DynamicCode::signed(), DynamicCode::unsigned());
    params
        .par_chunks_mut(BLOCK)
        .zip(m_codes.par_chunks_mut(BLOCK))
        .zip(v_codes.par_chunks_mut(BLOCK))
        .zip(m_absmax.par_iter_mut().zip(v_absmax.par_iter_mut()))
        .enumerate()
        .for_each(|(b, (((w, mq), vq), (ma, va)))| {
            let len = w.len();
            let (mut m, mut v) = ([0f32; BLOCK], [0f32; BLOCK]);
            signed.dequantize(mq, *ma, &mut m[..len]);
            unsigned.dequantize(vq, *va, &mut v[..len]);
            let g = grads.range(b * BLOCK..b * BLOCK + len);
            for i in 0..len {
                let gi = g.get(i) * h.grad_multiplier;
                w[i] *= decay;
                let (mn, vn) = next_moments(gi, m[i], v[i], &h);
                (m[i], v[i]) = (mn, vn);
                let denom = vn.sqrt() / bc2_sqrt + h.eps;
                w[i] -= step_size * mn / denom;
            }
            *ma = signed.quantize(&m[..len], mq);
            *va = unsigned.quantize(&v[..len], vq);
        });
}
