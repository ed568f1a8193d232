//! Which kernel runs a Hugging Face model's attention under `--attention memory-efficient`.
//!
//! transformers' SDPA attention calls `torch.nn.functional.scaled_dot_product_attention`, and
//! PyTorch's CUDA dispatch (`select_sdp_backend` in
//! `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`, priority flash, memory-efficient,
//! math) picks:
//! - **flash** for fp16/bf16 inputs with a head size of at most 256 (`check_head_dim_size_flash`;
//!   grouped-query heads allowed) on sm80 or later (`check_sm_version`; the planner reads a GPU
//!   with bf16 tensor cores as one: every NVIDIA preset with them is Ampere or later, and the
//!   V100, sm70, has none; the MI300X's ROCm build has a flash kernel of its own, AOTriton's,
//!   taken as the same rule);
//! - else **memory-efficient** when query, key and value have the same number of heads
//!   (`check_batch_size_and_num_heads_dense<false>`: the kernel takes no `enable_gqa`);
//! - else the **math** path (`_scaled_dot_product_attention_math` in
//!   `aten/src/ATen/native/transformers/attention.cpp`): K and V repeated to every query head
//!   (`repeat_interleave`), the B·H·T·T scores and the softmax materialised, the softmax's output
//!   saved for backward. What it holds is what the eager attention holds (query, repeated K and
//!   V, probabilities at the input's width), so the plan charges it as `Attention::Naive`.
//!
//! transformers passes `enable_gqa=True` and no mask for an unpadded causal batch
//! (`use_gqa_in_sdpa`, `transformers/integrations/sdpa_attention.py`), the batches the planner
//! models, so a grouped-query model in fp32 (no autocast to cast its inputs to 16 bits) or with
//! heads wider than 256 runs the math path. The tracer emulates the same dispatch
//! (`python/headroom/trace/cuda.py`), which is where the difference showed: fp32 Llama, Mistral,
//! Gemma and Qwen2 traces up to 15 % above a plan that assumed the fused kernel.
//!
//! Frameworks that build their own modules (torchtune, torchtitan, Megatron-LM) and headroom's
//! engine run attention kernels that take grouped heads in any dtype: their plans keep the lever
//! as given.
//!
//! Not for: what each kernel saves (see `activation`).

use super::Problem;
use crate::strategy::{Attention, Precision, Strategy};
use std::borrow::Cow;

/// Flash attention's largest head size on sm80 and later (`check_head_dim_size_flash`).
pub const FLASH_MAX_HEAD_DIM: u64 = 256;

/// The kernel SDPA runs for a Hugging Face model's attention, by the dispatch above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdpaKernel {
    Flash,
    MemoryEfficient,
    Math,
}

/// Which kernel `s`'s attention runs on `problem`; `None` where the lever is not SDPA (naive
/// attention, a model without attention) or the modules are not transformers'.
pub fn kernel(problem: &Problem, s: &Strategy) -> Option<SdpaKernel> {
    let spec = &problem.spec;
    if s.attention != Attention::MemoryEfficient
        || !spec.has_attention()
        || !spec.transformers_modules
    {
        return None;
    }
    // Every precision but fp32 hands SDPA 16-bit inputs: a 16-bit model, or autocast, which
    // casts the op's inputs (`lower_precision_fp` in aten/src/ATen/autocast_mode.cpp).
    let sixteen_bit = s.precision != Precision::Fp32;
    let sm80 = problem.hardware.gpu.bf16_tflops > 0.0;
    Some(
        if sixteen_bit && sm80 && spec.head_dim <= FLASH_MAX_HEAD_DIM {
            SdpaKernel::Flash
        } else if spec.num_kv_heads == spec.num_heads {
            SdpaKernel::MemoryEfficient
        } else {
            SdpaKernel::Math
        },
    )
}

