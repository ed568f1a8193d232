//! ZeRO's shards on flat buffers (Rajbhandari et al. 2020): each block's flat buffer is cut into
//! `world` equal shards (the last padded), rank r owns shard r — its optimizer state and fp32
//! master weights (stage 1), its part of the gradient (stage 2) and of the parameters (stage 3)
//! — and the collectives that move shards: gradients summed and scattered (reduce-scatter),
//! parameters gathered (all-gather). Every collective runs through f32 buckets from the device
//! allocator, tagged `communication` and freed after it; on a shape-only device (a dry run)
//! the buckets and the collectives are counted and nothing moves.
//!
//! Not for: the update rule (the optimizer) or when the collectives run (`step`, `zero`).

use super::TrainError;
use super::precision::{store_f32, store_f32_at};
use headroom_comm::{Collective, Communicator};
use headroom_memory::{Category, Device, DeviceBuffer};
use headroom_strategy::ZeroStage;
use headroom_tensor::{DType, Tensor};
use std::ops::Range;

pub use headroom_tensor::shard_range as shard_of;

/// Each block's elements this rank updates and the padded shard length: the whole block at
/// stage 0, its shard of `world` otherwise.
pub fn block_shards(
    model: &dyn headroom_nn::Model,
    rank: usize,
    world: usize,
    stage: ZeroStage,
) -> Vec<(Range<usize>, usize)> {
    model
        .blocks()
        .iter()
        .map(|b| match stage.shards_optimizer() {
            false => (0..b.numel(), b.numel()),
            true => shard_of(b.numel(), rank, world),
        })
        .collect()
}

/// The weights' element ranges that fall inside `shard`, relative to the shard's start.
pub fn ranges_within(ranges: &[Range<usize>], shard: &Range<usize>) -> Vec<Range<usize>> {
    pieces_within(ranges, shard)
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// [`ranges_within`] with the index of the weight each piece belongs to.
pub fn pieces_within(ranges: &[Range<usize>], shard: &Range<usize>) -> Vec<(usize, Range<usize>)> {
    ranges
        .iter()
        .enumerate()
        .filter_map(|(t, r)| {
            let (lo, hi) = (r.start.max(shard.start), r.end.min(shard.end));
            (lo < hi).then(|| (t, lo - shard.start..hi - shard.start))
        })
        .collect()
}

/// The weights that shards of `padded` elements cut: whose first and last elements lie in
/// different shards.
pub fn cut_weights(ranges: &[Range<usize>], padded: usize) -> Vec<usize> {
    ranges
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.is_empty() && r.start / padded != (r.end - 1) / padded)
        .map(|(t, _)| t)
        .collect()
}

/// A bucket of `len` f32 values from the device allocator, tagged `communication`.
pub(super) fn f32_bucket(
    device: &Device,
    len: usize,
    label: &str,
) -> Result<DeviceBuffer, TrainError> {
    Ok(device.alloc(4 * len as u64, Category::Communication, Some(label))?)
}

/// A bucket's values (`None` on a shape-only device, which holds no bytes).
pub(super) fn bucket_values(bucket: &mut DeviceBuffer) -> Option<&mut [f32]> {
    bucket.as_bytes_mut().map(bytemuck::cast_slice_mut)
}

/// Copies a float tensor's elements into `out` as f32.
fn read_f32(t: &Tensor, out: &mut [f32]) -> Result<(), TrainError> {
    match t.dtype() {
        DType::F32 => t.with_slice::<f32, _>(|v| out.copy_from_slice(v))?,
        _ => out.copy_from_slice(&t.to_vec_f32()?),
    }
    Ok(())
}

/// Every rank's `shard` (padded to `padded` elements) gathered into `flat`, a block's whole
/// buffer of `numel` elements (ZeRO-1 and 2 after the update, ZeRO-3 before a block computes).
pub(super) fn gather_into(
    comm: &mut dyn Communicator,
    flat: &Tensor,
    numel: usize,
    shard: &[f32],
    padded: usize,
) -> Result<(), TrainError> {
    let device = flat.device();
    let mut bucket = f32_bucket(&device, padded * comm.world_size(), "params.gather.bucket")?;
    let Some(all) = bucket_values(&mut bucket) else {
        comm.without_data(Collective::AllGather, padded)?;
        return Ok(());
    };
    let mut part = shard.to_vec();
    part.resize(padded, 0.0);
    comm.all_gather(&part, all)?;
    store_f32(flat, &all[..numel])?;
    Ok(())
}

