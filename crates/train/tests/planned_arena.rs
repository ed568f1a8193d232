//! `--allocator planned` in the engine: the dry run's plan serves every training step and
//! validation of the real run without a deviation, the run computes bitwise what it computes
//! on the caching allocator, the model states take the arena's permanent region so reserved is
//! the arena alone, within 2 % of the peak allocated, and the dry run predicts the peaks
//! exactly.

use crate::common;

use common::{assert_dry_run_exact, config, run_alone};
use headroom_memory::AllocatorKind;
use headroom_train::config::RunConfig;
use headroom_train::strategy::{Optimizer, Precision};

fn with(allocator: AllocatorKind, precision: Precision) -> RunConfig {
    let mut c = config(Optimizer::AdamW, 4, 2, 1);
    c.strategy.precision = precision;
    c.allocator = allocator;
    c.steps = 5;
    c.eval_every = 2;
    c
}

#[test]
fn the_plan_serves_every_window_and_the_run_is_unchanged() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let (cached, tc) = run_alone(&with(AllocatorKind::Caching, precision));
        let (planned, tp) = run_alone(&with(AllocatorKind::Planned, precision));
        assert_eq!(planned, cached, "{precision}: losses and weights, bitwise");
        let arena = tp.report().arena.clone().expect("an arena report");
        // The model's construction, 5 steps, validations after steps 2, 4 and 5.
        assert_eq!(
            arena.windows_as_planned,
            1 + 5 + 3,
            "{precision}: {:?}",
            arena.deviations
        );
        assert_eq!((arena.windows_deviated, arena.windows_unplanned), (0, 0));
        // Model states are permanent: nothing is left to the caching pools.
        assert!(arena.requests_from_arena > 0);
        assert_eq!(arena.requests_passed_on, 0, "{precision}");
        assert!(arena.arena_bytes >= arena.planned_peak_live);
        let (c, p) = (&tc.report().memory, &tp.report().memory);
        // Everything lives in the arena, so reserved is the arena: within 2 % of the peak of
        // allocated bytes (the goal), where the caching run reserves far more.
        assert_eq!(p.peak_reserved_bytes, arena.arena_bytes, "{precision}");
        let ratio = p.peak_reserved_bytes as f64 / p.peak_allocated_bytes as f64;
        assert!(ratio <= 1.02, "{precision}: reserved/allocated {ratio}");
        assert!(c.peak_reserved_bytes > p.peak_reserved_bytes, "{precision}");
        // Arena blocks are their rounded requests; cached blocks may be larger.
        assert!(
            p.peak_allocated_bytes <= c.peak_allocated_bytes,
            "{precision}"
        );
        assert!(tc.report().arena.is_none());
    }
}

#[test]
fn the_dry_run_predicts_the_planned_run_exactly() {
    assert_dry_run_exact(&with(AllocatorKind::Planned, Precision::Fp32), "planned");
}

#[test]
fn with_dropout_the_planned_run_draws_the_masks_of_the_caching_run() {
    // The plan is recorded while preparing the run, so recording it draws nothing from the
    // random stream the real run's dropout masks come from.
    let with_dropout = |allocator| RunConfig {
        dropout: Some(0.1),
        ..with(allocator, Precision::Fp32)
    };
    let (cached, _) = run_alone(&with_dropout(AllocatorKind::Caching));
    let (planned, tp) = run_alone(&with_dropout(AllocatorKind::Planned));
    assert_eq!(planned, cached, "losses and weights, bitwise");
    let arena = tp.report().arena.clone().expect("an arena report");
    assert_eq!((arena.windows_deviated, arena.windows_unplanned), (0, 0));
}
