//! Resolving the keys against the embedded defaults into a `RunConfig`: every value checked,
//! with one message per bad value naming the key and the fix; and the limits they are checked
//! against.
//!
//! Not for: reading the keys (see `read`) or the resolved configuration (see `run`).

use super::run::{
    DEFAULT_DEVICE_MEMORY, DEFAULT_MODEL, DEFAULT_PRETRAINED_DEVICE_MEMORY, MAX_EFFECTIVE_BATCH,
    RunConfig,
};
use super::{ConfigError, TrainConfig};
use headroom_nn::checkpoint::{is_gguf, is_hf_dir};
use headroom_strategy::{Lora, Placement, Strategy, StrategyError};
use std::path::Path;

/// Most ranks of an in-process data-parallel group.
const MAX_RANKS: usize = 256;
/// Most data-loader worker threads.
const MAX_WORKERS: usize = 64;
/// Most batches the loader queues ahead: each holds a staging buffer, and a few keep any
/// model here fed (PyTorch's DataLoader queues 2 per worker by default).
pub const MAX_PREFETCH: usize = 64;
/// Longest wait of a collective, in seconds (a week): a stuck rank is reported within it, and
/// every longer value is a mistake (and past about 1.8e19 s not even a representable duration).
pub const MAX_COLLECTIVE_TIMEOUT_S: f64 = 604_800.0;

impl TrainConfig {
    /// Fills defaults and checks every value.
    pub fn resolve(self) -> Result<RunConfig, ConfigError> {
        let strategy = self.resolve_strategy()?;
        let eval_batches = positive("eval_batches", self.eval_batches, 4)?;
        let data_parallel = positive("data_parallel", self.data_parallel, 1)?;
        if strategy.optimizer_in_backward {
            in_backward_rules(data_parallel, self.grad_clip)?;
        }
        if data_parallel > MAX_RANKS {
            return Err(value(
                "data_parallel",
                &data_parallel,
                "is above the 256 ranks one process runs as threads",
            ));
        }
        for (key, v) in [
            ("layers", self.layers),
            ("width", self.width),
            ("heads", self.heads),
            ("seq_len", self.seq_len),
        ] {
            if v == Some(0) {
                return Err(value(key, &0, "must be at least 1"));
            }
        }
        let lr = self.lr.unwrap_or(strategy.optimizer.default_lr());
        if !(lr.is_finite() && lr > 0.0) {
            return Err(value("lr", &lr, "must be a positive number"));
        }
        if let Some(d) = self.dropout.filter(|d| !(0.0..1.0).contains(d)) {
            return Err(value("dropout", &d, "must be in [0, 1)"));
        }
        let collective_timeout_s = self.collective_timeout.unwrap_or(600.0);
        if !(collective_timeout_s > 0.0 && collective_timeout_s <= MAX_COLLECTIVE_TIMEOUT_S) {
            return Err(value(
                "collective_timeout",
                &collective_timeout_s,
                "must be a number of seconds above 0 and at most 604800 (a week); give --collective-timeout (or collective_timeout) in that range, or omit it for the default of 600",
            ));
        }
        let prefetch = positive("prefetch", self.prefetch, 2)?;
        if prefetch > MAX_PREFETCH {
            return Err(value(
                "prefetch",
                &prefetch,
                "is above the 64 batches the loader may queue ahead, each a staging buffer in host memory; give --prefetch (or prefetch) 64 or less: a few (the default 2) keep any model here fed",
            ));
        }
        let workers = self.workers.unwrap_or(0);
        if workers > MAX_WORKERS {
            return Err(value(
                "workers",
                &workers,
                "is above 64 loader threads; a few keep any model here fed",
            ));
        }
        let pretrained = self.model.as_deref().is_some_and(|m| {
            let path = Path::new(m);
            is_gguf(path) || is_hf_dir(path)
        });
        let device_memory = self.device_memory.map_or(
            match pretrained {
                true => DEFAULT_PRETRAINED_DEVICE_MEMORY,
                false => DEFAULT_DEVICE_MEMORY,
            },
            |b| b.0,
        );
        if device_memory < (1 << 20) {
            return Err(value(
                "device_memory",
                &device_memory,
                "is below 1 MiB; give a size such as 512MiB or 2GiB",
            ));
        }
        let lora = self.resolve_lora()?;
        let run = RunConfig {
            model: self.model.unwrap_or_else(|| DEFAULT_MODEL.into()),
            lora,
            init_from: self.init_from,
            layers: self.layers,
            width: self.width,
            heads: self.heads,
            seq_len: self.seq_len,
            dropout: self.dropout,
            strategy,
            lr,
            weight_decay: self.weight_decay,
            // Clip to global norm 1.0 unless set (or the step runs in backward); 0 (or less)
            // turns clipping off.
            grad_clip: match self.grad_clip {
                None if strategy.optimizer_in_backward => None,
                None => Some(1.0),
                Some(c) if c > 0.0 => Some(c),
                Some(_) => None,
            },
            warmup_steps: self.warmup_steps.unwrap_or(20),
            steps: self.steps.unwrap_or(200),
            device_memory,
            seed: self.seed.unwrap_or(1337),
            eval_every: self.eval_every.unwrap_or(50),
            eval_batches,
            empty_cache_after_eval: self.empty_cache_after_eval.unwrap_or(false),
            allocator: self.allocator.unwrap_or_default(),
            data: self.data,
            save_dir: self.save_dir,
            hf_out: self.hf_out,
            hf_merge: self.hf_merge.unwrap_or(false),
            save_every: self.save_every.unwrap_or(0),
            // Recovering from out of memory would need every rank to agree: off for DDP.
            oom_recovery: self.oom_recovery.unwrap_or(data_parallel == 1),
            deterministic: self.deterministic.unwrap_or(false),
            data_parallel,
            tensor_parallel: self.tensor_parallel,
            zero_prefetch: self.zero_prefetch.unwrap_or(1),
            collective_timeout_s,
            sampler: self.sampler.unwrap_or_default(),
            workers,
            prefetch,
            host_memory: self.host_memory.map(|b| b.0),
            pin_memory: self.pin_memory.unwrap_or(true),
            offload_dir: self.offload_dir,
            resumed: false,
        };
        super::mesh::check_tensor_parallel(&run)?;
        Ok(run)
    }

