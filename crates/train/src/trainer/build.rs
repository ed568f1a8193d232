//! Building a run's parts from its configuration: the trainer itself (`Trainer::build`: data,
//! recomputation plan, model laid out for its ZeRO stage, optimizer, offload tiers, master
//! weights, loss scaler), the model's shape (preset or file with the overrides applied), the
//! optimizer's configuration from the vocabulary, and the fp32 master copies of the weights.
//!
//! Not for: the loop (see `step`, `Trainer::train`).

use super::group::{effective_stage, solo_rank};
use super::guard::LeakGuard;
use super::precision::compute_dtype;
use super::shard::shard_of;
use super::{TrainError, Trainer, TrainerHooks, offload, precision};
use crate::config::{ConfigError, RunConfig};
use crate::data::Corpus;
use crate::data::source::run_loader;
use crate::recompute::policy::recompute_for;
use crate::report::TrainReport;
use crate::scaler::{LossScaler, ScalerConfig};
use headroom_comm::Communicator;
use headroom_memory::{AllocatorKind, ArenaLayout, Category, Device};
use headroom_nn::Model;
use headroom_nn::models::{ModelSpec, build_model, build_parallel_model};
use headroom_nn::optim::{Optimizer, OptimizerConfig, StateDtype, TensorShape, UpdateRule};
use headroom_tensor::{Gradients, ShardLayout, Tensor, with_sharding};

/// The model `config` trains: its preset or file with the shape overrides, dropout and
/// attention kind applied, checked (a bad shape names the field).
pub fn model_spec(config: &RunConfig) -> Result<ModelSpec, TrainError> {
    let spec = unchecked_model_spec(config)?;
    spec.validate()?;
    Ok(spec)
}

fn unchecked_model_spec(config: &RunConfig) -> Result<ModelSpec, TrainError> {
    let spec = ModelSpec::resolve(&config.model)?.with_overrides(
        config.layers,
        config.width,
        config.heads,
        config.seq_len,
    );
    Ok(match spec {
        ModelSpec::Gpt(mut c) => {
            c.dropout = config.dropout.unwrap_or(c.dropout);
            c.attention = config.strategy.attention;
            c.lora = config.lora.clone();
            ModelSpec::Gpt(c)
        }
        ModelSpec::Resmlp(_) if config.lora.is_some() => {
            return Err(TrainError::Config(ConfigError::Value {
                key: "lora_rank",
                value: config.lora.as_ref().map_or(0, |l| l.rank).to_string(),
                reason: format!(
                    "LoRA adapts a transformer's projections, and '{}' is a residual MLP; use a GPT model (e.g. --model gpt-small) or drop --lora-rank",
                    config.model
                ),
            }));
        }
        ModelSpec::Resmlp(mut c) => {
            c.dropout = config.dropout.unwrap_or(c.dropout);
            ModelSpec::Resmlp(c)
        }
        ModelSpec::Llama(mut c) => {
            c.dropout = config.dropout.unwrap_or(c.dropout);
            c.attention = config.strategy.attention;
            c.lora = config.lora.clone();
            ModelSpec::Llama(c)
        }
    })
}

