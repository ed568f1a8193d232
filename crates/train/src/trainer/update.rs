//! The optimizer update of one block on fp32 weights: the parameters themselves (fp32), the
//! master copies (mixed modes, then cast back), or a temporary fp32 copy (pure bf16). Under ZeRO
//! each rank updates its shard of every block only (its optimizer state and master weights cover
//! just that), reading its gradient shard under ZeRO-2/3 (LAMB completes the sums of the weights
//! its shard cuts over ranks, see `trust`); the updated parameters are then gathered from every
//! rank (ZeRO-1/2), or stay sharded until the next forward gathers them (ZeRO-3).
//!
//! `Trainer::update_weights` runs it over every block after backward; the optimizer step in
//! backward (`fused_step`) runs it on one block as soon as that block's gradient is complete.
//!
//! Not for: offloaded states (`offload_step`) or what decides the multiplier (`step`).

use super::precision::{f32_range_copy, store_f32_at, with_grads};
use super::shard::{block_shards, f32_bucket, gather_into, ranges_within};
use super::trust::{BlockShard, count_shard_sums, update_shard};
use super::{TrainError, Trainer};
use headroom_comm::{Collective, Communicator};
use headroom_memory::{Category, Device};
use headroom_nn::optim::{FlatParams, Optimizer};
use headroom_strategy::ZeroStage;
use headroom_tensor::{DType, ParamBlock, Tensor};
use std::ops::Range;

/// What one block's update reads and writes besides the block.
pub(super) struct UpdateParts<'a> {
    pub optimizer: &'a mut Optimizer,
    /// fp32 master weights per block (mixed modes).
    pub master: Option<&'a [Tensor]>,
    /// The group, under ZeRO (stage ≥ 1).
    pub comm: Option<&'a mut (dyn Communicator + 'static)>,
    pub stage: ZeroStage,
    pub world: usize,
    /// A shape-only device: the same allocations and collectives, no arithmetic.
    pub dry: bool,
    pub device: &'a Device,
}

/// Updates block `i` (`block`) on the rank's `shard` of it (its range in the flat buffer and
/// the padded shard length), with the gradient scaled by `multiplier` and learning rate `lr`,
/// within the optimizer's current step.
pub(super) fn update_block(
    parts: &mut UpdateParts<'_>,
    i: usize,
    block: &ParamBlock,
    (range, padded): (Range<usize>, usize),
    (multiplier, lr): (f32, f32),
) -> Result<(), TrainError> {
    let stage = parts.stage;
    let weights_at = block.ranges();
    let ranges = ranges_within(&weights_at, &range);
    // Where the rank's parameters and gradients live, and the shard's place in each.
    let shard = block.shard();
    let (params, at_params) = match shard.and_then(|s| s.params.as_ref()) {
        Some(p) => (p, 0..range.len()),
        None => (block.flat(), range.clone()),
    };
    let (grads, at_grads) = match shard.and_then(|s| s.grads.as_ref()) {
        Some(g) => (g, 0..range.len()),
        None => (block.flat_grad(), range.clone()),
    };
    let scratch;
    let weights = match parts.master {
        Some(master) => &master[i],
        None if params.dtype() == DType::F32 => params,
        None => {
            let name = format!("{}.fp32", block.name());
            scratch = f32_range_copy(params, at_params.clone(), Category::Temporary, &name)?;
            &scratch
        }
    };
    if parts.dry {
        // Same allocations and collectives as a real update (state, scratch), no arithmetic.
        if let (true, Some(comm)) = (stage.shards_optimizer(), parts.comm.as_deref_mut()) {
            let at = BlockShard {
                weights: &weights_at,
                shard: &range,
                padded,
            };
            count_shard_sums(parts.optimizer, comm, &at)?;
        }
        if let (true, Some(comm)) = (
            stage.gathers_updated_parameters(),
            parts.comm.as_deref_mut(),
        ) {
            let label = "params.gather.bucket";
            let _bucket = f32_bucket(parts.device, padded * parts.world, label)?;
            comm.without_data(Collective::AllGather, padded)?;
        }
        return Ok(());
    }
    let in_place = std::ptr::eq(weights, params);
    let at = if in_place {
        at_params.clone()
    } else {
        0..range.len()
    };
    let optimizer = &mut *parts.optimizer;
    let comm = parts
        .comm
        .as_deref_mut()
        .filter(|_| stage.shards_optimizer());
    with_grads(grads, |g| {
        weights.with_slice_mut::<f32, _>(|w| {
            let mut group = FlatParams {
                params: &mut w[at],
                grads: g.range(at_grads.clone()),
                tensors: &ranges,
            };
            let shard = BlockShard {
                weights: &weights_at,
                shard: &range,
                padded,
            };
            update_shard(
                optimizer,
                comm,
                i,
                &mut group,
                shard,
                (multiplier, lr),
                None,
            )
        })
    })???;
    // The rank's updated values, cast into the compute parameters when they are a copy.
    let updated = match in_place {
        true => None,
        false => {
            let values = weights.to_vec_f32()?;
            store_f32_at(params, at_params.start, &values)?;
            Some(values)
        }
    };
    if let (true, Some(comm)) = (
        stage.gathers_updated_parameters(),
        parts.comm.as_deref_mut(),
    ) {
        let shard = match updated {
            Some(values) => values,
            None => weights.with_slice::<f32, _>(|p| p[range.clone()].to_vec())?,
        };
        gather_into(comm, block.flat(), block.numel(), &shard, padded)?;
    }
    Ok(())
}

impl Trainer {
    /// The optimizer step over every block (see the module header); offloaded states are
    /// updated where they live.
    pub(super) fn update_weights(&mut self, multiplier: f32, lr: f32) -> Result<(), TrainError> {
        if self.offload.is_some() {
            return self.update_offloaded(multiplier, lr);
        }
        let (rank, world) = self.rank();
        let stage = self.zero_stage();
        let shards = block_shards(self.model.as_ref(), rank, world, stage);
        let lens: Vec<usize> = shards.iter().map(|(r, _)| r.len()).collect();
        self.optimizer.reserve_state(&lens)?;
        // From here on an out-of-memory error may leave some blocks updated: not recoverable.
        self.weights_touched = true;
        self.optimizer.begin_step();
        let mut parts = UpdateParts {
            optimizer: &mut self.optimizer,
            master: self.master.as_deref(),
            comm: self.comm.as_deref_mut(),
            stage,
            world,
            dry: self.dry,
            device: &self.device,
        };
        for (i, block) in self.model.blocks().iter().enumerate() {
            update_block(&mut parts, i, block, shards[i].clone(), (multiplier, lr))?;
        }
        Ok(())
    }
}