    /// The LoRA fine-tune the `lora_*` keys configure, if `lora_rank` is set.
    fn resolve_lora(&self) -> Result<Option<Lora>, ConfigError> {
        let Some(rank) = self.lora_rank else {
            if self.lora_alpha.is_some() || self.lora_targets.is_some() || self.lora_base.is_some()
            {
                return Err(value(
                    "lora_rank",
                    &"unset",
                    "must be set for lora_alpha, lora_targets or lora_base to take effect (e.g. --lora-rank 8)",
                ));
            }
            return Ok(None);
        };
        let alpha = self.lora_alpha.unwrap_or(rank as f32);
        let targets = self.lora_targets.clone().unwrap_or_default();
        let base = self.lora_base.unwrap_or_default();
        Ok(Some(Lora::new(rank, alpha, targets, base)?))
    }

    /// The strategy these keys configure, defaults filled, checked against the engine.
    fn resolve_strategy(&self) -> Result<Strategy, ConfigError> {
        let micro_batch = positive("micro_batch", self.micro_batch, 16)?;
        let accumulation = positive("accumulation", self.accumulation, 1)?;
        if micro_batch
            .checked_mul(accumulation)
            .is_none_or(|b| b > MAX_EFFECTIVE_BATCH)
        {
            return Err(value(
                "micro_batch",
                &format!("{micro_batch} × accumulation {accumulation}"),
                "is above 1,048,576 sequences per optimizer step; lower --micro-batch or --accumulation",
            ));
        }
        let strategy = Strategy {
            precision: self.precision.unwrap_or_default(),
            optimizer: self.optimizer.unwrap_or_default(),
            placement: Placement {
                zero_stage: self.zero_stage.unwrap_or_default(),
                offload_optimizer: self.offload_optimizer.unwrap_or_default(),
                offload_params: self.offload_params.unwrap_or_default(),
                offload_activations: self.offload_activations.unwrap_or_default(),
            },
            checkpoint: self.checkpoint.unwrap_or_default(),
            attention: self.attention.unwrap_or_default(),
            loss: self.loss.unwrap_or_default(),
            optimizer_in_backward: self.optimizer_in_backward.unwrap_or(false),
            micro_batch: micro_batch as u64,
            accumulation: accumulation as u64,
        };
        match strategy.incompatibility() {
            Some(why) => Err(StrategyError::Incompatible(why).into()),
            None => Ok(strategy),
        }
    }
}

/// What the optimizer step in backward cannot run with beyond the strategy's own rules: a
/// group (each rank's gradient must be summed over ranks before any update) and global-norm
/// clipping (the norm needs every gradient first).
fn in_backward_rules(data_parallel: usize, grad_clip: Option<f32>) -> Result<(), ConfigError> {
    let why = if data_parallel > 1 {
        "needs one process: with --data-parallel each gradient is summed over the ranks before \
         any update; drop --data-parallel"
    } else if grad_clip.is_some_and(|c| c > 0.0) {
        "cannot clip by the global norm, which needs every gradient before the first update; \
         drop --grad-clip (the default is off with this flag)"
    } else {
        return Ok(());
    };
    Err(StrategyError::Incompatible(format!("--optimizer-in-backward {why}")).into())
}

/// A bad value of `key`.
fn value(key: &'static str, v: &dyn std::fmt::Display, reason: &str) -> ConfigError {
    ConfigError::Value {
        key,
        value: v.to_string(),
        reason: reason.to_string(),
    }
}

/// `v` or `default`, which must be at least 1.
fn positive(key: &'static str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
    match v.unwrap_or(default) {
        0 => Err(value(key, &0, "must be at least 1")),
        n => Ok(n),
    }
}