/// ZeRO-3: every rank's parameter shard (a `(padded,)` tensor) gathered into `flat`.
pub(super) fn gather_params(
    comm: &mut dyn Communicator,
    flat: &Tensor,
    shard: &Tensor,
) -> Result<(), TrainError> {
    let padded = shard.numel();
    if !flat.device().is_backed() {
        // Same bucket, nothing to read.
        let _bucket = f32_bucket(
            &flat.device(),
            padded * comm.world_size(),
            "params.gather.bucket",
        )?;
        comm.without_data(Collective::AllGather, padded)?;
        return Ok(());
    }
    let mut part = vec![0.0f32; padded];
    read_f32(shard, &mut part)?;
    gather_into(comm, flat, flat.numel(), &part, padded)
}

/// A block's full gradient `grad` summed over ranks in rank order (a reduce-scatter through
/// buckets from the device allocator); `store` receives this rank's shard of the sum, `padded`
/// elements. On a shape-only device the buckets are counted and `store` is not called.
fn reduce_scatter_with(
    comm: &mut dyn Communicator,
    grad: &Tensor,
    padded: usize,
    label: &str,
    store: impl FnOnce(&[f32]) -> Result<(), TrainError>,
) -> Result<(), TrainError> {
    let device = grad.device();
    let mut bucket = f32_bucket(&device, padded * comm.world_size(), label)?;
    let mut mine = f32_bucket(&device, padded, label)?;
    let (Some(all), Some(out)) = (bucket_values(&mut bucket), bucket_values(&mut mine)) else {
        comm.without_data(Collective::ReduceScatter, padded * comm.world_size())?;
        return Ok(());
    };
    let numel = grad.numel();
    read_f32(grad, &mut all[..numel])?;
    all[numel..].fill(0.0);
    comm.reduce_scatter_sum(all, out)?;
    store(out)
}

/// ZeRO-2 and 3: a block's full gradient summed over ranks, this rank's shard of the sum added
/// to `shard` (a `(padded,)` tensor: the gradient shard, or its f32 sum over micro-batches),
/// once per micro-batch.
pub(super) fn reduce_scatter_into(
    comm: &mut dyn Communicator,
    grad: &Tensor,
    shard: &Tensor,
    label: &str,
) -> Result<(), TrainError> {
    let padded = shard.numel();
    reduce_scatter_with(comm, grad, padded, label, |out| {
        let mut sum = vec![0.0f32; padded];
        read_f32(shard, &mut sum)?;
        for (s, o) in sum.iter_mut().zip(out) {
            *s += *o;
        }
        store_f32(shard, &sum)?;
        Ok(())
    })
}

/// ZeRO-2 and 3 with offloaded optimizer states (ZeRO-Offload's gradient path): as
/// [`reduce_scatter_into`], the rank's shard of the sum added into `host`, the shard's bytes in
/// host memory as `dtype` (f32 for every precision: the sums are rounded to the compute dtype
/// once, after the last micro-batch, as on the device, so the bits match); `None` on a dry
/// run.
pub(super) fn reduce_scatter_into_host(
    comm: &mut dyn Communicator,
    grad: &Tensor,
    padded: usize,
    label: &str,
    host: Option<&mut [f32]>,
) -> Result<(), TrainError> {
    reduce_scatter_with(comm, grad, padded, label, |out| {
        if let Some(host) = host {
            for (h, &v) in host.iter_mut().zip(out) {
                *h += v;
            }
        }
        Ok(())
    })
}

/// ZeRO-1: after accumulation, a block's full gradient (`source`: the gradient itself, or its
/// f32 sum over micro-batches) summed over ranks and this rank's shard of the sum written over
/// `range` of the gradient `grad` (the elements its optimizer state covers; the rest of the
/// buffer keeps this rank's own contribution, which nothing reads). Half the elements of DDP's
/// all-reduce: the ZeRO paper's 2Ψ with the parameters' gather.
pub(super) fn reduce_scatter_in_place(
    comm: &mut dyn Communicator,
    source: &Tensor,
    grad: &Tensor,
    range: Range<usize>,
    padded: usize,
    label: &str,
) -> Result<(), TrainError> {
    reduce_scatter_with(comm, source, padded, label, |out| {
        store_f32_at(grad, range.start, &out[..range.len()])?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_ranges_are_cut_to_the_shard() {
        let ranges = [0..3, 3..9, 9..10];
        assert_eq!(ranges_within(&ranges, &(4..8)), vec![0..4]);
        assert_eq!(ranges_within(&ranges, &(2..10)), vec![0..1, 1..7, 7..8]);
        assert_eq!(pieces_within(&ranges, &(4..8)), vec![(1, 0..4)]);
        // Shards of 4: 0..4, 4..8, 8..10; 3..9 spans all three, 0..3 and 9..10 lie in one.
        assert_eq!(cut_weights(&ranges, 4), vec![1]);
        assert_eq!(cut_weights(&ranges, 3), vec![1]);
        assert_eq!(cut_weights(&ranges, 2), vec![0, 1]);
        assert_eq!(cut_weights(&ranges, 10), Vec::<usize>::new());
    }
}
