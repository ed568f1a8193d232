//! Reading the keys: a TOML file, flags layered over it, a strategy written as keys, and the
//! strategy levers a set of keys pins.
//!
//! Not for: what the keys are (see `keys`) or checking and filling them (see `resolve`).

use super::{ConfigError, TrainConfig, describe_toml_error};
use headroom_plan::export::headroom::strategy_toml;
use headroom_strategy::{Pins, Strategy};
use std::path::Path;

impl TrainConfig {
    /// Reads a TOML file; unknown keys and bad values name the key and the line.
    pub fn from_file(path: &Path) -> Result<TrainConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        TrainConfig::from_toml(&text, path)
    }

    /// Parses TOML `text`; errors name `path`, the key and the line.
    pub fn from_toml(text: &str, path: &Path) -> Result<TrainConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: describe_toml_error(text, &e),
        })
    }

    /// `self` with every key that `over` sets replaced (flags over file). The struct literal
    /// makes the compiler check that every key is listed.
    pub fn overridden_by(self, over: TrainConfig) -> TrainConfig {
        macro_rules! pick {
            ($($f:ident),*) => { TrainConfig { $($f: over.$f.or(self.$f)),* } };
        }
        pick!(
            model,
            layers,
            width,
            heads,
            seq_len,
            dropout,
            precision,
            micro_batch,
            accumulation,
            optimizer,
            lr,
            weight_decay,
            grad_clip,
            warmup_steps,
            steps,
            device_memory,
            seed,
            eval_every,
            eval_batches,
            empty_cache_after_eval,
            allocator,
            data,
            checkpoint,
            attention,
            loss,
            optimizer_in_backward,
            lora_rank,
            lora_alpha,
            lora_targets,
            lora_base,
            init_from,
            save_dir,
            hf_out,
            hf_merge,
            save_every,
            oom_recovery,
            deterministic,
            data_parallel,
            tensor_parallel,
            zero_stage,
            zero_prefetch,
            collective_timeout,
            sampler,
            workers,
            prefetch,
            host_memory,
            pin_memory,
            offload_optimizer,
            offload_params,
            offload_activations,
            offload_dir
        )
    }

    /// Every lever of `strategy` set, read from the keys the planner's export writes
    /// (`strategy_toml`): a strategy is written one way, for a file and for a configuration.
    pub fn of_strategy(strategy: &Strategy) -> TrainConfig {
        toml::from_str(&strategy_toml(strategy))
            .expect("every key of a strategy is a configuration key (tests/strategy_toml.rs)")
    }

    /// The strategy levers this configuration sets: `--auto` keeps them.
    pub fn pins(&self) -> Pins {
        Pins {
            precision: self.precision,
            optimizer: self.optimizer,
            zero_stage: self.zero_stage,
            offload_optimizer: self.offload_optimizer,
            offload_params: self.offload_params,
            offload_activations: self.offload_activations,
            checkpoint: self.checkpoint,
            attention: self.attention,
            loss: self.loss,
            optimizer_in_backward: self.optimizer_in_backward,
            micro_batch: self.micro_batch.map(|m| m as u64),
            accumulation: self.accumulation.map(|a| a as u64),
            allocator: self.allocator,
        }
    }
}
