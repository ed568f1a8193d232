//! Checkpoint policies in real training runs: every policy gives bitwise the same losses and
//! weights as none (fp32, GPT and residual MLP); recomputation lowers the activation peak; a
//! budget plan never exceeds its budget, recomputes no more than √n when √n fits the same budget,
//! and its dry-run peak is exactly the peak the real run measures.

use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::TrainConfig;
use headroom_train::data::Corpus;
use headroom_train::recompute::policy::recompute_for;
use headroom_train::recompute::{Plan, dry_run};
use headroom_train::strategy::{Checkpoint, Loss};

fn run(model: &str, policy: &str, steps: u64) -> (Vec<u64>, Vec<u32>, u64, Option<u64>) {
    let c = TrainConfig {
        model: Some(model.into()),
        micro_batch: Some(4),
        seq_len: Some(32),
        steps: Some(steps),
        eval_every: Some(0),
        eval_batches: Some(1),
        checkpoint: Some(policy.parse().unwrap()),
        device_memory: Some("512MiB".parse().unwrap()),
        seed: Some(5),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    // The trainer plans its recomputation from the configured policy.
    let mut t = Trainer::new(c.clone(), &Corpus::bundled()).unwrap();
    let decision = t.budget_decision().cloned();
    let report = t.train(&mut |_| {}).unwrap().clone();
    let losses = report.losses.iter().map(|l| l.to_bits()).collect();
    let weights = t
        .model()
        .blocks()
        .iter()
        .flat_map(|b| b.flat().to_vec_f32().unwrap())
        .map(|w| w.to_bits())
        .collect();
    (
        losses,
        weights,
        report.memory.peak_bytes_by_category[Category::Activation],
        decision.map(|d| d.optimal.2),
    )
}

#[test]
fn every_policy_matches_none_bitwise_and_saves_activations() {
    for model in ["gpt-tiny", "resmlp"] {
        let (losses, weights, none_peak, _) = run(model, "none", 2);
        for policy in ["all", "every:2", "sqrt", "selective"] {
            if model == "resmlp" && policy == "selective" {
                continue; // selective recomputation targets attention and GELU inside GPT blocks
            }
            let (l, w, peak, _) = run(model, policy, 2);
            assert_eq!(l, losses, "{model} {policy}: losses differ");
            assert!(w == weights, "{model} {policy}: weights differ");
            assert!(
                peak < none_peak,
                "{model} {policy}: activation peak {peak} not below none's {none_peak}"
            );
        }
    }
}

#[test]
fn budget_plans_fit_and_never_recompute_more_than_sqrt() {
    // resmlp: 16 blocks at micro-batch 4 × 32 tokens.
    let spec = headroom_nn::models::preset("resmlp").unwrap();
    let dtype = headroom_tensor::DType::F32;
    let sqrt_peak = dry_run::activation_peak(
        &spec,
        dtype,
        4,
        32,
        &headroom_nn::Recompute {
            segments: Plan::sqrt(16).segments,
            selective: false,
            ..Default::default()
        },
    )
    .unwrap();
    let none_peak =
        dry_run::activation_peak(&spec, dtype, 4, 32, &headroom_nn::Recompute::none()).unwrap();
    for budget in [sqrt_peak, (sqrt_peak + none_peak) / 2, none_peak - 1] {
        let (_, decision) =
            recompute_for(Checkpoint::Budget(budget), Loss::Plain, &spec, dtype, 4, 32).unwrap();
        let d = decision.unwrap();
        let (plan, cost, peak) = d.optimal;
        assert!(peak <= budget, "budget {budget}: dry-run peak {peak}");
        assert!(
            cost.recompute <= 16,
            "never more than √n's 16 recomputed blocks: {plan:?}"
        );
        if let Some((_, chen_cost, chen_peak)) = d.chen {
            assert!(chen_peak <= budget || chen_cost.recompute >= cost.recompute);
            assert!(
                cost.recompute <= chen_cost.recompute,
                "the exact plan beats or matches Chen's"
            );
        }
    }
    let (_, decision) = recompute_for(
        Checkpoint::Budget(none_peak),
        Loss::Plain,
        &spec,
        dtype,
        4,
        32,
    )
    .unwrap();
    assert_eq!(
        decision.unwrap().optimal.1.recompute,
        0,
        "a budget that fits everything recomputes nothing"
    );
}

#[test]
fn a_budget_runs_within_it_and_the_dry_run_peak_is_the_measured_peak() {
    let spec = headroom_nn::models::preset("resmlp").unwrap();
    let none_peak = dry_run::activation_peak(
        &spec,
        headroom_tensor::DType::F32,
        4,
        32,
        &headroom_nn::Recompute::none(),
    )
    .unwrap();
    let budget = none_peak * 6 / 10;
    let (_, _, measured, predicted) = run("resmlp", &format!("budget:{budget}"), 1);
    assert!(measured <= budget, "measured {measured} > budget {budget}");
    assert_eq!(
        Some(measured),
        predicted,
        "dry run and real run see the same activation peak"
    );
}

#[test]
fn activation_bytes_per_policy_match_the_hand_count() {
    // Residual MLP, 4 blocks, width C = 8, hidden H = 32, micro-batch 2 × 8 tokens: N = 16 rows.
    // What each op saves (crates/tensor/src/backprop.rs), every buffer rounded up to 512 bytes:
    //   block input x (N·C·4 = 512, kept by the layer norm), the norm's mean and rstd (N·4 = 64
    //   → 512 each), its output y (512, kept by the first matmul), the biased first matmul
    //   output (N·H·4 = 2048, kept by the fused GELU and second matmul, which recomputes the
    //   GELU output in backward instead of keeping it). So in = 512 and inner = 512 + 512 + 512
    //   + 2048 = 3584 per block.
    //   Head: final norm (its input 512, mean 512, rstd 512), its output (512, kept by the output
    //   matmul), the log-probabilities (N·256·4 = 16384, kept by log-softmax) and the loss (512):
    //   18,944 bytes.
    let spec = headroom_nn::models::ModelSpec::Resmlp(headroom_nn::models::ResMlpConfig {
        vocab: 256,
        width: 8,
        hidden: 32,
        depth: 4,
        dropout: 0.0,
    });
    let after = |segments: Vec<std::ops::Range<usize>>| {
        dry_run::after_forward(
            &spec,
            headroom_tensor::DType::F32,
            2,
            8,
            &headroom_nn::Recompute {
                segments,
                selective: false,
                ..Default::default()
            },
        )
        .unwrap()
    };
    let head = 512 * 4 + 16384 + 512;
    // none: 4 blocks in full + head.
    assert_eq!(after(Vec::new()), 4 * (512 + 3584) + head);
    // all: one input per block + head.
    assert_eq!(after(Plan::every_block(4).segments), 4 * 512 + head);
    // sqrt: 2 segments of 2 blocks, each keeping its input.
    assert_eq!(after(Plan::sqrt(4).segments), 2 * 512 + head);
    // every:2: blocks 0 and 2 keep only their inputs, 1 and 3 everything.
    assert_eq!(
        after(Plan::every_kth(4, 2).segments),
        2 * 512 + 2 * (512 + 3584) + head
    );
}
