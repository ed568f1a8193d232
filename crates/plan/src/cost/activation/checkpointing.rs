//! Activation bytes of the whole model under a checkpoint policy: what each policy keeps until
//! backward, what backward recomputes one block (or segment) at a time, and how a budget resolves.
//!
//! Not for: one block's activations (`block`) or the terms outside the blocks (`outside`).

use super::{Width, block, op_selective, outside_blocks};
use crate::model::{Architecture, Family};
use crate::strategy::{Attention, Checkpoint, Loss};

/// Bytes one block holds besides [`block`] when it runs without checkpointing: with a KV
/// cache in training (`Architecture::kv_cache_in_training`) and SDPA, GPT-2's attention saves
/// the query as a view of its fused q/k/v output, which keeps K and V alive beside the cache's
/// `torch.cat` copies that SDPA also saves: `2·e·sb·kv`. Eager attention's matmuls save
/// copies in place of the views, and checkpointing turns the cache off: nothing.
pub fn kv_cache_copies(spec: &Architecture, s: f64, b: f64, e: f64, attention: Attention) -> f64 {
    let fused_views = spec.family == Family::Gpt2;
    match spec.kv_cache_in_training
        && spec.transformers_modules
        && fused_views
        && attention == Attention::MemoryEfficient
    {
        true => 2.0 * e * s * b * spec.kv_dim() as f64,
        false => 0.0,
    }
}

/// Bytes held beside the checkpointed blocks' inputs by eager attention under checkpointing:
/// transformers builds one `(b, 1, s, s)` additive mask in the embeddings' dtype for eager
/// attention (`masking_utils.eager_mask`), and every checkpointed block keeps it as an input
/// until its backward (without checkpointing it is freed with the model's forward; SDPA without
/// padding takes `is_causal` and no mask, its math path included). One mask for the model.
pub fn checkpointed_mask(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: Width,
    attention: Attention,
) -> f64 {
    let eager = attention == Attention::Naive && !spec.sdpa_math_path;
    match spec.transformers_modules && spec.has_attention() && eager {
        true => w.residual * b * s * s,
        false => 0.0,
    }
}

/// Number of blocks a policy recomputes among `n`: one in every `k` (rounded up) for `every:K`,
/// all of them for `sqrt`. A budget is resolved first (see [`effective_policy`]).
pub fn checkpointed_blocks(policy: Checkpoint, n: u64) -> u64 {
    match policy {
        Checkpoint::EveryNth(k) => n.div_ceil(k.max(1)),
        Checkpoint::Sqrt => n,
        Checkpoint::None
        | Checkpoint::Selective
        | Checkpoint::SelectiveOp
        | Checkpoint::Budget(_) => 0,
    }
}