/// `problem` and `s` as the kernel runs them: where SDPA falls back to its math path, naive
/// attention on a model marked as taking no mask (`Architecture::sdpa_math_path`); the problem
/// and lever as given otherwise. Memory and time are predicted for these; the plan still
/// reports the lever the user sets.
pub fn as_run<'a>(problem: &'a Problem, s: &Strategy) -> (Cow<'a, Problem>, Strategy) {
    match kernel(problem, s) {
        Some(SdpaKernel::Math) => {
            let mut run = problem.clone();
            run.spec.sdpa_math_path = true;
            let naive = Strategy {
                attention: Attention::Naive,
                ..*s
            };
            (Cow::Owned(run), naive)
        }
        _ => (Cow::Borrowed(problem), *s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::CostModel;
    use crate::hardware;
    use crate::model::load_model;
    use crate::workload::{BatchSpec, Workload};

    fn problem(model: &str) -> Problem {
        let spec = load_model(model).unwrap();
        let hw = hardware::preset("A100-80GB").unwrap();
        let w = Workload::new(&spec, 1024, BatchSpec::Samples(8), None, None, 1).unwrap();
        Problem::new(spec, hw, w, CostModel::default())
    }

    fn sdpa(precision: Precision) -> Strategy {
        Strategy {
            precision,
            attention: Attention::MemoryEfficient,
            ..Strategy::default()
        }
    }

    #[test]
    fn grouped_query_heads_in_fp32_run_the_math_path_and_16_bits_run_flash() {
        // Llama-3-8B: 32 query heads over 8 key/value heads of 128.
        let p = problem("llama-3-8b");
        assert_eq!(kernel(&p, &sdpa(Precision::Fp32)), Some(SdpaKernel::Math));
        let (run, s) = as_run(&p, &sdpa(Precision::Fp32));
        assert_eq!(s.attention, Attention::Naive);
        assert!(run.spec.sdpa_math_path && !p.spec.sdpa_math_path);
        for precision in [Precision::Bf16, Precision::Bf16Mixed, Precision::Fp16Mixed] {
            assert_eq!(kernel(&p, &sdpa(precision)), Some(SdpaKernel::Flash));
            let (run, s) = as_run(&p, &sdpa(precision));
            assert_eq!(s, sdpa(precision));
            assert!(!run.spec.sdpa_math_path);
        }
    }

    #[test]
    fn equal_heads_in_fp32_run_the_memory_efficient_kernel() {
        // GPT-2 and Llama-2-7B have as many key/value heads as query heads.
        for model in ["gpt2", "llama-2-7b"] {
            let p = problem(model);
            assert_eq!(
                kernel(&p, &sdpa(Precision::Fp32)),
                Some(SdpaKernel::MemoryEfficient)
            );
            assert_eq!(as_run(&p, &sdpa(Precision::Fp32)).1, sdpa(Precision::Fp32));
        }
    }

    #[test]
    fn heads_wider_than_flash_takes_leave_flash_in_16_bits() {
        let mut p = problem("llama-3-8b");
        p.spec.head_dim = 512;
        assert_eq!(kernel(&p, &sdpa(Precision::Bf16)), Some(SdpaKernel::Math));
        p.spec.num_kv_heads = p.spec.num_heads;
        assert_eq!(
            kernel(&p, &sdpa(Precision::Bf16)),
            Some(SdpaKernel::MemoryEfficient)
        );
    }

    #[test]
    fn a_v100_has_no_flash_so_grouped_heads_take_the_math_path_in_16_bits() {
        let mut p = problem("llama-3-8b");
        p.hardware = hardware::preset("V100-32GB").unwrap();
        assert_eq!(
            kernel(&p, &sdpa(Precision::Fp16Mixed)),
            Some(SdpaKernel::Math)
        );
        p.spec.num_kv_heads = p.spec.num_heads;
        assert_eq!(
            kernel(&p, &sdpa(Precision::Fp16Mixed)),
            Some(SdpaKernel::MemoryEfficient)
        );
    }

    #[test]
    fn naive_attention_and_other_frameworks_modules_keep_the_lever() {
        let p = problem("llama-3-8b");
        let naive = Strategy {
            attention: Attention::Naive,
            ..sdpa(Precision::Fp32)
        };
        assert_eq!(kernel(&p, &naive), None);
        let mut own = problem("llama-3-8b");
        own.spec.transformers_modules = false;
        assert_eq!(kernel(&own, &sdpa(Precision::Fp32)), None);
        assert_eq!(
            as_run(&own, &sdpa(Precision::Fp32)).1,
            sdpa(Precision::Fp32)
        );
    }
}
