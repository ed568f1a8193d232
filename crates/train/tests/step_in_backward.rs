//! `--optimizer-in-backward` in the engine: the weights are bitwise those of the ordinary step
//! (without clipping) for every optimizer and precision it runs with, the gradient's peak is the
//! blocks whose backward is running plus the tied embedding (derived by hand from the block
//! sizes), nothing is held between steps, the dry run predicts it exactly, and what needs every
//! gradient first is refused with the reason.

use crate::common;

use common::{assert_dry_run_exact, config, run_alone};
use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::strategy::{Checkpoint, Optimizer, Precision};

/// gpt-tiny, 8 steps of micro-batch 4, no clipping; the step in backward or after it.
fn tiny(optimizer: Optimizer, precision: Precision, in_backward: bool) -> RunConfig {
    let mut c = config(optimizer, 4, 1, 1);
    c.steps = 8;
    c.grad_clip = None;
    c.strategy.precision = precision;
    c.strategy.optimizer_in_backward = in_backward;
    c
}

#[test]
fn the_weights_are_bitwise_those_of_the_ordinary_step() {
    for optimizer in [
        Optimizer::Sgd,
        Optimizer::SgdMomentum,
        Optimizer::AdamW,
        Optimizer::AdamW8bit,
        Optimizer::Lamb,
    ] {
        for precision in [Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16] {
            let (ordinary, _) = run_alone(&tiny(optimizer, precision, false));
            let (fused, _) = run_alone(&tiny(optimizer, precision, true));
            assert!(ordinary == fused, "{optimizer} {precision}");
        }
    }
}

fn peak(t: &Trainer, c: Category) -> u64 {
    t.report().memory.peak_bytes_by_category[c]
}

#[test]
fn the_gradient_peak_is_the_running_block_and_the_tied_embedding() {
    let rounded = |bytes: usize| (bytes.div_ceil(512) * 512) as u64;
    for checkpoint in [Checkpoint::None, Checkpoint::ALL_BLOCKS] {
        let mut c = tiny(Optimizer::AdamW, Precision::Fp32, true);
        c.strategy.checkpoint = checkpoint;
        let (_, t) = run_alone(&c);
        let (_, ordinary) = run_alone(&RunConfig {
            strategy: headroom_train::strategy::Strategy {
                optimizer_in_backward: false,
                ..c.strategy
            },
            ..c.clone()
        });
        let grads: Vec<u64> = t
            .model()
            .blocks()
            .iter()
            .map(|b| rounded(4 * b.numel()))
            .collect();
        // The output layer reads the tied embedding (block 0) first and the input layer last:
        // its gradient lives through backward beside one other block's at a time.
        let largest_other = grads[1..].iter().copied().max().unwrap();
        assert_eq!(
            peak(&t, Category::Gradient),
            grads[0] + largest_other,
            "{checkpoint}"
        );
        // The ordinary step holds every gradient: the sum.
        assert_eq!(
            peak(&ordinary, Category::Gradient),
            grads.iter().sum::<u64>()
        );
        // Out-of-memory recovery would retry at twice the accumulation: off.
        assert!(ordinary.config().oom_recovery && !t.config().oom_recovery);
        // Nothing is held between steps.
        let stats = t.device().stats();
        assert_eq!(
            stats.category_bytes[Category::Gradient.index()].current,
            0,
            "{checkpoint}"
        );
        // Parameters and optimizer states are unchanged.
        for cat in [Category::Parameter, Category::OptimizerState] {
            assert_eq!(peak(&t, cat), peak(&ordinary, cat), "{checkpoint}: {cat}");
        }
    }
}

#[test]
fn the_dry_run_predicts_it_exactly() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let c = tiny(Optimizer::AdamW, precision, true);
        assert_dry_run_exact(&c, &precision.to_string());
    }
}

fn refusal(extra: TrainConfig) -> String {
    TrainConfig {
        optimizer_in_backward: Some(true),
        ..extra
    }
    .resolve()
    .unwrap_err()
    .to_string()
}

#[test]
fn what_needs_every_gradient_first_is_refused_and_clipping_defaults_off() {
    let cases = [
        (
            TrainConfig {
                accumulation: Some(2),
                ..Default::default()
            },
            "--accumulation 1",
        ),
        (
            TrainConfig {
                precision: Some(Precision::Fp16Mixed),
                ..Default::default()
            },
            "loss scaler",
        ),
        (
            TrainConfig {
                data_parallel: Some(2),
                ..Default::default()
            },
            "drop --data-parallel",
        ),
        (
            TrainConfig {
                grad_clip: Some(1.0),
                ..Default::default()
            },
            "global norm",
        ),
    ];
    for (config, why) in cases {
        let e = refusal(config);
        assert!(
            e.contains("--optimizer-in-backward") && e.contains(why),
            "{e}"
        );
    }
    let c = TrainConfig {
        optimizer_in_backward: Some(true),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(c.grad_clip, None);
    assert_eq!(
        TrainConfig::default().resolve().unwrap().grad_clip,
        Some(1.0)
    );
}
