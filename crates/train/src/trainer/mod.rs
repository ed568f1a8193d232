//! The trainer: micro-batches and gradient accumulation (the loss scaled by 1/steps), mixed
//! precision with fp32 master weights and dynamic loss scaling, gradient clipping by global norm,
//! the optimizer step on flat buffers, gradients cleared after each step (and a guard that warns
//! once when gradients pile up over more backward passes than configured), validation without a
//! tape, optional `empty_cache` after validation, saves and the run report. Logging keeps
//! scalars only.
//!
//! Not for: choosing a strategy (the planner) or drawing reports (the CLI).
//!
//! Submodules: `batches` (token tensors, validation), `build`, `step`, `shard` (ZeRO's shards
//! and the collectives that move them), `zero` (ZeRO-2/3 hooks around parameter scopes),
//! `save`, `precision`, `schedule`, `guard`, `events`, `fault` (injected failures).

mod accumulate;
mod batches;
mod block_uses;
mod build;
mod events;
mod fault;
mod fused_step;
mod group;
mod guard;
mod hf_export;
mod host_grads;
mod init_from;
mod lora;
mod offload;
mod offload_step;
mod precision;
mod save;
mod schedule;
mod shard;
mod step;
mod tensor_parallel;
mod trust;
mod update;
mod zero;

pub use build::{model_spec, optimizer_state_dtype};
pub use events::{TrainError, TrainEvent, TrainerHooks};
pub use fault::{Fault, FaultKind, fault_for_rank};
pub use guard::LeakGuard;
pub use offload::{IO_WORKERS, SWAP_BUFFERS};
pub use precision::compute_dtype;
pub use schedule::learning_rate;

use group::effective_stage;
use headroom_strategy::ZeroStage;

use crate::config::RunConfig;
use crate::data::{Corpus, Loader};
use crate::recompute::policy::{BudgetDecision, recompute_for};
use crate::report::{CacheRelease, TrainReport};
use crate::scaler::LossScaler;
use headroom_comm::Communicator;
use headroom_memory::Device;
use headroom_nn::models::ModelSpec;
use headroom_nn::optim::Optimizer;
use headroom_nn::{Model, Recompute};
use headroom_strategy::Precision;
use headroom_tensor::backend::work::Work;
use headroom_tensor::{DType, Gradients, Tensor};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// A training run in progress.
pub struct Trainer {
    config: RunConfig,
    precision: Precision,
    device: Device,
    model: Box<dyn Model>,
    spec: ModelSpec,
    /// fp32 master weights per block (mixed modes).
    master: Option<Vec<Tensor>>,
    grads: Gradients,
    optimizer: Optimizer,
    scaler: Option<LossScaler>,
    sampler: Loader,
    seq_len: usize,
    recompute: Recompute,
    /// How `budget:SIZE` was met, when that is the policy.
    budget_decision: Option<BudgetDecision>,
    step: u64,
    backward_passes: u64,
    warned_accumulation: bool,
    hooks: TrainerHooks,
    /// Set from outside (a signal handler) to stop after the current step.
    stop: Option<Arc<AtomicBool>>,
    /// This rank's communicator when the run is data-parallel (or, alone, offloads ZeRO-3
    /// parameters: a group of one).
    comm: Option<Box<dyn Communicator>>,
    /// This rank's tensor-parallel group when the model is split over ranks (`comm` is then
    /// none: there is no data-parallel group).
    tensor_parallel: Option<std::sync::Arc<headroom_comm::TensorParallelGroup>>,
    /// Offloaded states (`--offload-optimizer`, `--offload-params`).
    offload: Option<offload::Offloaded>,
    /// Host memory for the checkpointed blocks' inputs (`--offload-activations cpu`), shared
    /// with the offload tiers' budget.
    activation_pool: Option<headroom_memory::host_pool::HostPool>,
    report: TrainReport,
    /// Whether the current step has started changing weights (then an OOM is not recoverable).
    weights_touched: bool,
    /// The run starts from a checkpoint's weights: it is validated before the first step, so
    /// the report holds the pretrained model's loss.
    pretrained: bool,
    /// Tensors kept by the `keep_losses` hook.
    kept: Vec<Tensor>,
    leak_guard: LeakGuard,
    /// Running on a shape-only device: allocations and frees only, no values.
    dry: bool,
    /// On a shape-only device: the counted work of the last micro-batch (forward and backward),
    /// from which a dry run extrapolates accumulation it did not run.
    micro_work: Option<Work>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model.name())
            .field("step", &self.step)
            .finish()
    }
}

