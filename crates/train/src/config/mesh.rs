//! The run's mesh: how many ranks it runs on (data parallelism × tensor parallelism), and the
//! rules a tensor-parallel run obeys. Tensor parallelism splits headroom's GPT over a group in
//! which every rank reads the same batches; combined with data parallelism it would need a
//! communicator per group (one for the ranks of a layer split, one for the replicas), which the
//! communicators do not split into, so the combination is refused rather than run wrong.
//!
//! Not for: the split itself (the nn crate's GPT) or its sums (the tensor crate).

use super::{ConfigError, RunConfig};
use headroom_strategy::{Optimizer, ZeroStage};

/// Chunks every tensor-parallel sum is cut into in `--deterministic` mode: the largest group
/// size whose runs are bitwise the unsplit one (1, 2, 4 and 8 ranks all divide it).
pub const DETERMINISTIC_CHUNKS: usize = 8;

impl RunConfig {
    /// Ranks the run launches: the data-parallel group's, or the tensor-parallel group's.
    pub fn ranks(&self) -> usize {
        self.data_parallel.max(1) * self.tensor_parallel.unwrap_or(1).max(1)
    }

    /// Chunks of every tensor-parallel sum: [`DETERMINISTIC_CHUNKS`] in deterministic mode (so
    /// every group size adds in one order), else one per rank.
    pub fn tensor_parallel_chunks(&self) -> usize {
        match self.deterministic {
            true => DETERMINISTIC_CHUNKS,
            false => self.tensor_parallel.unwrap_or(1).max(1),
        }
    }
}

fn refuse(key: &'static str, value: String, reason: String) -> ConfigError {
    ConfigError::Value { key, value, reason }
}

/// What a tensor-parallel run cannot combine with, each refusal naming the fix.
pub(super) fn check_tensor_parallel(c: &RunConfig) -> Result<(), ConfigError> {
    let Some(n) = c.tensor_parallel else {
        return Ok(());
    };
    let tp = |reason: String| refuse("tensor_parallel", n.to_string(), reason);
    if n == 0 || !n.is_power_of_two() {
        return Err(tp(
            "must be a power of two (1, 2, 4, 8, …): the ranks' sums are added as a pairwise tree"
                .into(),
        ));
    }
    if c.deterministic && n > DETERMINISTIC_CHUNKS {
        return Err(tp(format!(
            "is above {DETERMINISTIC_CHUNKS}, the chunks --deterministic cuts each sum into; use at most {DETERMINISTIC_CHUNKS} ranks, or drop --deterministic"
        )));
    }
    if c.data_parallel > 1 {
        return Err(tp(format!(
            "with --data-parallel {}: tensor × data parallelism is not supported (the communicators do not split into a group per layer split and per replica); use one of the two",
            c.data_parallel
        )));
    }
    let p = c.strategy.placement;
    if p.zero_stage != ZeroStage::default()
        || p.offload_optimizer.is_offloaded()
        || p.offload_params.is_offloaded()
        || p.offload_activations.is_offloaded()
    {
        return Err(tp(
            "with ZeRO or offload: a split run keeps every rank's shard on its device; use --zero 0 and no offload".into(),
        ));
    }
    if c.strategy.optimizer_in_backward {
        return Err(tp(
            "with the step in backward: the gradient norm is summed over ranks after backward; drop --optimizer-in-backward".into(),
        ));
    }
    let o = c.strategy.optimizer;
    if !matches!(
        o,
        Optimizer::Sgd | Optimizer::SgdMomentum | Optimizer::AdamW
    ) {
        return Err(tp(format!(
            "with --optimizer {o}: its update is not elementwise in f32 (blocks, rows, whole tensors, rounded states) and would differ on a rank's slice; use sgd, sgd-momentum or adamw"
        )));
    }
    if c.lora.is_some() || c.init_from.is_some() || c.hf_out.is_some() || c.save_dir.is_some() {
        return Err(tp(
            "with LoRA, --init-from, --hf-out or --save-dir: adapters, imports and saves read whole weights; run those without --tensor-parallel".into(),
        ));
    }
    Ok(())
}
