//! The speed model saturates with the work of a micro-batch: small micro-batches leave a GPU
//! partly idle, so accumulation is not free and the search stops recommending micro-batch 1
//! whenever a larger one fits (issue: `bert-large-uncased` on a V100 and `gpt2` on an RTX 4090
//! came out as 1 × 256 and 1 × 32).

use crate::support;

use headroom_plan::cost::time::achieved_efficiency;
use headroom_plan::cost::{Problem, evaluate};
use headroom_plan::search::search;
use headroom_plan::strategy::{Pins, Precision};
use support::{plain_strategy, problem};

#[test]
fn the_fit_reproduces_hugging_faces_bert_large_v100_measurement() {
    // Hugging Face, "Efficient Training on a Single GPU" (Transformers v4.21 docs):
    // bert-large-uncased, 512 tokens, fp32 on a V100-SXM2 16 GB, 8.86 samples/s at micro-batch 4
    // and 7.75 at micro-batch 1 × accumulation 4: micro-batch 4 is 8.86 / 7.75 = 1.143× faster.
    let p = problem("bert-large-uncased", "V100-16GB", 1, 1, 512, 4);
    let ratio =
        achieved_efficiency(&p, Precision::Fp32, 4) / achieved_efficiency(&p, Precision::Fp32, 1);
    let measured = 8.86 / 7.75;
    assert!(
        (ratio - measured).abs() < 0.01,
        "{ratio} against {measured}"
    );
    // By hand: w½ = 105,000 on the reference peak; w = 512·1024·m, so the ratio is
    // 4·(524,288 + 105,000) / (2,097,152 + 105,000) = 1.1428.
    assert!((ratio - 1.1428).abs() < 1e-3, "{ratio}");
    // The whole step (the optimizer step and the attention traffic included) shows the same.
    let one = evaluate(&p, &plain_strategy(Precision::Fp32, 1, 4));
    let four = evaluate(&p, &plain_strategy(Precision::Fp32, 4, 1));
    let step_ratio = one.time.step_s / four.time.step_s;
    assert!(
        (step_ratio - measured).abs() < 0.03,
        "{step_ratio} against {measured}"
    );
}

#[test]
fn efficiency_rises_with_the_micro_batch_towards_the_saturated_value() {
    let p = problem("llama-2-7b", "H100-80GB", 1, 1, 4096, 8);
    // The micro-batch saturates towards the saturated efficiency the matmuls' shape allows.
    let saturated = headroom_plan::cost::efficiency::saturated(&p, Precision::Bf16Mixed)
        * headroom_plan::cost::time::shape_efficiency(&p, Precision::Bf16Mixed);
    let mut last = 0.0;
    for mb in [1, 2, 4, 8, 64, 4096] {
        let e = achieved_efficiency(&p, Precision::Bf16Mixed, mb);
        assert!(e > last && e < saturated, "micro-batch {mb}: {e}");
        last = e;
    }
    assert!(saturated - last < 1e-3 * saturated, "{last}");
    // A faster GPU needs more work to fill: the same micro-batch fills less of an H100's bf16
    // peak than of an A100's, and of its own fp32 peak (the fraction of the efficiency the
    // saturated micro-batch reaches, the GPU's and the shape's factors divided out).
    let fill = |p: &Problem, precision: Precision| {
        achieved_efficiency(p, precision, 1)
            / (headroom_plan::cost::efficiency::saturated(p, precision)
                * headroom_plan::cost::time::shape_efficiency(p, precision))
    };
    let a100 = problem("llama-2-7b", "A100-80GB", 1, 1, 4096, 8);
    let h100 = fill(&p, Precision::Bf16Mixed);
    assert!(h100 < fill(&a100, Precision::Bf16Mixed));
    assert!(h100 < fill(&p, Precision::Fp32));
}

fn recommended_micro_batch(p: &Problem) -> u64 {
    let out = search(p, &Pins::default(), None).unwrap();
    out.fitting[0].strategy.micro_batch
}

#[test]
fn the_search_prefers_a_larger_micro_batch_to_accumulation() {
    // The two runs: both fit far more than one sequence per micro-batch.
    let bert = problem("bert-large-uncased", "V100-16GB", 1, 1, 128, 256);
    assert!(recommended_micro_batch(&bert) >= 4);
    let gpt2 = problem("gpt2", "RTX-4090", 1, 1, 1024, 32);
    assert!(recommended_micro_batch(&gpt2) > 1);
    // Everything else fixed, a larger micro-batch with less accumulation is faster.
    let split = |mb| {
        evaluate(&bert, &plain_strategy(Precision::Fp32, mb, 256 / mb))
            .time
            .step_s
    };
    assert!(split(1) > split(2) && split(2) > split(8) && split(8) > split(32));
}
