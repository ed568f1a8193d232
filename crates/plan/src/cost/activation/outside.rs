//! Activation terms outside the blocks: the embedding's dropout mask, the final norm's and the
//! output head's inputs, the loss's vocabulary-sized tensors (held at the start of backward,
//! and allocated by its backward), and the previous step's output a benchmark loop still holds.
//!
//! Not for: a block's terms (`block`).

use super::Width;
use super::upcasts::norm_upcast;
use crate::model::Architecture;
use crate::strategy::{Checkpoint, Loss};

/// Whole-model activation terms outside the blocks (Korthikanti §4.3 with p = 1): embedding
/// dropout mask `sbh`, final-norm input and output-projection input `2·e·sbh`, and the loss's
/// vocabulary-sized tensors held at the start of backward ([`logits`]).
pub fn outside_blocks(spec: &Architecture, s: f64, b: f64, w: impl Into<Width>, loss: Loss) -> f64 {
    let w: Width = w.into();
    let h = spec.hidden_size as f64;
    let drop = if spec.dropout { 1.0 } else { 0.0 };
    // A frozen output projection (LoRA) keeps no input for its weight's gradient.
    let head_in = if spec.lora_saves.is_some() { 0.0 } else { 1.0 };
    let final_norm = w.residual + norm_upcast(spec, w);
    drop * s * b * h + (final_norm + head_in * w.e) * s * b * h + logits(spec, s, b, w.e, loss)
}

/// The loss's vocabulary-sized tensors held at the start of backward.
///
/// Hugging Face's causal-LM models return `logits = lm_head(hidden)` in the compute dtype (bf16
/// under autocast, FSDP mixed precision or a 16-bit model); `ForCausalLMLoss`
/// (`transformers/loss/loss_utils.py`) calls `logits.float()` and `F.cross_entropy`, which is
/// `log_softmax` then `nll_loss` (PyTorch `aten/src/ATen/native/LossNLL.cpp`,
/// `cross_entropy_loss`). `log_softmax` saves its fp32 output for backward; neither the model's
/// logits nor their fp32 copy is saved by any node (`lm_head` saves its input, the cast saves
/// nothing), and the model's output that holds the logits is gone before backward:
/// `Trainer.compute_loss` returns the loss alone (`transformers/trainer.py`), as does a loop
/// that keeps `model(...).loss`. Held: the fp32 log-probabilities, `4sbv` whatever `e`. In
/// backward ([`logits_grad`]) `nll_loss_backward` allocates a zero-filled fp32 gradient of the
/// log-probabilities and `log_softmax_backward_data` a new fp32 gradient of the logits
/// (`grad − exp(out)·Σgrad`) while both are alive: 12 bytes per token per vocabulary entry at
/// the loss's peak, under fp32 and bf16 alike; the compute-dtype cast of the gradient that
/// follows is made after the saved output and the first gradient are released (`4 + e`, less).
/// In forward the loss passes through `e + 4 + 4` (logits, fp32 copy, log-probabilities), also
/// less.
///
/// Headroom's engine and the other loss implementations (a loop's own fp32 logits released
/// before backward, Megatron-LM's) hold the same fp32 log-probabilities `4sbv`, and a loss in K
/// chunks a K-th of them (the chunk's logits the first step of backward recomputes while every
/// other activation is held). MemTracker's count of transformers models agrees (the data and
/// test beside `crates/plan/tests/memtracker.rs`).
///
/// A benchmark loop that runs `out = model(...)` then `out.logits.sum().backward()`
/// (`Architecture::sum_loss`) computes no log-probabilities: `SumBackward0` saves only the
/// input's sizes (`tools/autograd/derivatives.yaml`, `sum`), and what stays is the model's
/// own logits at the compute width `e` (`e·sbv`), held by the output the loop keeps, through
/// all of backward; a chunked loss does not apply to it. A loop that keeps the output beside
/// its cross-entropy (`Architecture::outputs_kept`) holds those logits too ([`kept_logits`]).
pub fn logits(spec: &Architecture, s: f64, b: f64, e: f64, loss: Loss) -> f64 {
    let tokens_by_vocab = s * b * spec.vocab_size as f64;
    if spec.sum_loss {
        return e * tokens_by_vocab;
    }
    4.0 * tokens_by_vocab / loss.chunks() as f64 + kept_logits(spec, s, b, e)
}

