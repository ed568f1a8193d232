//! The workload: sequence length and global batch, and the ways that batch can be split into
//! micro-batch × accumulation × data-parallel devices.
//!
//! Not for: choosing the split (the search does that).

use crate::error::{PlanError, Result};
use crate::model::Architecture;
use crate::strategy::batch_splits;
use serde::Serialize;

/// How the user gave the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchSpec {
    /// Global batch in samples.
    Samples(u64),
    /// Global batch in tokens (a multiple of the sequence length).
    Tokens(u64),
    /// No global batch: micro-batch × accumulation per device (× devices).
    Split { micro_batch: u64, accumulation: u64 },
}

/// Most samples per optimizer step the planner accepts (2^24; published runs use thousands).
pub const MAX_GLOBAL_BATCH: u64 = 1 << 24;
/// Most tokens per optimizer step (2^36, about 69 billion; Llama 3 used 16 million).
pub const MAX_TOKENS_PER_STEP: u64 = 1 << 36;

/// Sequence length and global batch of one optimizer step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Workload {
    pub seq_len: u64,
    /// Samples per optimizer step over all devices.
    pub global_batch: u64,
    /// Pinned micro-batch, if any.
    pub micro_batch: Option<u64>,
    /// Pinned accumulation, if any.
    pub accumulation: Option<u64>,
    /// The data loader of each rank, when given: its staging buffers and workers count in
    /// the host memory of the plan.
    pub loader: Option<LoaderSpec>,
    /// A LoRA/QLoRA fine-tune: only the adapters train.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<crate::strategy::Lora>,
    /// The dtype the LoRA run's frozen base is loaded in; `None`: the parameter dtype of the
    /// precision (the 16-bit width under mixed precision).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_base_dtype: Option<crate::strategy::BaseDtype>,
    /// The LoRA run's dropout probability on the adapters' inputs (PEFT's `lora_dropout`);
    /// `None`: 0, no dropout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_dropout: Option<f32>,
}

/// Each rank's data loader: worker threads and the batches queued ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LoaderSpec {
    pub workers: u64,
    pub prefetch: u64,
}

impl LoaderSpec {
    /// Host bytes of one rank's loader for micro-batches of `micro_batch` × `seq_len` tokens
    /// (`i64` inputs and targets staged), by the formula the trainer's loader states its own
    /// buffers with.
    pub fn host_bytes(&self, micro_batch: u64, seq_len: u64) -> u64 {
        headroom_memory::host_pool::loader_host_bytes(
            self.workers as usize,
            self.prefetch as usize,
            2 * 8 * micro_batch * seq_len,
            4 * (seq_len + 1),
        )
    }
}

/// A warning when `seq_len` exceeds the context the model was trained for (rotary or relative
/// positions, where nothing stops a longer sequence but quality degrades without extension).
pub fn context_warning(model: &Architecture, seq_len: u64) -> Option<String> {
    let max = model.trained_context?;
    (seq_len > max).then(|| {
        format!(
            "--seq-len {seq_len} exceeds max_position_embeddings {max} of {}: the model was not trained on sequences this long (the plan counts the memory, but quality needs a context extension such as RoPE scaling)",
            model.name
        )
    })
}

impl Workload {
    /// Validates the batch against the model and the data-parallel world size.
    pub fn new(
        model: &Architecture,
        seq_len: u64,
        batch: BatchSpec,
        micro_batch: Option<u64>,
        accumulation: Option<u64>,
        world: u64,
    ) -> Result<Workload> {
        if seq_len == 0 {
            return Err(PlanError::Batch(
                "--seq-len is 0; accepted: a positive number of tokens".into(),
            ));
        }
        if let Some(max) = model.max_learned_positions
            && seq_len > max
        {
            return Err(PlanError::Batch(format!(
                "--seq-len {seq_len} exceeds max_position_embeddings {max} of {} (learned positions); accepted: 1..={max}",
                model.name
            )));
        }
        for (flag, v) in [
            ("--micro-batch", micro_batch),
            ("--accumulation", accumulation),
        ] {
            if v == Some(0) {
                return Err(PlanError::Batch(format!(
                    "{flag} is 0; accepted: a positive integer"
                )));
            }
        }
        let global = match batch {
            BatchSpec::Samples(0) | BatchSpec::Tokens(0) => {
                return Err(PlanError::Batch(
                    "--global-batch is 0; accepted: a positive number".into(),
                ));
            }
            BatchSpec::Samples(n) => n,
            BatchSpec::Tokens(t) => {
                if !t.is_multiple_of(seq_len) {
                    return Err(PlanError::Batch(format!(
                        "--global-batch-tokens {t} is not a multiple of --seq-len {seq_len}; accepted: a multiple of {seq_len}"
                    )));
                }
                t / seq_len
            }
            BatchSpec::Split {
                micro_batch,
                accumulation,
            } => {
                if micro_batch == 0 || accumulation == 0 {
                    return Err(PlanError::Batch(
                        "--micro-batch and --accumulation must be positive".into(),
                    ));
                }
                micro_batch * accumulation * world
            }
        };
        if global > MAX_GLOBAL_BATCH || global.saturating_mul(seq_len) > MAX_TOKENS_PER_STEP {
            return Err(PlanError::Batch(format!(
                "global batch {global} × seq {seq_len} is above the planner's limits ({MAX_GLOBAL_BATCH} samples, {MAX_TOKENS_PER_STEP} tokens per step); accepted: a smaller --global-batch"
            )));
        }
        if !global.is_multiple_of(world) {
            return Err(PlanError::Batch(format!(
                "global batch {global} samples cannot be split evenly over {world} data-parallel GPUs; accepted: a multiple of {world}"
            )));
        }
        let per_device = global / world;
        let unit = micro_batch.unwrap_or(1) * accumulation.unwrap_or(1);
        if !per_device.is_multiple_of(unit) {
            return Err(PlanError::Batch(format!(
                "global batch {global} = {per_device} samples per GPU × {world} GPUs is not a multiple of micro-batch × accumulation = {unit}; accepted: a global batch that is a multiple of {}",
                unit * world
            )));
        }
        Ok(Workload {
            seq_len,
            global_batch: global,
            micro_batch,
            accumulation,
            loader: None,
            lora: None,
            lora_base_dtype: None,
            lora_dropout: None,
        })
    }

