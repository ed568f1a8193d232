//! One optimizer step: accumulate gradients over `accumulation` micro-batches (each loss scaled
//! by 1/steps, and by the loss scale in fp16; summed in f32, see `accumulate`), reduce them
//! over the ranks of a group, check the gradients once (global norm and non-finite values), let
//! the loss scaler skip the step on overflow, clip by global norm while unscaling, update the
//! fp32 weights (master copies in mixed modes), cast them back to the compute parameters, and
//! clear the gradients.
//!
//! Not for: the loop around steps (see `mod.rs`).

use super::accumulate::GradSums;
use super::fault::{Fault, FaultKind};
use super::precision::{store_f32, with_grads};
use super::schedule::learning_rate;
use super::shard::{bucket_values, f32_bucket, reduce_scatter_in_place, shard_of};
use super::{TrainError, TrainEvent, Trainer};
use crate::report::{PHASE_STEPS, Phase, PhaseBytes};
use crate::scaler::ScalerDecision;
use headroom_comm::Collective;
use headroom_memory::Category;
use headroom_nn::grad::{GradStats, grad_multiplier, grad_stats};
use headroom_tensor::backend::work::work_so_far;
use headroom_tensor::{DType, Tape, Tensor};

/// The planned arena's window of a run's first optimizer step.
pub const FIRST_STEP_WINDOW: &str = "first step";
/// The planned arena's window of the model's construction: its parameters, gradients and master
/// weights are permanent (the arena's bottom region).
pub const INIT_WINDOW: &str = "init";
/// The planned arena's window of every later optimizer step.
pub const STEP_WINDOW: &str = "step";
/// The planned arena's window of a validation.
pub const EVALUATION_WINDOW: &str = "evaluation";

/// Fails as `fault` says.
fn inject(fault: Fault) -> Result<(), TrainError> {
    match fault.kind {
        FaultKind::Error => Err(TrainError::Injected { step: fault.step }),
        FaultKind::Panic => panic!("injected panic at step {} (HEADROOM_FAULT)", fault.step),
        FaultKind::Sleep => {
            std::thread::sleep(std::time::Duration::from_secs(3600));
            Ok(())
        }
    }
}