impl Trainer {
    /// Builds the model, optimizer and data for `config` on a fresh CPU device of
    /// `config.device_memory` bytes.
    pub fn new(config: RunConfig, corpus: &Corpus) -> Result<Trainer, TrainError> {
        let device = Device::cpu(config.device_memory, config.allocator.config());
        Trainer::on_device(config, corpus, device)
    }

    /// As [`Trainer::new`] on a given device.
    pub fn on_device(
        config: RunConfig,
        corpus: &Corpus,
        device: Device,
    ) -> Result<Trainer, TrainError> {
        Trainer::build(config, corpus, device, None, None)
    }

    /// One rank of a data-parallel group (DDP, and ZeRO-1 when the configuration's placement
    /// says so): each rank draws its own share of every global batch, and gradients are summed
    /// over ranks in rank order before the optimizer step; under ZeRO-1 each rank keeps the
    /// optimizer state and master weights of its shard of every block only, updates that
    /// shard, and the updated parameters are gathered. With accumulation 1 the run is bitwise
    /// the single-process run accumulating `world` micro-batches in deterministic mode.
    pub fn on_rank(
        config: RunConfig,
        corpus: &Corpus,
        device: Device,
        comm: Box<dyn Communicator>,
    ) -> Result<Trainer, TrainError> {
        Trainer::build_rank(config, corpus, device, Some(comm), None)
    }

    /// The trainer of a prepared run on `device`, rank `comm` of its group when given, with the
    /// arena layout `prepare` recorded for that rank (`--allocator planned`).
    pub fn prepared(
        prepared: &crate::predict::prepare::PreparedRun,
        corpus: &Corpus,
        device: Device,
        comm: Option<Box<dyn Communicator>>,
    ) -> Result<Trainer, TrainError> {
        let rank = comm.as_ref().map_or(0, |c| c.rank());
        let arena = prepared.arena_layouts.get(rank).cloned();
        Trainer::build_rank(prepared.config.clone(), corpus, device, comm, arena)
    }

