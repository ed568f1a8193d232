//! One optimizer step: accumulate gradients over `accumulation` micro-batches (each loss scaled
//! by 1/steps, and by the loss scale in fp16), check the gradients once (global norm and
//! non-finite values), let the loss scaler skip the step on overflow, clip by global norm while
//! unscaling, update the fp32 weights (master copies in mixed modes), cast them back to the
//! compute parameters, and clear the gradients.
//!
//! Not for: the loop around steps (see `mod.rs`).

use super::precision::{f32_copy, f32_range_copy, store_f32, store_f32_at, with_grads};
use super::schedule::learning_rate;
use super::shard::{ranges_within, shard_of};
use super::{TrainError, TrainEvent, Trainer};
use crate::scaler::ScalerDecision;
use headroom_memory::Category;
use headroom_nn::grad::{GradStats, grad_multiplier, grad_stats};
use headroom_nn::optim::FlatParams;
use headroom_tensor::backend::work::work_so_far;
use headroom_tensor::{DType, Tape, Tensor};
use std::ops::Range;

impl Trainer {
    /// Runs one optimizer step; returns its training loss (mean over micro-batches).
    pub(super) fn train_step(
        &mut self,
        on_event: &mut dyn FnMut(TrainEvent),
    ) -> Result<f64, TrainError> {
        let accumulation = self.config.accumulation();
        let (rank, world) = self.rank();
        let scale = self.scaler.map_or(1.0, |s| s.scale());
        let mut losses: Vec<f32> = Vec::with_capacity(accumulation);
        // A rank's share of the step's global batch: its `accumulation` micro-batches follow
        // those of the ranks before it, as one process accumulating them all would draw them.
        let micro_batch = self.config.micro_batch();
        self.skip_samples(micro_batch * accumulation * rank);
        // The leak guard compares every step's peak: measure this one on its own.
        self.device.lock().open_window();
        let history = if self.hooks.grow_step_buffer {
            let rows = self.step as usize + 1;
            Some(Tensor::zeros(
                &self.device,
                &[rows, 4096],
                DType::F32,
                Category::Activation,
                Some("hook.history"),
            )?)
        } else {
            None
        };
        // Deterministic accumulation: micro-batches after the first compute their gradient into
        // buffers of their own, added to the sum afterwards in order.
        let separate = (self.config.deterministic && accumulation > 1)
            .then(|| self.micro_gradients())
            .transpose()?;
        for micro in 0..accumulation {
            let work_before = if self.dry { work_so_far() } else { None };
            {
                let mut a = self.device.lock();
                a.trace_mut().set_step(self.step);
                a.trace_mut().set_phase(if micro == 0 {
                    "forward"
                } else {
                    "forward (accumulating)"
                });
            }
            let (x, y) = if self.dry {
                // No values on a shape-only device: the same tensors, without drawing tokens.
                self.sampler.skip_train(micro_batch);
                self.dry_batch_tensors(micro_batch)?
            } else {
                let batch = self.sampler.next_train(micro_batch);
                self.batch_tensors(&batch)?
            };
            let tape = Tape::new();
            let recompute = self.recompute.clone();
            let factor = scale / (accumulation * world) as f32;
            let (loss, scaled) = tape.record(|| -> Result<_, headroom_tensor::TensorError> {
                let loss = self.model.loss(&x, &y, &recompute)?;
                let scaled = loss.scale(factor)?;
                Ok((loss, scaled))
            })?;
            // A dry run (shape-only device) has no values to read.
            let value = if self.dry { 0.0 } else { loss.to_scalar_f32()? };
            if self.hooks.keep_losses {
                // The classic leak: keeping the loss tensor (not its value) for logging.
                self.kept.push(loss);
            } else {
                drop(loss);
            }
            self.device.lock().trace_mut().set_phase("backward");
            match &separate {
                Some((buffers, grads)) if micro > 0 => {
                    let mut grads = grads.borrow_mut();
                    tape.backward(&scaled, &mut grads)?;
                    for (block, buffer) in self.model.blocks().iter().zip(buffers) {
                        block.flat_grad().add_assign(buffer)?;
                        buffer.fill_(0.0)?;
                    }
                }
                _ => tape.backward(&scaled, &mut self.grads)?,
            }
            losses.push(value);
            if let (Some(before), Some(after)) = (work_before, work_so_far()) {
                self.micro_work = Some(after - before);
            }
            self.backward_passes += 1;
            self.check_accumulation(on_event);
        }
        self.skip_samples(micro_batch * accumulation * (world - 1 - rank));
        let loss = self.step_loss(&losses)?;
        self.reduce_gradients()?;
        if !loss.is_finite() && self.scaler.is_none() {
            return Err(TrainError::Diverged {
                step: self.step,
                loss,
            });
        }

        self.device.lock().trace_mut().set_phase("optimizer");
        let mut stats = self.gradient_stats()?;
        if self.hooks.force_overflow_at == Some(self.step) {
            stats.all_finite = false;
        }
        let apply = match self.scaler.as_mut() {
            Some(scaler) => scaler.update(!stats.all_finite) == ScalerDecision::Step,
            None => true,
        };
        if apply {
            let inv_scale = (1.0f64 / scale as f64) as f32;
            let multiplier = grad_multiplier(&stats, inv_scale, self.config.grad_clip);
            let lr = learning_rate(
                self.config.lr,
                self.step,
                self.config.warmup_steps,
                self.config.steps,
            );
            self.update_weights(multiplier, lr)?;
        }
        if !self.hooks.skip_zero_grad {
            for block in self.model.blocks() {
                block.zero_grad()?;
            }
            self.backward_passes = 0;
        }
        drop(history);
        self.step += 1;
        self.report.losses.push(loss);
        self.check_leaks(on_event);
        Ok(loss)
    }

