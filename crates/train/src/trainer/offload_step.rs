//! The optimizer step with offloaded states (the trainer's `offload`): the regions visited in
//! block order, each block's gradient from its host shard (ZeRO-2/3) or copied into a host
//! staging buffer (ZeRO-0/1; the next block's copy on a second thread while this one updates),
//! the update in place through `Optimizer::update_external`, and the new weights rounded into
//! the compute parameters or the parameter store, then gathered under ZeRO-1/2.
//!
//! Not for: building the stores or saving them (`offload`).

use super::offload::Offloaded;
use super::shard::{gather_into, ranges_within};
use super::trust::{BlockShard, count_shard_sums, update_shard};
use super::{TrainError, Trainer};
use headroom_comm::Collective;
use headroom_nn::grad::Grads;
use headroom_nn::optim::FlatParams;
use headroom_tensor::{DType, Tensor};
use std::ops::Range;
use std::time::Instant;

/// Writes f32 `values` into `bytes` as `dtype` (round to nearest even), zeros after them.
fn cast_into(values: &[f32], dtype: DType, bytes: &mut [u8]) {
    match dtype {
        DType::BF16 => {
            let out: &mut [half::bf16] = bytemuck::cast_slice_mut(bytes);
            out.fill(half::bf16::ZERO);
            out.iter_mut()
                .zip(values)
                .for_each(|(o, &v)| *o = half::bf16::from_f32(v));
        }
        DType::F16 => {
            let out: &mut [half::f16] = bytemuck::cast_slice_mut(bytes);
            out.fill(half::f16::ZERO);
            out.iter_mut()
                .zip(values)
                .for_each(|(o, &v)| *o = half::f16::from_f32(v));
        }
        _ => {
            let out: &mut [f32] = bytemuck::cast_slice_mut(bytes);
            out.fill(0.0);
            out[..values.len()].copy_from_slice(values);
        }
    }
}

/// Copies the `range` of a gradient tensor into `out` as f32.
fn stage_gradient(grads: &Tensor, range: Range<usize>, out: &mut [f32]) -> Result<(), TrainError> {
    super::precision::with_grads(grads, |g| {
        let g = g.range(range);
        match g {
            Grads::F32(s) => out[..s.len()].copy_from_slice(s),
            _ => out
                .iter_mut()
                .take(g.len())
                .enumerate()
                .for_each(|(k, o)| *o = g.get(k)),
        }
    })?;
    Ok(())
}

/// Where block `b`'s reduced gradient for the rank's shard lives: the gradient shard (ZeRO-2/3)
/// or the shard's range of the full gradient.
fn gradient_of(
    block: &headroom_tensor::ParamBlock,
    range: &Range<usize>,
) -> (Tensor, Range<usize>) {
    match block.shard().and_then(|s| s.grads.as_ref()) {
        Some(g) => (g.clone(), 0..range.len()),
        None => (block.flat_grad().clone(), range.clone()),
    }
}

