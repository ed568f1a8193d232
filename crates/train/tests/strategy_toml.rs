//! One writer of a strategy's keys: every strategy of the vocabulary, written as the TOML that
//! `headroom plan --emit headroom` writes (and `plan --emit headroom` for headroom's own models,
//! and a resumed run's keys), reads back through `TrainConfig` as `headroom train --config`
//! reads it, unchanged.

use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::export::headroom::{headroom_toml, strategy_toml};
use headroom_plan::hardware;
use headroom_plan::model::load_model;
use headroom_plan::search::Evaluator;
use headroom_plan::workload::{BatchSpec, Workload};
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Placement, Precision, Strategy, ZeroStage,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as Generator;
use std::path::Path;

fn one_of<T: Copy + std::fmt::Debug + 'static>(all: &'static [T]) -> impl Generator<Value = T> {
    proptest::sample::select(all)
}

fn checkpoint() -> impl Generator<Value = Checkpoint> {
    prop_oneof![
        Just(Checkpoint::None),
        (1u64..=u64::from(u32::MAX)).prop_map(Checkpoint::EveryNth),
        Just(Checkpoint::Sqrt),
        (0u64..=(1 << 50)).prop_map(Checkpoint::Budget),
        Just(Checkpoint::Selective),
        Just(Checkpoint::SelectiveOp),
    ]
}

fn loss() -> impl Generator<Value = Loss> {
    prop_oneof![Just(Loss::Plain), (2u64..=4096).prop_map(Loss::Chunked)]
}

fn placement() -> impl Generator<Value = Placement> {
    (
        one_of(&ZeroStage::ALL),
        one_of(Offload::ALL),
        one_of(Offload::ALL),
        one_of(Offload::ALL),
    )
        .prop_map(
            |(zero_stage, offload_optimizer, offload_params, offload_activations)| Placement {
                zero_stage,
                offload_optimizer,
                offload_params,
                offload_activations,
            },
        )
}

/// Any strategy that can run somewhere: every field drawn from its whole vocabulary, then
/// filtered by the vocabulary's own rules.
fn valid_strategy() -> impl Generator<Value = Strategy> {
    (
        one_of(Precision::ALL),
        one_of(Optimizer::ALL),
        // Most placements with offload are refused (a stage, AdamW, no step in backward):
        // local ones often, so fewer draws are rejected.
        prop_oneof![Just(Placement::default()), placement()],
        checkpoint(),
        one_of(Attention::ALL),
        loss(),
        any::<bool>(),
        1u64..=1024,
        1u64..=1024,
    )
        .prop_map(
            |(
                precision,
                optimizer,
                placement,
                checkpoint,
                attention,
                loss,
                optimizer_in_backward,
                micro_batch,
                accumulation,
            )| Strategy {
                precision,
                optimizer,
                placement,
                checkpoint,
                attention,
                loss,
                optimizer_in_backward,
                micro_batch,
                accumulation,
            },
        )
        .prop_filter("runs somewhere", |s| s.incompatibility().is_none())
}

/// The planner's problem `headroom plan --model gpt2 --gpu A100-80GB --seq-len 1024
/// --global-batch 1024` poses (any problem: the export writes the plan's strategy).
fn problem() -> Problem {
    let spec = load_model("gpt2").unwrap();
    let hw = hardware::preset("A100-80GB").unwrap();
    let workload = Workload::new(&spec, 1024, BatchSpec::Samples(1024), None, None, 1).unwrap();
    Problem::new(spec, hw, workload, CostModel::default())
}

fn read_back(text: &str) -> Strategy {
    TrainConfig::from_toml(text, Path::new("plan.toml"))
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .resolve()
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .strategy
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        max_local_rejects: 1 << 20,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_strategy_round_trips_through_the_train_config(s in valid_strategy()) {
        // The whole file `plan --emit headroom` writes for a plan of `s`.
        let problem = problem();
        let plan = problem.evaluate(&s).unwrap();
        prop_assert_eq!(plan.strategy, s);
        prop_assert_eq!(read_back(&headroom_toml(&problem, &plan)), s);
        let text = strategy_toml(&s);
        prop_assert_eq!(read_back(&text), s);
        // Every lever is written: a file holding the keys alone pins each of them.
        let pins = TrainConfig::from_toml(&text, Path::new("plan.toml")).unwrap().pins();
        prop_assert!(pins.allow(&s));
        prop_assert_eq!(
            [pins.precision.is_some(), pins.optimizer.is_some(), pins.zero_stage.is_some(),
             pins.offload_optimizer.is_some(), pins.offload_params.is_some(),
             pins.offload_activations.is_some(), pins.checkpoint.is_some(),
             pins.attention.is_some(), pins.loss.is_some(), pins.optimizer_in_backward.is_some(),
             pins.micro_batch.is_some(), pins.accumulation.is_some()],
            [true; 12]
        );
    }

    #[test]
    fn a_runs_keys_carry_its_strategy(s in valid_strategy()) {
        let mut run: RunConfig = TrainConfig::default().resolve().unwrap().with_strategy(s);
        // A valid run: the step in backward clips nothing (clipping needs every gradient).
        if s.optimizer_in_backward {
            run.grad_clip = None;
        }
        let keys = run.as_keys();
        prop_assert_eq!(keys.clone().resolve().unwrap().strategy, s);
        // Written to a file and read again, as a saved run's configuration would be.
        let text = toml::to_string(&keys).unwrap();
        prop_assert_eq!(read_back(&text), s);
    }
}

#[test]
fn the_export_writes_the_loss_and_the_step_in_backward() {
    let s = Strategy {
        precision: Precision::Bf16Mixed,
        loss: Loss::Chunked(8),
        optimizer_in_backward: true,
        micro_batch: 4,
        accumulation: 1,
        ..Strategy::default()
    };
    let text = strategy_toml(&s);
    assert!(text.contains("loss = \"chunked:8\""), "{text}");
    assert!(text.contains("optimizer_in_backward = true"), "{text}");
}