/// The model's compute-dtype logits a loop keeps through backward in its output (`e·sbv`):
/// a `logits.sum()` loop's (`Architecture::sum_loss`) and a loop that keeps `outputs`
/// (`Architecture::outputs_kept`); none where the loop keeps the loss alone (the Trainer's
/// `compute_loss` returns the loss, and the output goes with its frame before backward).
/// Part of [`logits`], and what of it stays through the blocks' backward.
pub fn kept_logits(spec: &Architecture, s: f64, b: f64, e: f64) -> f64 {
    match spec.sum_loss || spec.outputs_kept {
        true => e * s * b * spec.vocab_size as f64,
        false => 0.0,
    }
}

/// The fp32 copy of the logits that Hugging Face's `ForCausalLMLoss` (`logits.float()`) holds
/// while `log_softmax` runs, in forward: `4·sbv` under a 16-bit compute dtype (in fp32
/// `float()` returns the logits themselves), none for other losses. Freed when the loss
/// returns; it matters where something else is held at that moment
/// ([`previous_outputs`]).
pub fn upcast_logits(spec: &Architecture, s: f64, b: f64, e: f64) -> f64 {
    match spec.upcasting_loss && !spec.sum_loss && e < 4.0 {
        true => 4.0 * s * b * spec.vocab_size as f64,
        false => 0.0,
    }
}

/// The vocabulary-sized gradients the loss's backward allocates beside [`logits`] at its
/// peak, when the gradient is a new tensor (not `LossImpl::InPlace`). PyTorch's eager
/// `F.cross_entropy` on fp32 logits (Hugging Face's `ForCausalLMLoss`, torchtune's and
/// torchtitan's loops alike: `Architecture::upcasting_loss`) allocates two: `nll_loss_backward`'s
/// zero-filled fp32 gradient of the log-probabilities and `log_softmax_backward_data`'s fp32
/// gradient of the logits, `8sbv`; headroom's engine, whose loss writes the logits' gradient
/// only, `4sbv`. A loss in K chunks, a K-th.
///
/// `logits.sum()` (`Architecture::sum_loss`) allocates one logits-shaped gradient at the
/// compute width, `e·sbv`: its backward, `sum_backward`
/// (`torch/csrc/autograd/FunctionsManual.cpp`), returns the 0-d seed gradient expanded to the
/// logits' shape, a view with zero strides; the output projection's `mm`/`addmm` backward
/// hands that view to cuBLAS through `prepare_matrix_for_cublas`
/// (`aten/src/ATen/native/cuda/Blas.cpp`), which clones a matrix whose strides are neither
/// row- nor column-major into a contiguous one. The input's and the weight's gradient each
/// clone it in turn inside the same node, the first freed before the second: one at a time.
pub fn logits_grad(spec: &Architecture, s: f64, b: f64, e: f64, loss: Loss) -> f64 {
    let tokens_by_vocab = s * b * spec.vocab_size as f64;
    if spec.sum_loss {
        return e * tokens_by_vocab;
    }
    let per_entry = if spec.upcasting_loss { 8.0 } else { 4.0 };
    per_entry * tokens_by_vocab / loss.chunks() as f64
}

/// What a loop that keeps the model's output (a `logits.sum()` benchmark, `Architecture::sum_loss`,
/// or `Architecture::outputs_kept`) still holds of the previous step when the next forward
/// reaches its output projection and loss: the loop reads `out = model(**inputs)`, so the
/// previous `out` is released only when the new forward has returned. That output holds the
/// previous logits (`e·sbv`) and, where the model returns a
/// key/value cache from a training forward (`Architecture::kv_cache_in_training`: transformers'
/// decoders with `use_cache`, off under gradient checkpointing: `gradient_checkpointing_enable()`
/// turns it off for the whole model, `transformers/utils/generic.py`; a model whose blocks
/// alone are switched, `every:K`, keeps the others' cache, which this leaves out,
/// `modeling_layers.py`), the cache's K and V copies of every block, `2·e·sb·kv` each
/// (`DynamicCache`'s `torch.cat` copies, `transformers/cache_utils.py`; a sliding-window
/// layer's cache keeps its window only, which this does not shorten). Zero for a loop that
/// keeps the loss alone.
pub fn previous_outputs(
    spec: &Architecture,
    s: f64,
    b: f64,
    e: f64,
    checkpoint: Checkpoint,
) -> f64 {
    if !(spec.sum_loss || spec.outputs_kept) {
        return 0.0;
    }
    let cache = spec.kv_cache_in_training
        && spec.transformers_modules
        && spec.has_attention()
        && checkpoint == Checkpoint::None;
    let cache_bytes = match cache {
        true => 2.0 * e * s * b * spec.kv_dim() as f64 * spec.total_blocks() as f64,
        false => 0.0,
    };
    e * s * b * spec.vocab_size as f64 + cache_bytes
}