impl Trainer {
    /// Runs one optimizer step; returns its training loss (mean over micro-batches).
    pub(super) fn train_step(
        &mut self,
        on_event: &mut dyn FnMut(TrainEvent),
    ) -> Result<f64, TrainError> {
        if let Some(fault) = self.hooks.fault.filter(|f| f.step == self.step) {
            inject(fault)?;
        }
        let accumulation = self.config.accumulation();
        let (rank, world) = self.rank();
        let scale = self.scaler.map_or(1.0, |s| s.scale());
        let mut losses: Vec<f32> = Vec::with_capacity(accumulation);
        // A rank's share of the step's global batch: its `accumulation` micro-batches follow
        // those of the ranks before it, as one process accumulating them all would draw them.
        let micro_batch = self.config.micro_batch();
        self.skip_samples(micro_batch * accumulation * rank);
        // The leak guard compares every step's peak: measure this one on its own.
        {
            let mut a = self.device.lock();
            a.open_window();
            // The planned arena's window: the first step also creates the optimizer state.
            a.begin_window(if self.report.losses.is_empty() {
                FIRST_STEP_WINDOW
            } else {
                STEP_WINDOW
            });
        }
        self.note_phase(Phase::Start, 0);
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
        // Each micro-batch's gradient summed whole into f32 sums (`accumulate`): always for
        // 16-bit gradients, in deterministic mode for fp32 ones (which otherwise accumulate in
        // the gradient itself).
        let host_grads = self
            .offload
            .as_ref()
            .is_some_and(|o| o.host_grads.is_some());
        let sums = GradSums::for_step(
            self.model.blocks(),
            &self.device,
            accumulation,
            (self.zero_stage(), host_grads),
            self.config.deterministic,
        )?;
        // The step in backward: each block updated as its gradient completes, with the
        // learning rate of the ordinary step and its multiplier without clipping or loss scale.
        let in_backward = self.config.strategy.optimizer_in_backward.then(|| {
            let lr = learning_rate(
                self.config.lr,
                self.step,
                self.config.warmup_steps,
                self.config.steps,
            );
            (1.0, lr)
        });
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
                self.next_batch_tensors(micro_batch, on_event)?
            };
            let factor = scale / (accumulation * world) as f32;
            let pass = |t: &mut Self| t.forward_backward(micro, &x, &y, factor);
            let value = match in_backward {
                Some(update) => self.with_step_in_backward(update, pass)?,
                None => self.with_zero(sums.as_ref(), pass)?,
            };
            if let Some(sums) = &sums {
                let last = micro + 1 == accumulation;
                sums.add_micro_batch(self.model.blocks(), micro, last)?;
            }
            self.note_phase(Phase::Backward, micro);
            losses.push(value);
            if let (Some(before), Some(after)) = (work_before, work_so_far()) {
                self.micro_work = Some(after - before);
            }
            self.backward_passes += 1;
            self.check_accumulation(on_event);
        }
        self.skip_samples(micro_batch * accumulation * (world - 1 - rank));
        let loss = self.step_loss(&losses)?;
        if in_backward.is_none() {
            self.reduce_gradients(sums.as_ref())?;
        }
        // The host's f32 sums of offloaded ZeRO-2/3 gradients, rounded as a device shard's.
        if let Some(h) = self.offload.as_mut().and_then(|o| o.host_grads.as_mut()) {
            h.round_to_compute();
        }
        if !loss.is_finite() && self.scaler.is_none() {
            return Err(TrainError::Diverged {
                step: self.step,
                loss,
            });
        }
        if in_backward.is_none() {
            self.ordinary_update(scale)?;
        }

        if !self.hooks.skip_zero_grad {
            self.zero_grads()?;
            self.backward_passes = 0;
        }
        // Freed inside the step's window, so the planned arena packs them with the step.
        drop(sums);
        drop(history);
        self.device.lock().end_window();
        self.note_phase(Phase::Step, accumulation - 1);
        self.step += 1;
        self.report.losses.push(loss);
        self.check_leaks(on_event);
        Ok(loss)
    }

    /// The step after backward: the gradients' norm and finiteness, the loss scaler's verdict,
    /// clipping, and the update of every block.
    fn ordinary_update(&mut self, scale: f32) -> Result<(), TrainError> {
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
        Ok(())
    }

    /// One micro-batch's forward and backward; returns its loss (0 in a dry run). With
    /// activation offload, the checkpointed blocks' inputs wait in host memory in between.
    fn forward_backward(
        &mut self,
        micro: usize,
        x: &Tensor,
        y: &Tensor,
        factor: f32,
    ) -> Result<f32, TrainError> {
        match self.activation_pool.clone() {
            Some(pool) => headroom_tensor::with_activation_offload(pool, || {
                self.recorded_pass(micro, x, y, factor)
            }),
            None => self.recorded_pass(micro, x, y, factor),
        }
    }

    fn recorded_pass(
        &mut self,
        micro: usize,
        x: &Tensor,
        y: &Tensor,
        factor: f32,
    ) -> Result<f32, TrainError> {
        let tape = Tape::new();
        let recompute = self.recompute.clone();
        let (loss, scaled) = tape.record(|| -> Result<_, headroom_tensor::TensorError> {
            let loss = self.model.loss(x, y, &recompute)?;
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
        self.note_phase(Phase::Forward, micro);
        self.device.lock().trace_mut().set_phase("backward");
        tape.backward(&scaled, &mut self.grads)?;
        Ok(value)
    }

    /// Every gradient back to zero: the blocks' buffers and the host's reduced shards.
    pub(super) fn zero_grads(&mut self) -> Result<(), TrainError> {
        for block in self.model.blocks() {
            block.zero_grad()?;
        }
        if let Some(h) = self.offload.as_mut().and_then(|o| o.host_grads.as_mut()) {
            h.zero();
        }
        Ok(())
    }

    /// Records the device's bytes per category at `phase` during the first steps.
    fn note_phase(&mut self, phase: Phase, micro_batch: usize) {
        if self.step < PHASE_STEPS {
            let allocated = self.device.stats().current_category_bytes();
            self.report.phases.push(PhaseBytes {
                step: self.step,
                micro_batch,
                phase,
                allocated,
            });
        }
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
    /// `communication` and freed after it. ZeRO-1: a reduce-scatter per block instead, each
    /// rank receiving the sum over its own shard (the only part its optimizer reads).
    ///
    /// With f32 sums of 16-bit gradients (`accumulate`) the collectives read the sums, and the
    /// reduced values are rounded into the gradient once; alone, or under ZeRO-2/3 (whose
    /// shards were reduced in backward), the sums are rounded into the gradient here.
    fn reduce_gradients(&mut self, sums: Option<&GradSums>) -> Result<(), TrainError> {
        let stage = self.zero_stage();
        let (rank, world) = self.rank();
        let comm = match self.comm.as_mut() {
            Some(comm) if !stage.shards_gradients() => comm,
            // Reduce-scattered block by block in backward, or nothing to reduce.
            _ => return sums.map_or(Ok(()), |s| s.round_into(self.model.blocks())),
        };
        for (i, block) in self.model.blocks().iter().enumerate() {
            let grad = block.flat_grad();
            // What the collective reads: the f32 sum, or the gradient itself.
            let source = sums.map_or(grad, |s| s.sum(i));
            let label = format!("{}.grad.bucket", block.name());
            if stage.shards_optimizer() {
                let (range, padded) = shard_of(block.numel(), rank, world);
                reduce_scatter_in_place(comm.as_mut(), source, grad, range, padded, &label)?;
                continue;
            }
            let mut bucket = f32_bucket(&self.device, block.numel(), &label)?;
            let Some(values) = bucket_values(&mut bucket) else {
                // A dry run: the bucket's bytes and the collective are counted, nothing moves.
                comm.without_data(Collective::AllReduce, block.numel())?;
                continue;
            };
            source
                .with_slice::<f32, _>(|g| values.copy_from_slice(g))
                .or_else(|_| source.to_vec_f32().map(|g| values.copy_from_slice(&g)))?;
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

    /// Global norm and finiteness of all gradients, in block order. Under ZeRO each rank holds
    /// the reduced sum of a shard of every gradient only (ZeRO-1: a range of the full buffer;
    /// ZeRO-2/3: a shard buffer): its partial sums are gathered and added in rank order (as
    /// f64, each sent as two f32 halves), so every rank gets the same statistics.
    fn gradient_stats(&mut self) -> Result<GradStats, TrainError> {
        if let Some(group) = self.tensor_parallel.clone() {
            return self.tensor_parallel_stats(&group);
        }
        let mut total = GradStats {
            sum_squares: 0.0,
            all_finite: true,
        };
        let (rank, world) = self.rank();
        let sharded = self.zero_stage().shards_optimizer();
        if self.dry {
            if let (true, Some(comm)) = (sharded, self.comm.as_mut()) {
                comm.without_data(Collective::AllGather, 3)?;
            }
            return Ok(total);
        }
        let host_grads = self.offload.as_ref().and_then(|o| o.host_grads.as_ref());
        for (i, block) in self.model.blocks().iter().enumerate() {
            let s = match block
                .shard()
                .and_then(|s| s.grads.as_ref().map(|g| (g, &s.range)))
            {
                Some((_, range)) if sharded && host_grads.is_some() => {
                    let host = host_grads.expect("checked");
                    grad_stats([host.grads(i, range.len()).expect("a real run has bytes")])
                }
                Some((g, range)) if sharded => {
                    with_grads(g, |g| grad_stats([g.range(0..range.len())]))?
                }
                _ if sharded => {
                    let (range, _) = shard_of(block.numel(), rank, world);
                    with_grads(block.flat_grad(), |g| grad_stats([g.range(range)]))?
                }
                _ => with_grads(block.flat_grad(), |g| grad_stats([g]))?,
            };
            total.sum_squares += s.sum_squares;
            total.all_finite &= s.all_finite;
        }
        if let (true, Some(comm)) = (sharded, self.comm.as_mut()) {
            let hi = total.sum_squares as f32;
            let lo = (total.sum_squares - hi as f64) as f32;
            let mine = [hi, lo, f32::from(u8::from(total.all_finite))];
            let mut all = vec![0.0f32; 3 * comm.world_size()];
            comm.all_gather(&mine, &mut all)?;
            total = GradStats {
                sum_squares: all
                    .chunks_exact(3)
                    .fold(0.0f64, |s, r| s + (r[0] as f64 + r[1] as f64)),
                all_finite: all.chunks_exact(3).all(|r| r[2] == 1.0),
            };
        }
        Ok(total)
    }
}