    /// As `build`; a rank of a group never recovers from running out of memory alone.
    fn build_rank(
        config: RunConfig,
        corpus: &Corpus,
        device: Device,
        comm: Option<Box<dyn Communicator>>,
        arena: Option<headroom_memory::ArenaLayout>,
    ) -> Result<Trainer, TrainError> {
        let mut config = config;
        if comm.is_some() {
            // Recovering from an out-of-memory error would need every rank to agree on it.
            config.oom_recovery = false;
        }
        Trainer::build(config, corpus, device, comm, arena)
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The dtype of parameters, gradients and activations.
    pub fn compute_dtype(&self) -> DType {
        compute_dtype(self.precision)
    }

    /// Whether optimizer states (and master weights) are sharded over the group (ZeRO ≥ 1).
    fn sharded(&self) -> bool {
        self.zero_stage().shards_optimizer()
    }

    /// The ZeRO stage in effect: the configured one in a group of several ranks, else 0.
    fn zero_stage(&self) -> ZeroStage {
        effective_stage(&self.config, self.rank().1)
    }

    /// This rank of the data-parallel group and the group's size (0 of 1 without one).
    pub fn rank(&self) -> (usize, usize) {
        self.comm
            .as_ref()
            .map_or((0, 1), |c| (c.rank(), c.world_size()))
    }

    /// This rank and its group's size, whichever group it belongs to: the data-parallel one
    /// ([`Trainer::rank`]) or the tensor-parallel one a split model runs over (whose ranks all
    /// read the same batches, so `rank` is 0 of 1 there).
    pub fn group_rank(&self) -> (usize, usize) {
        match &self.tensor_parallel {
            Some(g) => {
                use headroom_tensor::ShardGroup;
                (g.rank(), g.world())
            }
            None => self.rank(),
        }
    }

    /// Marks this rank's part of the run complete (see `Communicator::complete`).
    pub fn complete(&mut self) {
        if let Some(comm) = self.comm.as_mut() {
            comm.complete();
        }
        if let Some(g) = &self.tensor_parallel {
            g.with_comm(|c| c.complete());
        }
    }

    /// What this rank has communicated.
    pub fn collective_counts(&self) -> Option<headroom_comm::CollectiveCounts> {
        self.comm.as_ref().map(|c| c.counts())
    }

    /// A flag that, once set, ends training after the step in progress (the report says so in
    /// `stopped_at_step`): how a signal stops a run without losing the step.
    pub fn set_stop_flag(&mut self, stop: Arc<AtomicBool>) {
        self.stop = Some(stop);
    }

    pub fn set_hooks(&mut self, hooks: TrainerHooks) {
        self.hooks = hooks;
    }

    /// Replaces what the model recomputes in backward (the trainer plans it from the
    /// configured checkpoint policy; experiments may set a plan of their own).
    pub fn set_recompute(&mut self, recompute: Recompute) {
        self.recompute = recompute;
    }

    /// What the model recomputes in backward instead of storing.
    pub fn recompute(&self) -> &Recompute {
        &self.recompute
    }

    /// How a `budget:SIZE` policy was met (the plans decided between), if that is the policy.
    pub fn budget_decision(&self) -> Option<&BudgetDecision> {
        self.budget_decision.as_ref()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The resolved model architecture (overrides applied).
    pub fn model_spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }

    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Optimizer steps completed.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Changes the micro-batch before training starts (e.g. to the largest that fits) and plans
    /// the recomputation again for it.
    pub fn set_micro_batch(&mut self, micro_batch: usize) -> Result<(), TrainError> {
        self.config = self
            .config
            .with_split(micro_batch, self.config.accumulation());
        self.report.config = self.config.clone();
        (self.recompute, self.budget_decision) = recompute_for(
            self.config.strategy.checkpoint,
            self.config.strategy.loss,
            &self.spec,
            compute_dtype(self.precision),
            micro_batch,
            self.seq_len,
        )?;
        Ok(())
    }

    /// Records in the report what preparing the run decided and predicted.
    pub fn set_prepared(&mut self, prepared: &crate::predict::prepare::PreparedRun) {
        self.set_prediction(&prepared.prediction);
        if let Some(choice) = &prepared.auto {
            self.set_auto_choice(choice.clone());
        }
    }

    /// Puts a dry run's prediction next to the measurements in the report.
    pub fn set_prediction(&mut self, p: &crate::predict::Prediction) {
        self.report.predicted_peak_bytes = Some(p.memory.peak_allocated_bytes);
        self.report.predicted_breakdown = Some(p.memory.breakdown);
    }

    /// Records in the report what `--auto` chose.
    pub fn set_auto_choice(&mut self, choice: crate::report::AutoChoice) {
        self.report.auto = Some(choice);
    }

    /// The counted work of the last micro-batch of a dry run (`None` on a real device, or
    /// outside a `count_work` scope).
    pub fn last_micro_batch_work(&self) -> Option<Work> {
        self.micro_work
    }

    pub fn report(&self) -> &TrainReport {
        &self.report
    }

    pub fn scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Runs until `config.steps` optimizer steps are done, validating every `eval_every` steps
    /// and at the end, saving every `save_every` steps; returns the report.
    pub fn train(
        &mut self,
        on_event: &mut dyn FnMut(TrainEvent),
    ) -> Result<&TrainReport, TrainError> {
        let started = Instant::now();
        let mut tokens = 0u64;
        let counted_from = (self.collective_counts().unwrap_or_default(), self.step);
        if self.pretrained && self.step == 0 && self.config.steps > 0 {
            let loss = self.validate()?;
            on_event(TrainEvent::Validation { step: 0, loss });
        }
        while self.step < self.config.steps {
            let t0 = Instant::now();
            let position = self.sampler.position();
            let rng = headroom_tensor::rng::get_state();
            self.weights_touched = false;
            let loss = match self.train_step(on_event) {
                Ok(loss) => loss,
                Err(TrainError::OutOfMemory(oom)) if self.group_rank().1 > 1 && !self.dry => {
                    return Err(self.group_out_of_memory(oom));
                }
                Err(TrainError::OutOfMemory(oom))
                    if self.config.oom_recovery && !self.weights_touched =>
                {
                    self.recover_from_oom(oom, position, rng, on_event)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let dt = t0.elapsed().as_secs_f64();
            tokens += (self.config.effective_batch() * self.seq_len) as u64;
            self.report.step_times_s.push(dt);
            let tokens_per_s = tokens as f64 / started.elapsed().as_secs_f64().max(1e-9);
            let a = self.device.lock();
            on_event(TrainEvent::Step {
                step: self.step,
                total: self.config.steps,
                loss,
                tokens_per_s,
                allocated: a.allocated(),
                reserved: a.reserved(),
                capacity: a.capacity(),
            });
            drop(a);
            self.after_step(on_event)?;
            if self.stop_requested()? {
                self.report.stopped_at_step = Some(self.step);
                break;
            }
        }
        let total_time = self.report.step_times_s.iter().sum::<f64>();
        let total_tokens =
            (self.report.step_times_s.len() * self.config.effective_batch() * self.seq_len) as f64;
        self.report.tokens_per_s = if total_time > 0.0 {
            total_tokens / total_time
        } else {
            0.0
        };
        self.report.skipped_steps = self.scaler.map_or(0, |s| s.skipped_steps);
        let stats = self.device.stats();
        self.report.set_memory(&stats);
        self.report.set_loader(self.sampler.report());
        self.report.communication = self.communication_since(counted_from);
        self.report.offload = self.offload.as_ref().map(|o| o.report());
        self.report.offloaded_activations_peak_bytes =
            self.activation_pool.as_ref().map(|p| p.stats().peak_bytes);
        self.report.arena = self.device.lock().arena_report();
        Ok(&self.report)
    }

    /// Whether a stop was asked for; in a group every rank agrees (any rank's request stops
    /// all of them after the same step).
    fn stop_requested(&mut self) -> Result<bool, TrainError> {
        let here = self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst));
        match self.comm.as_mut() {
            None => Ok(here),
            Some(comm) => {
                let mut votes = [f32::from(u8::from(here))];
                comm.all_reduce_sum(&mut votes)?;
                Ok(votes[0] > 0.0)
            }
        }
    }

    /// After an optimizer step: validation (and `empty_cache`) when due, a save when due.
    fn after_step(&mut self, on_event: &mut dyn FnMut(TrainEvent)) -> Result<(), TrainError> {
        let last = self.step == self.config.steps;
        if (self.config.eval_every > 0 && self.step.is_multiple_of(self.config.eval_every)) || last
        {
            let v = self.validate()?;
            on_event(TrainEvent::Validation {
                step: self.step,
                loss: v,
            });
            if self.config.empty_cache_after_eval {
                let before = self.device.lock().reserved();
                self.device.empty_cache();
                let after = self.device.lock().reserved();
                self.report.cache_releases.push(CacheRelease {
                    step: self.step,
                    reserved_before: before,
                    reserved_after: after,
                });
                on_event(TrainEvent::CacheEmptied {
                    step: self.step,
                    reserved_before: before,
                    reserved_after: after,
                });
            }
        }
        if let Some(dir) = self.config.hf_out.clone().filter(|_| last) {
            self.export_hf(&dir)?;
            if self.rank().0 == 0 && !self.dry {
                on_event(TrainEvent::Exported {
                    path: dir.display().to_string(),
                });
            }
        }
        let every = self.config.save_every;
        // Every rank joins a save (ZeRO-1 gathers its shards); rank 0 alone writes it.
        if let Some(dir) = self.config.save_dir.clone()
            && (last || (every > 0 && self.step.is_multiple_of(every)))
        {
            let path = self.save(&dir)?;
            if self.rank().0 == 0 {
                on_event(TrainEvent::Saved {
                    step: self.step,
                    path: path.display().to_string(),
                });
            }
        }
        Ok(())
    }
}
