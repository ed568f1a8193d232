//! Gradient accumulation over micro-batches in f32 sums: always for the 16-bit precisions
//! (DeepSpeed's `data_types.grad_accum_dtype`, fp32 by default for bf16), and for fp32 in
//! deterministic mode. With more than one micro-batch per step each micro-batch's gradient is
//! summed whole into an f32 buffer, and a 16-bit sum is rounded to the gradient's dtype once —
//! after the last micro-batch alone, or in a group after the reduction over ranks, which sums
//! the f32 values themselves.
//!
//! The order of the additions is the rank-ordered reduction's (`out = part[0]; out += part[1];
//! …`, see `headroom_comm`): the first micro-batch's gradient is copied into the sum and each
//! later one added in turn, so one process accumulating N micro-batches rounds the same f32 sum
//! at the same point as N ranks of one micro-batch each, bit for bit.
//!
//! Where the sums live, tagged `gradient`, taken when a step starts and given back when it ends:
//! below ZeRO-2 one f32 buffer the size of each block (the block's 16-bit gradient receives one
//! micro-batch at a time and is zeroed in between); under ZeRO-2/3 one the size of the rank's
//! padded shard of each block, into which every micro-batch's reduce-scatter is added. fp32 runs
//! outside deterministic mode add each backward's contributions into the gradient itself, and
//! fp32 shards (ZeRO-2/3) are sums already; accumulation 1 has nothing to accumulate: none of
//! them takes a buffer. The host's gradient shards of an offloaded ZeRO-2/3 update are f32
//! themselves (`host_grads`).
//!
//! Not for: the reductions over ranks (`step`, `shard`, `zero`).

use super::TrainError;
use super::precision::{store_f32, with_grads};
use headroom_memory::{Category, Device};
use headroom_nn::grad::Grads;
use headroom_strategy::ZeroStage;
use headroom_tensor::{DType, ParamBlock, Tensor};

/// One step's f32 sums of the blocks' gradients.
#[derive(Debug)]
pub(super) struct GradSums {
    /// Per block: the whole block's sum (below ZeRO-2) or the rank's padded shard's.
    sums: Vec<Tensor>,
    /// Whether the sums are of gradient shards (ZeRO-2/3).
    sharded: bool,
}