/// fp32 master copies of every block's flat parameters, tagged `master_weight`: whole, or
/// under ZeRO only rank r's shard of each block (`shard` = (rank, world)), copied from the
/// full parameters or, under ZeRO-3, from the block's parameter shard.
pub(super) fn master_weights(
    model: &dyn Model,
    shard: Option<(usize, usize)>,
) -> Result<Vec<Tensor>, TrainError> {
    let copies = model
        .blocks()
        .iter()
        .map(|b| {
            let name = format!("{}.master", b.name());
            match shard {
                None => precision::f32_copy(b.flat(), Category::MasterWeight, &name),
                Some((rank, world)) => {
                    let (range, _) = shard_of(b.numel(), rank, world);
                    match b.shard().and_then(|s| s.params.as_ref()) {
                        Some(p) => precision::f32_range_copy(
                            p,
                            0..range.len(),
                            Category::MasterWeight,
                            &name,
                        ),
                        None => precision::f32_range_copy(
                            b.flat(),
                            range,
                            Category::MasterWeight,
                            &name,
                        ),
                    }
                }
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(copies)
}

/// The format of `config`'s optimizer states (f32, bf16 or 8-bit).
pub fn optimizer_state_dtype(config: &RunConfig) -> Result<StateDtype, TrainError> {
    Ok(optimizer_config(config)?.state_dtype)
}

pub(super) fn optimizer_config(config: &RunConfig) -> Result<OptimizerConfig, TrainError> {
    let s = &config.strategy;
    let mut c = OptimizerConfig::for_strategy(s.optimizer, s.precision);
    if let Some(wd) = config.weight_decay {
        c.weight_decay = wd;
    }
    // Blocks of 8-bit states run from each buffer's start; a ZeRO shard would cut them
    // elsewhere and change the absmax of the blocks at its edges.
    if c.state_dtype == StateDtype::Int8
        && config.data_parallel > 1
        && s.placement.zero_stage.shards_optimizer()
    {
        return Err(ConfigError::Strategy(headroom_strategy::StrategyError::Incompatible(
            "--optimizer adamw-8bit quantizes each block's states in blocks of 256 from the block's start, which ZeRO's shards would cut differently: use --zero 0 with several ranks, or adamw / adamw-bf16 with ZeRO".into(),
        ))
        .into());
    }
    // Adafactor factors each matrix's second moment into row and column means and clips each
    // tensor's update by its RMS: both need whole tensors, which ZeRO's shards cut.
    if c.kind == UpdateRule::Adafactor
        && config.data_parallel > 1
        && s.placement.zero_stage.shards_optimizer()
    {
        return Err(ConfigError::Strategy(headroom_strategy::StrategyError::Incompatible(
            "--optimizer adafactor keeps row and column means of each weight and clips each weight's update by its RMS, which needs whole weights where ZeRO's shards cut them: use --zero 0 with several ranks, or adamw / adamw-bf16 with ZeRO".into(),
        ))
        .into());
    }
    Ok(c)
}

impl Trainer {
    /// The trainer of `config` on `device`, one rank of `comm`'s group when given; `arena`: the
    /// plan `--allocator planned` serves on a real device (recorded by `prepare`).
    pub(super) fn build(
        config: RunConfig,
        corpus: &Corpus,
        device: Device,
        comm: Option<Box<dyn Communicator>>,
        arena: Option<ArenaLayout>,
    ) -> Result<Trainer, TrainError> {
        let mut config = config;
        // Recovery retries a step at twice the accumulation, which the step in backward cannot
        // run; its blocks are updated from the first backward on anyway.
        if config.strategy.optimizer_in_backward {
            config.oom_recovery = false;
        }
        let precision = config.strategy.precision;
        let spec = model_spec(&config)?;
        let seq_len = config.seq_len_of(&spec);
        // A split model's ranks read the same batches: its group is not a data-parallel one.
        let (comm, tp_group) =
            super::tensor_parallel::split_comm(&config, comm, !device.is_backed())?;
        let ranks = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
        let sampler = run_loader(&config, corpus, &spec, seq_len, ranks, !device.is_backed())?;
        let (recompute, budget_decision) = recompute_for(
            config.strategy.checkpoint,
            config.strategy.loss,
            &spec,
            compute_dtype(precision),
            config.micro_batch(),
            seq_len,
        )?;
        headroom_tensor::rng::manual_seed(config.seed);
        device.lock().trace_mut().set_phase("init");
        if config.allocator == AllocatorKind::Planned && device.is_backed() {
            device
                .lock()
                .install_layout(arena.ok_or(TrainError::NoArenaLayout)?)?;
        }
        device.lock().begin_window(super::step::INIT_WINDOW);
        let placement = config.strategy.placement;
        // Offloading ZeRO-3 parameters alone takes ZeRO-3's machinery in a group of one.
        let comm = match comm {
            None if placement.offload_params.is_offloaded() => {
                Some(solo_rank(&config, !device.is_backed()))
            }
            comm => comm,
        };
        let (rank, world) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
        let stage = effective_stage(&config, world);
        // ZeRO-2/3: blocks are built sharded, so no rank ever holds the whole model's
        // gradients (or, under ZeRO-3, parameters).
        let layout = ShardLayout {
            rank,
            world,
            gradients: stage.shards_gradients(),
            parameters: stage.shards_parameters(),
            // With the step in backward a gradient takes bytes only while it is computed.
            released_gradients: config.strategy.optimizer_in_backward,
        };
        let mut model = match &tp_group {
            Some(group) => build_parallel_model(
                &config.model,
                &spec,
                &device,
                compute_dtype(precision),
                config.seed,
                super::tensor_parallel::tensor_parallel(&config, group)?,
            )?,
            None => with_sharding(layout, || {
                build_model(
                    &config.model,
                    &spec,
                    &device,
                    compute_dtype(precision),
                    config.seed,
                )
            })?,
        };
        super::hf_export::check_hf_out(&config, model.as_ref())?;
        let checkpoint = match model.hugging_face() {
            Some(_) => crate::pretrained::checkpoint(&config.model)?,
            None => None,
        };
        let pretrained = checkpoint.is_some();
        if let (Some(hf), Some(checkpoint)) = (model.hugging_face_mut(), &checkpoint)
            && device.is_backed()
        {
            // A model directory's weights (a dry run reads none: its model holds no values).
            hf.load(checkpoint)?;
        }
        if let Some(path) = &config.init_from {
            // Before master weights and offload stores copy the parameters.
            super::init_from::init_from(model.as_mut(), &spec, path, !device.is_backed())?;
        }
        let mut grads = Gradients::new();
        for block in model.blocks() {
            block.bind_grads(&mut grads)?;
        }
        let sharded = stage.shards_optimizer();
        let mut optimizer = Optimizer::new(optimizer_config(&config)?, device.clone());
        optimizer.set_tensor_shapes(
            model
                .blocks()
                .iter()
                .map(|b| {
                    b.specs()
                        .iter()
                        .map(|p| TensorShape::of(&p.shape))
                        .collect()
                })
                .collect(),
        );
        let dry = !device.is_backed();
        // Host memory left to the offload tiers once the loader has its share.
        let host_budget = config
            .host_memory
            .map(|b| b.saturating_sub(sampler.report().buffer_bytes));
        let pool = headroom_memory::host_pool::HostPool::new(host_budget, config.pin_memory);
        let offload = offload::build(
            &config,
            model.as_ref(),
            &optimizer,
            (rank, world, stage),
            &pool,
            dry,
        )?;
        let master = match (precision.master_weights(), sharded) {
            _ if offload.is_some() => None,
            (false, _) => None,
            (true, false) => Some(master_weights(model.as_ref(), None)?),
            (true, true) => Some(master_weights(model.as_ref(), Some((rank, world)))?),
        };
        let scaler = precision
            .loss_scaling()
            .then(|| LossScaler::new(ScalerConfig::default()));
        device.lock().end_window();
        let mut report = TrainReport::new(&config, model.num_params() as u64);
        report.frozen_parameters = model.num_frozen_params() as u64;
        let activation_pool = config
            .strategy
            .placement
            .offload_activations
            .is_offloaded()
            .then(|| {
                // Its own account, so the report can show the activations' host bytes; the
                // same budget as the offload tiers.
                headroom_memory::host_pool::HostPool::new(host_budget, config.pin_memory)
            });
        Ok(Trainer {
            config,
            precision,
            device,
            model,
            spec,
            master,
            grads,
            optimizer,
            scaler,
            sampler,
            seq_len,
            recompute,
            budget_decision,
            step: 0,
            backward_passes: 0,
            warned_accumulation: false,
            hooks: TrainerHooks::default(),
            stop: None,
            comm,
            tensor_parallel: tp_group,
            offload,
            activation_pool,
            report,
            weights_touched: false,
            pretrained,
            kept: Vec::new(),
            leak_guard: LeakGuard::default(),
            dry,
            micro_work: None,
        })
    }
}