    /// One zeroed gradient buffer per block (tagged `gradient`) and the bindings that send
    /// backward's contributions there.
    fn micro_gradients(
        &self,
    ) -> Result<(Vec<Tensor>, std::cell::RefCell<headroom_tensor::Gradients>), TrainError> {
        let mut grads = headroom_tensor::Gradients::new();
        let mut buffers = Vec::new();
        for block in self.model.blocks() {
            let g = block.flat_grad();
            let name = format!("{}.grad.micro", block.name());
            let buffer = Tensor::zeros(
                &self.device,
                g.shape(),
                g.dtype(),
                Category::Gradient,
                Some(&name),
            )?;
            block.bind_grads_to(&buffer, &mut grads)?;
            buffers.push(buffer);
        }
        Ok((buffers, std::cell::RefCell::new(grads)))
    }

    /// Advances the data past `samples` that other ranks train on.
    fn skip_samples(&mut self, samples: usize) {
        if samples > 0 {
            self.sampler.skip_train(samples);
        }
    }

    /// The step's loss: the mean over every micro-batch of every rank, summed in the order one
    /// process accumulating them all would sum them.
    fn step_loss(&mut self, losses: &[f32]) -> Result<f64, TrainError> {
        let all = match self.comm.as_mut() {
            None => losses.to_vec(),
            Some(comm) => {
                let mut all = vec![0.0; losses.len() * comm.world_size()];
                comm.all_gather(losses, &mut all)?;
                all
            }
        };
        let sum = all.iter().fold(0.0f64, |s, &l| s + l as f64);
        Ok(sum / all.len() as f64)
    }

    /// DDP: every block's gradient becomes the sum over ranks (each already scaled by
    /// 1/(accumulation × world)), summed in rank order; one all-reduce per block (the block
    /// is the bucket) through an f32 bucket from the device allocator, tagged
    /// `communication` and freed after it.
    fn reduce_gradients(&mut self) -> Result<(), TrainError> {
        let Some(comm) = self.comm.as_mut() else {
            return Ok(());
        };
        for block in self.model.blocks() {
            let grad = block.flat_grad();
            let label = format!("{}.grad.bucket", block.name());
            let mut bucket = f32_bucket(&self.device, block.numel(), &label)?;
            let Some(values) = bucket_values(&mut bucket) else {
                continue; // a dry run: the bucket's bytes are counted, nothing is reduced
            };
            grad.with_slice::<f32, _>(|g| values.copy_from_slice(g))
                .or_else(|_| grad.to_vec_f32().map(|g| values.copy_from_slice(&g)))?;
            comm.all_reduce_sum(values)?;
            store_f32(grad, values)?;
        }
        Ok(())
    }

    /// Warns once when gradients have been accumulated over more backward passes than the
    /// configured accumulation, i.e. they were never cleared.
    fn check_accumulation(&mut self, on_event: &mut dyn FnMut(TrainEvent)) {
        if self.backward_passes > self.config.accumulation() as u64 && !self.warned_accumulation {
            self.warned_accumulation = true;
            let message = format!(
                "gradients have been accumulated over {} backward passes, more than the configured accumulation of {}: they are never cleared. Call zero_grad() after each optimizer step (ParamBlock::zero_grad), or raise --accumulation if accumulating was intended.",
                self.backward_passes,
                self.config.accumulation()
            );
            self.report.warnings.push(message.clone());
            on_event(TrainEvent::Warning(message));
        }
    }