impl GradSums {
    /// The sums of a step of `accumulation` micro-batches over `blocks` at ZeRO stage `stage`
    /// (and whether its reduced shards go to the host, which sums in f32 itself); `None` when
    /// there is one micro-batch, and for f32 gradients but below ZeRO-2 in deterministic mode.
    pub(super) fn for_step(
        blocks: &[ParamBlock],
        device: &Device,
        accumulation: usize,
        (stage, host_grads): (ZeroStage, bool),
        deterministic: bool,
    ) -> Result<Option<GradSums>, TrainError> {
        let sixteen_bit = blocks
            .first()
            .is_some_and(|b| b.flat_grad().dtype() != DType::F32);
        let sharded = stage.shards_gradients();
        let needed = match (sixteen_bit, sharded) {
            (true, false) => true,
            (true, true) => !host_grads,
            (false, false) => deterministic,
            (false, true) => false,
        };
        if accumulation < 2 || !needed {
            return Ok(None);
        }
        let sums = blocks
            .iter()
            .map(|b| {
                let len = match b.shard().and_then(|s| s.grads.as_ref()) {
                    Some(shard) if sharded => shard.numel(),
                    _ => b.numel(),
                };
                let name = format!("{}.grad.sum", b.name());
                Tensor::zeros(device, &[len], DType::F32, Category::Gradient, Some(&name))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(GradSums { sums, sharded }))
    }

    /// Block `i`'s sum.
    pub(super) fn sum(&self, i: usize) -> &Tensor {
        &self.sums[i]
    }

    /// Every block's sum (ZeRO-2/3's reduce-scatter adds into them).
    pub(super) fn sums(&self) -> &[Tensor] {
        &self.sums
    }

    /// Below ZeRO-2, after micro-batch `micro`'s backward: each block's gradient copied into
    /// its sum (the first micro-batch) or added to it, then zeroed for the next micro-batch
    /// (not after the last: the reduction or [`GradSums::round_into`] overwrites it). Nothing
    /// to do under ZeRO-2/3, whose hooks add the reduced shards, or on a shape-only device.
    pub(super) fn add_micro_batch(
        &self,
        blocks: &[ParamBlock],
        micro: usize,
        last: bool,
    ) -> Result<(), TrainError> {
        if self.sharded || !self.sums.first().is_some_and(|s| s.device().is_backed()) {
            return Ok(());
        }
        for (block, sum) in blocks.iter().zip(&self.sums) {
            let grad = block.flat_grad();
            with_grads(grad, |g| {
                sum.with_slice_mut::<f32, _>(|s| add_widened(s, g, micro == 0))
            })??;
            if !last {
                grad.fill_(0.0)?;
            }
        }
        Ok(())
    }

    /// Each block's sum rounded to the gradient's dtype (round to nearest even) into the
    /// gradient that the step reads: the block's flat gradient, or its shard under ZeRO-2/3.
    pub(super) fn round_into(&self, blocks: &[ParamBlock]) -> Result<(), TrainError> {
        for (block, sum) in blocks.iter().zip(&self.sums) {
            if !sum.device().is_backed() {
                return Ok(());
            }
            let target = match block.shard().and_then(|s| s.grads.as_ref()) {
                Some(shard) if self.sharded => shard,
                _ => block.flat_grad(),
            };
            sum.with_slice::<f32, _>(|s| store_f32(target, s))??;
        }
        Ok(())
    }
}

/// `sum[i] = g[i]` (`first`) or `sum[i] += g[i]`, each 16-bit value widened exactly to f32.
fn add_widened(sum: &mut [f32], g: Grads<'_>, first: bool) {
    match (g, first) {
        (Grads::F32(g), true) => sum.copy_from_slice(g),
        (Grads::Bf16(g), true) => headroom_tensor::backend::cpu::convert_slice(g, sum),
        (Grads::F16(g), true) => headroom_tensor::backend::cpu::convert_slice(g, sum),
        (g, false) => {
            for (i, s) in sum.iter_mut().enumerate() {
                *s += g.get(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn the_sum_adds_in_the_order_of_a_rank_ordered_reduction() {
        // Three bf16 gradients whose f32 sum rounds differently from the running bf16 sum:
        // 1 + 2⁻⁸ + 2⁻⁸ is 1 + 2⁻⁷ in f32 (a bf16 value), but 1 + 2⁻⁸ rounds to 1 in bf16
        // (ties to even), so a bf16 running sum stays at 1.
        let g = [bf16::from_f32(1.0), bf16::from_f32(2f32.powi(-8))];
        let mut sum = [0.0f32];
        add_widened(&mut sum, Grads::Bf16(&g[..1]), true);
        add_widened(&mut sum, Grads::Bf16(&g[1..]), false);
        add_widened(&mut sum, Grads::Bf16(&g[1..]), false);
        assert_eq!(sum[0], 1.0 + 2f32.powi(-7));
        assert_eq!(bf16::from_f32(sum[0]).to_f32(), 1.0 + 2f32.powi(-7));
        let running = bf16::from_f32(bf16::from_f32(1.0 + 2f32.powi(-8)).to_f32() + 2f32.powi(-8));
        assert_eq!(running.to_f32(), 1.0);
        // The first micro-batch's gradient is copied, not added to zero: a −0 stays −0, as
        // the reduction's first part does.
        let mut sum = [5.0f32];
        add_widened(&mut sum, Grads::Bf16(&[bf16::from_f32(-0.0)]), true);
        assert!(sum[0] == 0.0 && sum[0].is_sign_negative());
    }

    /// fp16 loss scaling: the scaler's overflow check reads the gradient after the one rounding,
    /// so a sum past f16's range (65,504) rounds to infinity and the step is skipped, as a 16-bit
    /// running sum would overflow; a non-finite micro-batch gradient keeps the sum non-finite.
    #[test]
    fn an_f32_sum_past_the_16_bit_range_is_an_overflow_after_rounding() {
        use half::f16;
        use headroom_nn::grad::grad_stats;
        let big = [f16::from_f32(40_000.0)];
        let mut sum = [0.0f32];
        add_widened(&mut sum, Grads::F16(&big), true);
        add_widened(&mut sum, Grads::F16(&big), false);
        assert_eq!(sum[0], 80_000.0);
        let mut rounded = [f16::ZERO];
        headroom_tensor::backend::cpu::convert_slice(&sum, &mut rounded);
        assert!(rounded[0].is_infinite());
        assert!(!grad_stats([Grads::F16(&rounded)]).all_finite);
        for bad in [f16::INFINITY, f16::NAN] {
            let mut sum = [0.0f32];
            add_widened(&mut sum, Grads::F16(&[f16::from_f32(1.0)]), true);
            add_widened(&mut sum, Grads::F16(&[bad]), false);
            add_widened(&mut sum, Grads::F16(&[f16::NEG_INFINITY]), false);
            assert!(!sum[0].is_finite());
        }
    }
}
