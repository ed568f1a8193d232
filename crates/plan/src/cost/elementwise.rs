//! The memory-bound kernels of a training step: layer norms, activations, residual adds,
//! dropout, casts, the copies around attention, and the cross-entropy over the vocabulary.
//! They do a few FLOPs per byte, so they run at the GPU's memory bandwidth, not at its matmul
//! peak, and their time is the bytes they move over the bandwidth.
//!
//! Per token, a block's matmuls do `~12·h²·(1 + …)` FLOPs while its element-wise kernels move
//! `~c·h` bytes, so their share of the step grows as the width `h` shrinks: at GPT-2's 768 they
//! are a large part of the step, at Llama's 4096–8192 a small one. The loss moves
//! `b·V` bytes per token over the `V` logits (fp32 in PyTorch's log-softmax), which is GPT-2's
//! 50,257 and Llama 3's 128,256.
//!
//! `torch.compile` (TorchInductor; Ansel et al., "PyTorch 2", ASPLOS 2024) fuses chains of
//! element-wise kernels into one, so an intermediate is no longer written by one operator and
//! read by the next: its step moves fewer bytes per token, which is all this model charges it
//! for (the launches it saves are not counted). The compile lever is an input of the problem
//! (`Problem::compile`, `--compile true|false`), not a searched lever.
//!
//! **The constants**, counted, not fitted. The block term's bytes per token per block are
//! `c × h × e` (`e` the activation width, 2 bytes in 16-bit training, 4 in fp32):
//!
//! - compiled, `c` = 40 (`COMPILED`): a fused pre-norm block reads and writes the residual
//!   stream and the norm's output once per norm (each norm fused with the residual add before
//!   it: 4 + 4), applies the activation over the `4h` intermediate (read 4, write 4), and copies
//!   the attention output (2): 18 forward; backward the two norms with their residual gradients
//!   (4 + 4), the activation's gradient (read 8, write 4) and the copy (2): 22.
//! - eager adds the bytes fusion saves (`UNFUSED`, 100): the norms, activations and rotary
//!   embeddings that models write as several PyTorch operators (Hugging Face's `LlamaRMSNorm`:
//!   upcast, square, mean, scale, downcast, weight; GPT-2's `gelu_new`: a tanh polynomial of
//!   eight operators), each operator writing and reading its own intermediate.
//!
//! The loss's bytes per vocabulary entry per token are counted, not fitted (`LOSS_BYTES_*`).
//!
//! Not for: matmul time (`time`), naive attention's s² traffic (`time::attention_traffic_s`), the
//! optimizer step's traffic (`time::optimizer_step_s`).

use super::Problem;
use crate::strategy::Strategy;

/// Bytes the eager cross-entropy moves per vocabulary entry and token: forward, the upcast of
/// the 16-bit logits (read 2, write 4) and the log-softmax (two passes reading 4, writing 4);
/// backward, the NLL's zero-filled gradient (write 4), the log-softmax's backward (read 4 + 4,
/// write 4) and the cast back to 16 bits (read 4, write 2).
pub const LOSS_BYTES_EAGER: f64 = (2.0 + 4.0) + (4.0 + 4.0 + 4.0) + 4.0 + (8.0 + 4.0) + (4.0 + 2.0);

/// Bytes the compiled cross-entropy moves per vocabulary entry and token: one fused reduction
/// reading the 16-bit logits twice (maximum, then the sum of exponentials) in forward, and one
/// fused kernel reading them and writing their 16-bit gradient in backward.
pub const LOSS_BYTES_COMPILED: f64 = (2.0 + 2.0) + (2.0 + 2.0);

/// Bytes the memory-bound kernels of one step move on each device.
///
/// `recomputed_share` is the fraction of blocks whose forward runs again in backward (their
/// element-wise kernels too: a third of a block's traffic, the forward's).
pub fn bytes_per_device(problem: &Problem, s: &Strategy, recomputed_share: f64) -> f64 {
    let spec = &problem.spec;
    let tokens = problem.workload.tokens_per_step() as f64 / problem.hardware.world_size() as f64;
    let compiled = problem.cost.compiled_elementwise;
    let (c, loss) = match problem.compile {
        true => (compiled, LOSS_BYTES_COMPILED),
        false => (
            compiled + problem.cost.unfused_elementwise,
            LOSS_BYTES_EAGER,
        ),
    };
    let e = s.precision.activation_bytes() as f64;
    let blocks = spec.total_blocks() as f64 * (1.0 + recomputed_share / 3.0);
    let per_token = blocks * c * spec.hidden_size as f64 * e + loss * spec.vocab_size as f64;
    tokens * per_token
}

/// Time of the memory-bound kernels of one step, at the GPU's memory bandwidth.
pub fn seconds(problem: &Problem, s: &Strategy, recomputed_share: f64) -> f64 {
    bytes_per_device(problem, s, recomputed_share)
        / (problem.hardware.gpu.memory_bandwidth_gbps * 1e9)
}

/// `CostModel::compiled_elementwise`'s default, counted (see the module header).
pub const COMPILED: f64 = 40.0;

/// `CostModel::unfused_elementwise`'s default, counted in units of `e·h` per token and block
/// (forward plus backward, each written-out operator reading and writing its tensors): two
/// RMSNorm-style norms of six operators (about 16 each forward, 32 backward: 96) and a
/// rotary embedding over the queries and keys (about 10 forward, 20 backward: 30), less the
/// one fused kernel each becomes (about 26): 100.
pub const UNFUSED: f64 = 100.0;
