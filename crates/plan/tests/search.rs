//! The one search on a toy evaluator whose answers are known by hand: a costly evaluator is
//! searched tier by tier with the largest fitting micro-batch found by bisection; a cheap one
//! evaluates everything; the configured strategy wins near ties; nothing fitting names the
//! closest miss; pins are kept.

use headroom_memory::MemoryBreakdown;
use headroom_plan::cost::memory::{MemoryPrediction, Phase};
use headroom_plan::cost::{Plan, StepTime};
use headroom_plan::search::{Evaluator, Space, search};
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Optimizer, Pins, Placement, Precision, Strategy, StrategyError,
    batch_splits,
};
use std::sync::Mutex;

/// Memory: 10 bytes per sample of micro-batch, halved with 16-bit precision and halved again by
/// checkpointing every block. Time: 1 s per step, +4 % with checkpointing, −20 % with
/// bf16-mixed, and pure bf16 (tier 1) −50 %.
struct Toy {
    budget: u64,
    exhaustive: bool,
    evaluated: Mutex<Vec<Strategy>>,
}

impl Toy {
    fn new(budget: u64, exhaustive: bool) -> Toy {
        Toy {
            budget,
            exhaustive,
            evaluated: Mutex::new(Vec::new()),
        }
    }
}

impl Evaluator for Toy {
    type Error = StrategyError;

    fn space(&self, _pins: &Pins) -> Result<Space, StrategyError> {
        Ok(Space {
            precisions: vec![Precision::Fp32, Precision::Bf16Mixed, Precision::Bf16],
            optimizers: vec![Optimizer::AdamW],
            placements: vec![Placement::default()],
            checkpoints: vec![Checkpoint::None, Checkpoint::ALL_BLOCKS],
            attentions: vec![Attention::Naive],
            losses: vec![Loss::Plain],
            in_backward: vec![false],
            splits: batch_splits(16, None, None),
        })
    }

    fn evaluate(&self, s: &Strategy) -> Result<Plan, StrategyError> {
        self.evaluated.lock().unwrap().push(*s);
        let mut bytes = 10 * s.micro_batch;
        let mut step_s = 1.0;
        if s.precision != Precision::Fp32 {
            bytes /= 2;
        }
        if s.checkpoint != Checkpoint::None {
            bytes /= 2;
            step_s *= 1.04;
        }
        match s.precision {
            Precision::Bf16Mixed => step_s *= 0.8,
            Precision::Bf16 => step_s *= 0.5,
            _ => {}
        }
        Ok(Plan {
            strategy: *s,
            fits: bytes <= self.budget,
            memory: MemoryPrediction {
                per_device_peak_bytes: bytes,
                breakdown: MemoryBreakdown::default(),
                peak_phase: Phase::ForwardBackward,
                capacity_bytes: self.budget,
                usable_bytes: self.budget,
                host_bytes_per_node: 0,
                nvme_bytes_per_node: 0,
            },
            time: StepTime {
                step_s,
                tokens_per_s: 16.0 / step_s,
                ..StepTime::default()
            },
            fidelity_tier: s.fidelity_tier(),
        })
    }

    fn exhaustive(&self) -> bool {
        self.exhaustive
    }
}

#[test]
fn a_costly_search_stops_at_the_first_tier_that_fits_and_bisects_the_splits() {
    // Budget 40: fp32 fits micro-batch 4 (40 B) or 8 with checkpointing; bf16-mixed fits 8, or
    // 16 with checkpointing. Tier 0 fits, so pure bf16 (tier 1) is never evaluated.
    let toy = Toy::new(40, false);
    let out = search(&toy, &Pins::default(), None).unwrap();
    let evaluated = toy.evaluated.lock().unwrap().clone();
    assert!(evaluated.iter().all(|s| s.precision != Precision::Bf16));
    // Per combination the largest fitting micro-batch: 4, 8, 8 and 16.
    let mut found: Vec<(Precision, Checkpoint, u64)> = out
        .fitting
        .iter()
        .map(|p| {
            (
                p.strategy.precision,
                p.strategy.checkpoint,
                p.strategy.micro_batch,
            )
        })
        .collect();
    found.sort();
    assert_eq!(
        found,
        vec![
            (Precision::Fp32, Checkpoint::None, 4),
            (Precision::Fp32, Checkpoint::ALL_BLOCKS, 8),
            (Precision::Bf16Mixed, Checkpoint::None, 8),
            (Precision::Bf16Mixed, Checkpoint::ALL_BLOCKS, 16),
        ]
    );
    // Five splits (16, 8, 4, 2, 1) per combination: at most 2 + ⌈log₂ 5⌉ = 5 dry runs each.
    assert!(evaluated.len() <= 4 * 5);
    assert_eq!(out.evaluated, evaluated.len());
    // The fastest fitting plan: bf16-mixed without recomputation (0.8 s).
    let best = out.recommended().unwrap().strategy;
    assert_eq!(
        (best.precision, best.checkpoint),
        (Precision::Bf16Mixed, Checkpoint::None)
    );
}

#[test]
fn a_cheap_search_evaluates_every_strategy() {
    let toy = Toy::new(40, true);
    let out = search(&toy, &Pins::default(), None).unwrap();
    // 3 precisions × 2 policies × 5 splits.
    assert_eq!(out.evaluated, 30);
    assert_eq!(toy.evaluated.lock().unwrap().len(), 30);
    // Pure bf16 is faster but tier 1: tier 0 ranks first.
    assert_eq!(out.recommended().unwrap().fidelity_tier, 0);
}

#[test]
fn the_configured_strategy_wins_a_near_tie() {
    // Budget 20: bf16-mixed fits micro-batch 4 (5 B a sample) in 0.80 s, or 8 with
    // checkpointing (2.5 B a sample) in 0.832 s, within 5 % of the fastest; fp32 with
    // checkpointing fits 4 in 1.04 s, not within 5 %.
    let near = Strategy {
        precision: Precision::Bf16Mixed,
        checkpoint: Checkpoint::ALL_BLOCKS,
        micro_batch: 8,
        accumulation: 2,
        ..Strategy::default()
    };
    let out = search(&Toy::new(20, false), &Pins::default(), Some(&near)).unwrap();
    assert_eq!(out.recommended().unwrap().strategy, near);
    assert!(!out.recommends_the_fastest());
    // Without a configuration, or with one that is too slow, the fastest wins.
    let fastest = |configured: Option<&Strategy>| {
        let out = search(&Toy::new(20, false), &Pins::default(), configured).unwrap();
        out.recommended().unwrap().strategy
    };
    let slow = Strategy {
        precision: Precision::Fp32,
        micro_batch: 4,
        accumulation: 4,
        ..near
    };
    for configured in [None, Some(&slow)] {
        let best = fastest(configured);
        assert_eq!(
            (best.precision, best.checkpoint, best.micro_batch),
            (Precision::Bf16Mixed, Checkpoint::None, 4)
        );
    }
}

#[test]
fn nothing_fitting_names_the_closest_miss_and_pins_are_kept() {
    let pins = Pins {
        precision: Some(Precision::Fp32),
        checkpoint: Some(Checkpoint::None),
        ..Pins::default()
    };
    let out = search(&Toy::new(5, false), &pins, None).unwrap();
    assert!(out.fitting.is_empty());
    // The smallest fp32 plan without checkpointing: micro-batch 1, 10 bytes.
    let closest = out.closest.unwrap();
    assert_eq!(closest.strategy.micro_batch, 1);
    assert_eq!(closest.memory.per_device_peak_bytes, 10);
    assert!(out.rejected.iter().all(|p| pins.allow(&p.strategy)));
}
