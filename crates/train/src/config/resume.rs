//! Resuming a saved run: its configuration is the one saved with it, so `--resume DIR` alone
//! continues the run exactly as it was started (an `--auto` choice included). Keys given with
//! `--resume` change it only where that is sound, and each change is reported:
//!
//! - refused: what defines the run's numbers — model and shape, dropout, precision, optimizer,
//!   seed, data, sampler — and the effective batch (micro-batch × accumulation);
//! - allowed and reported: the split of the same effective batch, the checkpoint policy, the
//!   attention kind and the loss computation (memory levers; the same mathematics), the device
//!   budget, the number of steps, the schedule and optimizer hyperparameters, evaluation, saving
//!   and recovery, and the data loader (workers, prefetch, host memory, pinning: the batches are
//!   the same).
//!
//! Not for: reading the save (see `crate::save`).

use super::{ConfigError, RunConfig, TrainConfig};
use serde_json::Value;

/// Keys a resume refuses to change.
const FIXED: [&str; 11] = [
    "model",
    "layers",
    "width",
    "heads",
    "seq_len",
    "dropout",
    "precision",
    "optimizer",
    "seed",
    "data",
    "sampler",
];

impl RunConfig {
    /// The saved run `self` continued with the keys `given` sets: the continued configuration
    /// and one line per deliberate change.
    pub fn resumed_with(
        &self,
        given: &TrainConfig,
    ) -> Result<(RunConfig, Vec<String>), ConfigError> {
        let mut keys = self.as_keys();
        // A new split (or a new number of ranks) may name only one side: the other follows
        // from the saved effective batch.
        let effective = self.effective_batch();
        let world = given.data_parallel.unwrap_or(self.data_parallel).max(1);
        let per_rank = effective / world;
        match (given.micro_batch, given.accumulation) {
            (Some(m), None) if m > 0 && per_rank.is_multiple_of(m) => {
                keys.accumulation = Some(per_rank / m)
            }
            (None, Some(a)) if a > 0 && per_rank.is_multiple_of(a) => {
                keys.micro_batch = Some(per_rank / a)
            }
            (None, None) if world != self.data_parallel => {
                keys.accumulation = Some(per_rank / self.micro_batch().max(1))
            }
            _ => {}
        }
        let mut resumed = keys.overridden_by(given.clone()).resolve()?;
        resumed.resumed = true;
        let (before, after) = (as_json(self), as_json(&resumed));
        for key in FIXED {
            if before[key] != after[key] {
                return Err(ConfigError::Value {
                    key: fixed_key(key),
                    value: after[key].to_string(),
                    reason: format!(
                        "the saved run was written with {key} = {}; resuming cannot change it (give --resume alone to continue the run as it was, or start a new run)",
                        before[key]
                    ),
                });
            }
        }
        if resumed.effective_batch() != effective {
            return Err(ConfigError::Value {
                key: "micro_batch",
                value: format!(
                    "{} × accumulation {}",
                    resumed.micro_batch(),
                    resumed.accumulation()
                ),
                reason: format!(
                    "the saved run steps on {effective} sequences; resume with a split of the same effective batch"
                ),
            });
        }
        let changes = before
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| after[k.as_str()] != **v)
            .map(|(k, v)| format!("{k}: {v} → {}", after[k.as_str()]))
            .collect();
        Ok((resumed, changes))
    }

    /// Every key of this configuration as `TrainConfig` sets it (the strategy's as its one
    /// writer gives them).
    pub fn as_keys(&self) -> TrainConfig {
        TrainConfig {
            model: Some(self.model.clone()),
            layers: self.layers,
            width: self.width,
            heads: self.heads,
            seq_len: self.seq_len,
            dropout: self.dropout,
            lr: Some(self.lr),
            weight_decay: self.weight_decay,
            // resolve() reads 0 as "clipping off".
            grad_clip: Some(self.grad_clip.unwrap_or(0.0)),
            warmup_steps: Some(self.warmup_steps),
            steps: Some(self.steps),
            device_memory: Some(headroom_memory::ByteSize(self.device_memory)),
            seed: Some(self.seed),
            eval_every: Some(self.eval_every),
            eval_batches: Some(self.eval_batches),
            empty_cache_after_eval: Some(self.empty_cache_after_eval),
            allocator: Some(self.allocator),
            data: self.data.clone(),
            lora_rank: self.lora.as_ref().map(|l| l.rank),
            lora_alpha: self.lora.as_ref().map(|l| l.alpha),
            lora_targets: self.lora.as_ref().map(|l| l.targets.clone()),
            lora_base: self.lora.as_ref().map(|l| l.base),
            init_from: self.init_from.clone(),
            save_dir: self.save_dir.clone(),
            hf_out: self.hf_out.clone(),
            hf_merge: Some(self.hf_merge),
            save_every: Some(self.save_every),
            oom_recovery: Some(self.oom_recovery),
            deterministic: Some(self.deterministic),
            data_parallel: Some(self.data_parallel),
            tensor_parallel: self.tensor_parallel,
            sampler: Some(self.sampler),
            workers: Some(self.workers),
            prefetch: Some(self.prefetch),
            host_memory: self.host_memory.map(headroom_memory::ByteSize),
            pin_memory: Some(self.pin_memory),
            zero_prefetch: Some(self.zero_prefetch),
            collective_timeout: Some(self.collective_timeout_s),
            offload_dir: self.offload_dir.clone(),
            ..TrainConfig::of_strategy(&self.strategy)
        }
    }
}

fn as_json(c: &RunConfig) -> Value {
    serde_json::to_value(c).expect("a configuration serialises")
}

/// The `'static` name of a fixed key, for the error.
fn fixed_key(key: &str) -> &'static str {
    FIXED.into_iter().find(|k| *k == key).unwrap_or("config")
}
