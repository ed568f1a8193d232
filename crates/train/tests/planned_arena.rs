//! `--allocator planned` in the engine: the dry run's plan serves every training step and
//! validation of the real run without a deviation, the run computes bitwise what it computes
//! on the caching allocator, reserved is the arena plus the caching pools' model states, and
//! the dry run predicts the peaks exactly.

mod common;

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
        // 5 steps, validations after steps 2, 4 and 5.
        assert_eq!(
            arena.windows_as_planned,
            5 + 3,
            "{precision}: {:?}",
            arena.deviations
        );
        assert_eq!((arena.windows_deviated, arena.windows_unplanned), (0, 0));
        assert!(arena.requests_from_arena > 0 && arena.requests_passed_on > 0);
        assert!(arena.arena_bytes >= arena.planned_peak_live);
        let (c, p) = (&tc.report().memory, &tp.report().memory);
        // The caching pools serve only what outlives a window (model states): they never
        // reserve more than the whole caching run did. (On gpt-tiny those states fit in one
        // 2 MiB segment whose free part the caching run also fills with activations, so the
        // planned run's total is not lower here; on the default model it is, see
        // docs/benchmarks.md.)
        let pools = p.peak_reserved_bytes - arena.arena_bytes;
        assert!(
            pools <= c.peak_reserved_bytes,
            "{precision}: {pools} vs {}",
            c.peak_reserved_bytes
        );
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
