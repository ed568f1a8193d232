//! Building a run's parts from its configuration: the model's shape (preset or file with the
//! overrides applied), the optimizer's configuration from the vocabulary, and the fp32 master
//! copies of the weights.
//!
//! Not for: the loop (see `step`, `Trainer::train`).

use super::shard::shard_of;
use super::{TrainError, precision};
use crate::config::{ConfigError, RunConfig};
use headroom_memory::Category;
use headroom_nn::Model;
use headroom_nn::models::ModelSpec;
use headroom_nn::optim::{OptimizerConfig, StateDtype, UpdateRule};
use headroom_tensor::Tensor;

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
            ModelSpec::Gpt(c)
        }
        ModelSpec::Resmlp(mut c) => {
            c.dropout = config.dropout.unwrap_or(c.dropout);
            ModelSpec::Resmlp(c)
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
        && s.placement.zero_stage.number() >= 1
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
        && s.placement.zero_stage.number() >= 1
    {
        return Err(ConfigError::Strategy(headroom_strategy::StrategyError::Incompatible(
            "--optimizer adafactor keeps row and column means of each weight and clips each weight's update by its RMS, which needs whole weights where ZeRO's shards cut them: use --zero 0 with several ranks, or adamw / adamw-bf16 with ZeRO".into(),
        ))
        .into());
    }
    Ok(c)
}
