//! LAMB on ZeRO shards (You et al. 2020; DeepSpeed's sharded LAMB does the same): a rank holds
//! only its shard of a block's flat buffer, so for a weight its shard cuts it can sum ‖w‖² and
//! ‖u‖² over its piece only. The pieces' sums of the weights the shard boundaries cut are
//! all-reduced over ranks — one all-reduce per block that has such a weight, of
//! `2 × SquareSum::digits(world)` elements per cut weight (a weight inside one shard is
//! already whole) — and each rank updates its elements with the whole weight's trust ratio.
//! The sums are exact integers sent as digits whose sums over ranks are exact in f32, so the
//! ratio has the bits of the unsharded run's at any number of ranks.
//!
//! Not for: the update rule (the optimizer's `lamb`) or the other collectives (`shard`).

use super::TrainError;
use super::shard::{cut_weights, pieces_within};
use headroom_comm::Communicator;
use headroom_nn::optim::{FlatParams, Optimizer, SquareSum, TensorSums};
use std::ops::Range;

/// Where a block's update takes place: its weights' ranges in the whole flat buffer, the rank's
/// shard of it and the shard's padded length.
pub(super) struct BlockShard<'a> {
    pub weights: &'a [Range<usize>],
    pub shard: &'a Range<usize>,
    pub padded: usize,
}

/// Updates buffer `index` (`group`, the rank's shard) within the current step, with the
/// optimizer's device state or, offloaded, the state bytes `external`; with `comm` (a sharded
/// run) a rule that needs whole weights' sums gets them completed over ranks.
pub(super) fn update_shard(
    optimizer: &mut Optimizer,
    comm: Option<&mut (dyn Communicator + 'static)>,
    index: usize,
    group: &mut FlatParams<'_>,
    at: BlockShard<'_>,
    (grad_multiplier, lr): (f32, f32),
    external: Option<&mut [&mut [u8]]>,
) -> Result<(), TrainError> {
    let sums = match comm {
        Some(comm) if optimizer.needs_tensor_sums() && comm.world_size() > 1 => {
            let mut sums = match &external {
                Some(state) => {
                    let state: Vec<&[u8]> = state.iter().map(|s| &**s).collect();
                    optimizer.tensor_sums_external(&state, group, grad_multiplier, lr)
                }
                None => optimizer.tensor_sums(index, group, grad_multiplier, lr)?,
            };
            complete_sums(comm, &at, &mut sums)?;
            Some(sums)
        }
        _ => None,
    };
    match external {
        Some(state) => {
            optimizer.update_external(state, group, grad_multiplier, lr, sums.as_deref())
        }
        None => optimizer.update_group_with(index, group, grad_multiplier, lr, sums.as_deref())?,
    }
    Ok(())
}

/// A dry run's stand-in for `update_shard`'s collective: the all-reduce a rule that needs whole
/// weights' sums would make for this block, counted without data.
pub(super) fn count_shard_sums(
    optimizer: &Optimizer,
    comm: &mut dyn Communicator,
    at: &BlockShard<'_>,
) -> Result<(), TrainError> {
    let world = comm.world_size();
    if !optimizer.needs_tensor_sums() || world < 2 {
        return Ok(());
    }
    let cut = cut_weights(at.weights, at.padded);
    if !cut.is_empty() {
        let elements = 2 * SquareSum::digits(world) * cut.len();
        comm.without_data(headroom_comm::Collective::AllReduce, elements)?;
    }
    Ok(())
}

/// Replaces the sums of this rank's pieces (in the order of `pieces_within`) of every weight
/// the shards cut with the sum over all ranks' pieces.
fn complete_sums(
    comm: &mut dyn Communicator,
    at: &BlockShard<'_>,
    sums: &mut [TensorSums],
) -> Result<(), TrainError> {
    let cut = cut_weights(at.weights, at.padded);
    if cut.is_empty() {
        return Ok(());
    }
    let world = comm.world_size();
    let n = SquareSum::digits(world);
    let pieces = pieces_within(at.weights, at.shard);
    debug_assert_eq!(pieces.len(), sums.len());
    // Each cut weight's slot: its ‖w‖² digits, then its ‖u‖² digits; zeros where the rank has
    // no piece of it.
    let slot = |t: usize| cut.binary_search(&t).ok().map(|k| 2 * n * k);
    let mut digits = vec![0.0f32; 2 * n * cut.len()];
    for ((t, _), s) in pieces.iter().zip(sums.iter()) {
        if let Some(at) = slot(*t) {
            let (w, u) = digits[at..at + 2 * n].split_at_mut(n);
            s.weights.to_digits(world, w);
            s.update.to_digits(world, u);
        }
    }
    comm.all_reduce_sum(&mut digits)?;
    for ((t, _), s) in pieces.iter().zip(sums.iter_mut()) {
        if let Some(at) = slot(*t) {
            *s = TensorSums {
                weights: SquareSum::from_digits(world, &digits[at..at + n]),
                update: SquareSum::from_digits(world, &digits[at + n..at + 2 * n]),
            };
        }
    }
    Ok(())
}