    /// Global norm and finiteness of all gradients, in block order.
    fn gradient_stats(&self) -> Result<GradStats, TrainError> {
        let mut total = GradStats {
            sum_squares: 0.0,
            all_finite: true,
        };
        if self.dry {
            return Ok(total);
        }
        for block in self.model.blocks() {
            let s = with_grads(block.flat_grad(), |g| grad_stats([g]))?;
            total.sum_squares += s.sum_squares;
            total.all_finite &= s.all_finite;
        }
        Ok(total)
    }

    /// The optimizer update on fp32 weights: the parameters themselves (fp32), the master copies
    /// (mixed modes, then cast back), or a temporary fp32 copy (pure bf16). Under ZeRO-1 each
    /// rank updates its shard of every block only (its optimizer state and master weights
    /// cover just that), then the updated parameters are gathered from every rank.
    fn update_weights(&mut self, multiplier: f32, lr: f32) -> Result<(), TrainError> {
        let (rank, world) = self.rank();
        let sharded = self.sharded();
        let shards: Vec<(Range<usize>, usize)> = self
            .model
            .blocks()
            .iter()
            .map(|b| match sharded {
                true => shard_of(b.numel(), rank, world),
                false => (0..b.numel(), b.numel()),
            })
            .collect();
        let lens: Vec<usize> = shards.iter().map(|(r, _)| r.len()).collect();
        self.optimizer.reserve_state(&lens)?;
        // From here on an out-of-memory error may leave some blocks updated: not recoverable.
        self.weights_touched = true;
        self.optimizer.begin_step();
        for (i, block) in self.model.blocks().iter().enumerate() {
            let (range, padded) = shards[i].clone();
            let ranges = ranges_within(&block.ranges(), &range);
            let scratch;
            let weights = match &self.master {
                Some(master) => &master[i],
                None if block.flat().dtype() == headroom_tensor::DType::F32 => block.flat(),
                None => {
                    let name = format!("{}.fp32", block.name());
                    scratch = match sharded {
                        true => {
                            f32_range_copy(block.flat(), range.clone(), Category::Temporary, &name)?
                        }
                        false => f32_copy(block.flat(), Category::Temporary, &name)?,
                    };
                    &scratch
                }
            };
            if self.dry {
                // Same allocations as a real update (state, scratch), no arithmetic.
                continue;
            }
            // The shard's place in `weights`: the full flat buffer, or a shard-sized copy.
            let in_place = std::ptr::eq(weights, block.flat());
            let at = if in_place {
                range.clone()
            } else {
                0..range.len()
            };
            let optimizer = &mut self.optimizer;
            with_grads(block.flat_grad(), |grads| {
                weights.with_slice_mut::<f32, _>(|params| {
                    let mut group = FlatParams {
                        params: &mut params[at],
                        grads: grads.range(range.clone()),
                        tensors: &ranges,
                    };
                    optimizer.update_group(i, &mut group, multiplier, lr)
                })
            })???;
            let updated = match in_place {
                true => None,
                false => {
                    let values = weights.to_vec_f32()?;
                    store_f32_at(block.flat(), range.start, &values)?;
                    Some(values)
                }
            };
            if let (true, Some(comm)) = (sharded, self.comm.as_deref_mut()) {
                // This rank's updated shard: the values just stored, or its range of the flat.
                let shard = match updated {
                    Some(values) => values,
                    None => weights.with_slice::<f32, _>(|p| p[range.clone()].to_vec())?,
                };
                gather_shards(comm, block.flat(), block.numel(), shard, padded)?;
            }
        }
        Ok(())
    }
}

/// ZeRO-1: every rank's updated shard of a block's flat parameters into every rank's copy.
fn gather_shards(
    comm: &mut dyn headroom_dist::Communicator,
    flat: &Tensor,
    numel: usize,
    mut shard: Vec<f32>,
    padded: usize,
) -> Result<(), TrainError> {
    shard.resize(padded, 0.0);
    // The gathered parameters land in a bucket from the device allocator (`communication`).
    let device = flat.device();
    let mut bucket = f32_bucket(&device, padded * comm.world_size(), "params.gather.bucket")?;
    let Some(all) = bucket_values(&mut bucket) else {
        return Ok(());
    };
    comm.all_gather(&shard, all)?;
    store_f32(flat, &all[..numel])?;
    Ok(())
}

/// A bucket of `len` f32 values from the device allocator, tagged `communication`.
fn f32_bucket(
    device: &headroom_memory::Device,
    len: usize,
    label: &str,
) -> Result<headroom_memory::DeviceBuffer, TrainError> {
    Ok(device.alloc(4 * len as u64, Category::Communication, Some(label))?)
}

/// A bucket's values (`None` on a shape-only device, which holds no bytes).
fn bucket_values(bucket: &mut headroom_memory::DeviceBuffer) -> Option<&mut [f32]> {
    bucket.as_bytes_mut().map(bytemuck::cast_slice_mut)
}