impl Trainer {
    /// The optimizer step with offloaded states: each block's region visited in order (on disk
    /// the next one read while this one updates), its gradient copied to the host, updated in
    /// place, and the new weights cast into the compute parameters (or the parameter store),
    /// then, under ZeRO-1/2, gathered from every rank.
    pub(super) fn update_offloaded(&mut self, multiplier: f32, lr: f32) -> Result<(), TrainError> {
        let stage = self.zero_stage();
        let world = self.rank().1;
        let Trainer {
            model,
            optimizer,
            comm,
            offload,
            weights_touched,
            ..
        } = self;
        let off = offload.as_mut().expect("called with offloaded states");
        let blocks = model.blocks();
        let order: Vec<usize> = (0..blocks.len()).collect();
        *weights_touched = true;
        optimizer.begin_step();
        let Offloaded {
            optimizer: states,
            params,
            host_grads,
            staging,
            shards,
            copy_seconds,
            copy_waited_seconds,
        } = off;
        // ZeRO-0/1: the first block's gradient to the host before the loop; each later one
        // while the previous block updates.
        if let [first, _] = staging.as_mut_slice()
            && let Some(out) = first.bytes_mut()
        {
            let (range, _) = &shards[0];
            let (g, at) = gradient_of(&blocks[0], range);
            let start = Instant::now();
            stage_gradient(&g, at, bytemuck::cast_slice_mut(out))?;
            *copy_seconds += start.elapsed().as_secs_f64();
        }
        states.visit(&order, |i, region| -> Result<(), TrainError> {
            let block = &blocks[i];
            let (range, padded) = shards[i].clone();
            let weights_at = block.ranges();
            let at = BlockShard {
                weights: &weights_at,
                shard: &range,
                padded,
            };
            let mut comm = comm.as_deref_mut().filter(|_| stage.shards_optimizer());
            // The shard's gradient reaches the host in f32 and its new weights come back in the
            // compute dtype.
            let compute = block.flat().dtype().size_in_bytes();
            headroom_tensor::backend::work::host_transfer((range.len() * (4 + compute)) as u64);
            let Some(region) = region else {
                if let Some(comm) = comm {
                    count_shard_sums(optimizer, comm, &at)?;
                    if stage.gathers_updated_parameters() {
                        let device = block.flat().device();
                        let _bucket = super::shard::f32_bucket(
                            &device,
                            padded * world,
                            "params.gather.bucket",
                        )?;
                        comm.without_data(Collective::AllGather, padded)?;
                    }
                }
                if let Some(p) = params.as_mut() {
                    p.write(i, |_| ())?;
                }
                return Ok(());
            };
            let mut parts = region.parts;
            let (master, state) = parts.split_first_mut().expect("a master part");
            let master: &mut [f32] = bytemuck::cast_slice_mut(master);
            let ranges = ranges_within(&weights_at, &range);
            let mut state: Vec<&mut [u8]> = state.iter_mut().map(|p| &mut **p).collect();
            let mut update = |grads: Grads<'_>| {
                let mut group = FlatParams {
                    params: &mut *master,
                    grads,
                    tensors: &ranges,
                };
                update_shard(
                    optimizer,
                    comm.as_deref_mut(),
                    i,
                    &mut group,
                    BlockShard {
                        weights: &weights_at,
                        shard: &range,
                        padded,
                    },
                    (multiplier, lr),
                    Some(&mut state),
                )
            };
            match (host_grads.as_ref(), staging.as_mut_slice()) {
                (Some(h), _) => update(h.grads(i, range.len()).expect("a real run has bytes"))?,
                (None, [a, b]) => {
                    let (cur, next) = if i % 2 == 0 { (a, b) } else { (b, a) };
                    let cur = cur.bytes().expect("a real run has bytes");
                    let grads = Grads::F32(&bytemuck::cast_slice::<_, f32>(cur)[..range.len()]);
                    let next_block = (i + 1 < blocks.len()).then(|| {
                        let (r, _) = &shards[i + 1];
                        gradient_of(&blocks[i + 1], r)
                    });
                    let next = next.bytes_mut().expect("a real run has bytes");
                    let (copied, updated) = std::thread::scope(|s| {
                        let copier = next_block.map(|(g, at)| {
                            let out: &mut [f32] = bytemuck::cast_slice_mut(next);
                            s.spawn(move || {
                                let start = Instant::now();
                                stage_gradient(&g, at, out).map(|()| start.elapsed().as_secs_f64())
                            })
                        });
                        let updated = update(grads);
                        let waited = Instant::now();
                        let copied =
                            copier.map(|h| h.join().expect("the gradient copy does not panic"));
                        (copied.map(|c| (c, waited.elapsed().as_secs_f64())), updated)
                    });
                    updated?;
                    if let Some((seconds, waited)) = copied {
                        *copy_seconds += seconds?;
                        *copy_waited_seconds += waited;
                    }
                }
                (None, _) => unreachable!("ZeRO-0/1 offload has two staging buffers"),
            }
            // The new weights into the compute parameters.
            let master: &[f32] = master;
            match (
                params.as_mut(),
                block.shard().and_then(|s| s.params.as_ref()),
            ) {
                (Some(p), Some(shard)) => {
                    let dtype = shard.dtype();
                    p.write(i, |r| cast_into(master, dtype, r.expect("backed").parts[0]))?;
                }
                (None, Some(shard)) => super::precision::store_f32_at(shard, 0, master)?,
                (_, None) => super::precision::store_f32_at(block.flat(), range.start, master)?,
            }
            if let (true, Some(comm)) = (stage.gathers_updated_parameters(), comm) {
                gather_into(comm, block.flat(), block.numel(), master, padded)?;
            }
            Ok(())
        })
    }
}
