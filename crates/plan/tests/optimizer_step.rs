//! The optimizer step's temporaries, against PyTorch's foreach AdamW (`_multi_tensor_adam` in
//! `torch/optim/adam.py`) read op by op: every `_foreach_*` op updates in place except
//! `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`, one new list the size and dtype of
//! the variance, so the step holds one copy of the parameters in the states' format.

use crate::support;

use headroom_plan::cost::memory::Phase;
use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::strategy::{Category, Framework, Optimizer, OptimizerImpl, Precision, Strategy};
use support::{plain_strategy, problem};

/// GPT-2's parameters (wte 50,257·768 + wpe 1,024·768 + 12 blocks of 7,087,872 + the final
/// norm's 1,536; the head is tied).
const PSI: u64 = 124_439_808;

fn gpt2(framework: Framework) -> Problem {
    // 16 tokens: the step, not the activations, sets the peak.
    problem("gpt2", "A100-80GB", 1, 1, 16, 1)
        .with_framework(framework)
        .with_optimizer_impl(OptimizerImpl::Foreach)
}

#[test]
fn pure_bf16_foreach_adamw_holds_one_bf16_copy_at_the_step() {
    assert_eq!(gpt2(Framework::Fsdp).facts.params, PSI);
    for framework in [Framework::Fsdp, Framework::DeepSpeed] {
        let plan = evaluate(&gpt2(framework), &plain_strategy(Precision::Bf16, 1, 1));
        let m = &plan.memory;
        assert_eq!(m.peak_phase, Phase::OptimizerStep);
        let at = |c| m.breakdown.at_peak[c];
        // bf16 parameters, gradients, momentum and variance, and the bf16 square root of the
        // variance: 2 + 2 + 4 + 2 bytes a parameter.
        assert_eq!(at(Category::Temporary), 2 * PSI);
        assert_eq!(
            at(Category::Parameter) + at(Category::Gradient) + at(Category::OptimizerState),
            8 * PSI
        );
    }
    // Under FSDP mixed precision the states are fp32, and so is the square root.
    let plan = evaluate(
        &gpt2(Framework::Fsdp),
        &plain_strategy(Precision::Bf16Mixed, 1, 1),
    );
    assert_eq!(plan.memory.breakdown.at_peak[Category::Temporary], 4 * PSI);
}

#[test]
fn bf16_states_take_a_bf16_square_root() {
    // adamw-bf16 keeps momentum and variance in bf16 beside fp32 master weights: the
    // variance's square root is bf16 too, 2 bytes a parameter, not the masters' 4.
    let s = Strategy {
        optimizer: Optimizer::AdamWBf16,
        ..plain_strategy(Precision::Bf16Mixed, 1, 1)
    };
    let plan = evaluate(&gpt2(Framework::DeepSpeed), &s);
    assert_eq!(plan.memory.peak_phase, Phase::OptimizerStep);
    assert_eq!(
        plan.memory.breakdown.at_peak[Category::OptimizerState],
        4 * PSI
    );
    assert_eq!(plan.memory.breakdown.at_peak[Category::Temporary], 2 * PSI);
}