    /// The workload with each rank's data loader counted in host memory.
    pub fn with_loader(self, loader: LoaderSpec) -> Workload {
        Workload {
            loader: Some(loader),
            ..self
        }
    }

    /// The workload fine-tuning `lora`'s adapters on `model` only; an error when no module of
    /// the model matches a target.
    pub fn with_lora(self, model: &Architecture, lora: crate::strategy::Lora) -> Result<Workload> {
        let inv = crate::model::ParamInventory::of(model);
        if crate::model::LoraCounts::of(&inv, &lora).is_none() {
            return Err(PlanError::Batch(format!(
                "--lora-targets {}: no projection of {} matches; accepted: {}",
                lora.targets,
                model.name,
                crate::strategy::LoraTargets::ACCEPTED
            )));
        }
        Ok(Workload {
            lora: Some(lora),
            ..self
        })
    }

    /// The workload with the LoRA run's frozen base loaded in `dtype`; an error without a
    /// LoRA fine-tune.
    pub fn with_lora_base_dtype(self, dtype: crate::strategy::BaseDtype) -> Result<Workload> {
        if self.lora.is_none() {
            return Err(PlanError::Batch(format!(
                "--lora-base-dtype {dtype} without a LoRA fine-tune; accepted: with --lora-rank"
            )));
        }
        Ok(Workload {
            lora_base_dtype: Some(dtype),
            ..self
        })
    }

    /// The workload with the LoRA run's adapters reading their inputs through dropout of
    /// probability `p` (PEFT's `lora_dropout`); an error without a LoRA fine-tune or outside
    /// [0, 1).
    pub fn with_lora_dropout(self, p: f32) -> Result<Workload> {
        if self.lora.is_none() {
            return Err(PlanError::Batch(format!(
                "--lora-dropout {p} without a LoRA fine-tune; accepted: with --lora-rank"
            )));
        }
        if !(0.0..1.0).contains(&p) {
            return Err(PlanError::Batch(format!(
                "--lora-dropout {p}: a probability is needed; accepted: 0 <= p < 1 (PEFT's lora_dropout, e.g. 0.05)"
            )));
        }
        Ok(Workload {
            lora_dropout: Some(p),
            ..self
        })
    }

    /// Tokens per optimizer step over all devices.
    pub fn tokens_per_step(&self) -> u64 {
        self.global_batch * self.seq_len
    }

    /// Every `(micro_batch, accumulation)` that splits the per-device batch, honouring pins,
    /// largest micro-batch first.
    pub fn splits(&self, world: u64) -> Vec<(u64, u64)> {
        batch_splits(
            self.global_batch / world,
            self.micro_batch,
            self.accumulation,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::load_model;

    #[test]
    fn batch_that_does_not_divide_over_gpus_is_impossible() {
        let m = load_model("gpt2").unwrap();
        let e = Workload::new(&m, 512, BatchSpec::Samples(10), None, None, 4)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("impossible batch") && e.contains("multiple of 4"),
            "{e}"
        );
    }

    #[test]
    fn absurd_batches_are_refused_at_once() {
        let m = load_model("gpt2").unwrap();
        let e = Workload::new(
            &m,
            1024,
            BatchSpec::Samples(1_000_000_000_000),
            None,
            None,
            1,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("planner's limits"), "{e}");
        let m = load_model("llama-2-7b").unwrap();
        let e = Workload::new(&m, 1 << 20, BatchSpec::Samples(1 << 20), None, None, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tokens per step"), "{e}");
    }

    #[test]
    fn sequence_longer_than_learned_positions_is_rejected() {
        let m = load_model("gpt2").unwrap();
        let e = Workload::new(&m, 2048, BatchSpec::Samples(8), None, None, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_position_embeddings 1024"), "{e}");
    }

    #[test]
    fn splits_enumerate_divisors_and_honour_pins() {
        let m = load_model("llama-2-7b").unwrap();
        let w = Workload::new(&m, 4096, BatchSpec::Tokens(4096 * 32), None, None, 4).unwrap();
        assert_eq!(w.global_batch, 32);
        assert_eq!(w.splits(4), vec![(8, 1), (4, 2), (2, 4), (1, 8)]);
        let w = Workload::new(&m, 4096, BatchSpec::Samples(32), Some(2), None, 4).unwrap();
        assert_eq!(w.splits(4), vec![(2, 4)]);
    }
}