/// The policy the analytical model charges for `policy`: `budget:SIZE` becomes the policy with
/// the least recomputation among none and every:K (K = n … 1) whose activations fit SIZE, or
/// every block when none does; selective recomputation with memory-efficient attention is
/// none (the fused kernel keeps no s² scores and already recomputes them in its backward, so
/// selective recomputation has nothing to drop or re-run: Korthikanti et al. §5 recompute the
/// core attention that FlashAttention never stores); other policies are themselves.
pub fn effective_policy(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> Checkpoint {
    let w: Width = w.into();
    if policy == Checkpoint::Selective && attention == Attention::MemoryEfficient {
        return Checkpoint::None;
    }
    let Checkpoint::Budget(budget) = policy else {
        return policy;
    };
    let n = spec.total_blocks();
    std::iter::once(Checkpoint::None)
        .chain((1..=n).rev().map(Checkpoint::EveryNth))
        .find(|&c| model_activations(spec, s, b, w, attention, c, loss) <= budget as f64)
        .unwrap_or(Checkpoint::ALL_BLOCKS)
}

/// The checkpointed inputs held at the start of backward, as (count, bytes of each): the input
/// of every checkpointed block under `every:K`, of every segment under `sqrt`, none for the
/// other policies. Activation offload moves these to the host; backward fetches one back at a
/// time, for the block it recomputes (DeepSpeed's `cpu_checkpointing` copies it back to the
/// device synchronously at the start of the block's backward).
pub fn checkpointed_inputs(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> (u64, f64) {
    let w: Width = w.into();
    let n = spec.total_blocks();
    let input = block(spec, s, b, w, attention).input;
    let resolved = effective_policy(spec, s, b, w, attention, policy, loss);
    let count = match resolved {
        Checkpoint::EveryNth(_) => checkpointed_blocks(resolved, n),
        Checkpoint::Sqrt if n > 0 => n.div_ceil(n.div_ceil((n as f64).sqrt().ceil() as u64)),
        _ => 0,
    };
    (count, input)
}

/// Activation bytes at the peak of a step's activations: everything held at the start of
/// backward ([`held_at_backward_start`]) plus what backward re-runs one block (or segment) at a
/// time ([`recomputed`]).
///
/// A checkpointed block keeps only its input; during its backward it is recomputed, so one
/// block's activations exist again, minus the input it already holds (the input is the first
/// tensor the block saves). `sqrt` keeps the input of each of its ⌈√n⌉ segments and
/// recomputes one segment at a time. Selective recomputation drops the core-attention terms of
/// every block and recomputes them one block at a time.
pub fn model_activations(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> f64 {
    let w: Width = w.into();
    held_at_backward_start(spec, s, b, w, attention, policy, loss)
        + recomputed(spec, s, b, w, attention, policy, loss)
}

/// Activation bytes held when backward starts, at the loss's node: what each block keeps under
/// the policy and the terms outside the blocks; no block has been re-run yet.
pub fn held_at_backward_start(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> f64 {
    let w: Width = w.into();
    let blk = block(spec, s, b, w, attention);
    let n = spec.total_blocks();
    let outside = outside_blocks(spec, s, b, w, loss);
    let policy = effective_policy(spec, s, b, w, attention, policy, loss);
    let blocks = match policy {
        Checkpoint::None => n as f64 * (blk.full() + kv_cache_copies(spec, s, b, w.e, attention)),
        Checkpoint::Selective => n as f64 * blk.linear_part,
        Checkpoint::SelectiveOp => {
            n as f64 * op_selective(spec, s, b, w, attention).kept.min(blk.full())
        }
        Checkpoint::EveryNth(_) => {
            let c = checkpointed_blocks(policy, n) as f64;
            c * blk.input
                + (n as f64 - c) * blk.full()
                + checkpointed_mask(spec, s, b, w, attention)
        }
        Checkpoint::Sqrt if n > 0 => {
            let len = n.div_ceil((n as f64).sqrt().ceil() as u64);
            n.div_ceil(len) as f64 * blk.input + checkpointed_mask(spec, s, b, w, attention)
        }
        Checkpoint::Sqrt => 0.0,
        Checkpoint::Budget(_) => unreachable!("effective_policy resolves a budget"),
    };
    blocks + outside
}

/// Activation bytes backward re-creates one block (or `sqrt` segment) at a time, beyond what
/// the policy keeps: a checkpointed block's activations less its kept input, a segment's less
/// its input, the dropped core attention of one block, what selective op recomputation drops
/// from one block; nothing without recomputation.
pub fn recomputed(
    spec: &Architecture,
    s: f64,
    b: f64,
    w: impl Into<Width>,
    attention: Attention,
    policy: Checkpoint,
    loss: Loss,
) -> f64 {
    let w: Width = w.into();
    let blk = block(spec, s, b, w, attention);
    let n = spec.total_blocks();
    match effective_policy(spec, s, b, w, attention, policy, loss) {
        Checkpoint::None => 0.0,
        Checkpoint::Selective => blk.core_attention,
        Checkpoint::SelectiveOp => {
            blk.full() - op_selective(spec, s, b, w, attention).kept.min(blk.full())
        }
        Checkpoint::EveryNth(_) => blk.full() - blk.input,
        Checkpoint::Sqrt if n > 0 => {
            let len = n.div_ceil((n as f64).sqrt().ceil() as u64);
            len as f64 * blk.full() - blk.input
        }
        Checkpoint::Sqrt => 0.0,
        Checkpoint::Budget(_) => unreachable!("effective_policy resolves a budget"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqrt_keeps_segment_inputs_and_one_segment() {
        // The residual MLP at s = 32, b = 8, fp32: per block e·sb·(2h + 2f) = 4·256·1280, its
        // input e·sbh = 4·256·128. 16 blocks: ⌈√16⌉ = 4 segments of 4 blocks; backward holds
        // the 4 segment inputs and one segment re-run, less the input it already holds.
        let spec = Architecture::dense("resmlp", crate::model::Family::ResMlp, 256, 128, 16, 512);
        let (s, b, e) = (32.0, 8.0, 4.0);
        let full = e * s * b * (2.0 * 128.0 + 2.0 * 512.0);
        let input = e * s * b * 128.0;
        let outside = outside_blocks(&spec, s, b, e, Loss::Plain);
        let sqrt = model_activations(
            &spec,
            s,
            b,
            e,
            Attention::Naive,
            Checkpoint::Sqrt,
            Loss::Plain,
        );
        assert_eq!(sqrt, 4.0 * input + 4.0 * full - input + outside);
        assert_eq!(checkpointed_blocks(Checkpoint::Sqrt, 16), 16);
    }

    #[test]
    fn a_budget_buys_the_least_recomputation_that_fits_it() {
        let spec = Architecture::dense("resmlp", crate::model::Family::ResMlp, 256, 128, 16, 512);
        let (s, b, e) = (32.0, 8.0, 4.0);
        let act = |c| model_activations(&spec, s, b, e, Attention::Naive, c, Loss::Plain);
        let resolve = |budget: f64| {
            effective_policy(
                &spec,
                s,
                b,
                e,
                Attention::Naive,
                Checkpoint::Budget(budget as u64),
                Loss::Plain,
            )
        };
        // Enough for everything: nothing recomputed.
        assert_eq!(resolve(act(Checkpoint::None)), Checkpoint::None);
        // Exactly every:2's activations: every:K for K > 2 recomputes less but needs more, so
        // every:2 is the answer (every:3 keeps 10 of 16 blocks whole, every:2 only 8).
        assert!(act(Checkpoint::EveryNth(3)) > act(Checkpoint::EveryNth(2)));
        assert_eq!(
            resolve(act(Checkpoint::EveryNth(2))),
            Checkpoint::EveryNth(2)
        );
        // Too little for anything: every block, the least memory this family has.
        assert_eq!(resolve(0.0), Checkpoint::ALL_BLOCKS);
        // The budget policy is charged what its resolution is charged.
        let budget = Checkpoint::Budget(act(Checkpoint::EveryNth(2)) as u64);
        assert_eq!(act(budget), act(Checkpoint::EveryNth(2)));
    }
}
