//! `--optimizer paged-adamw-8bit` in the engine: bitwise the weights of 8-bit AdamW (paging
//! moves bytes, never values), its device `optimizer_state` is one block's state at a time
//! (derived by hand from the block sizes), the dry run predicts it exactly, it saves and
//! resumes bitwise, and it runs with the step in backward.

use crate::common;

use common::{assert_dry_run_exact, config, outcome, rounded, run_alone};
use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::data::Corpus;
use headroom_train::strategy::{Optimizer, Precision};

fn run(optimizer: Optimizer, precision: Precision) -> RunConfig {
    let mut c = config(optimizer, 4, 1, 1);
    c.steps = 6;
    c.strategy.precision = precision;
    c
}

/// 8-bit states of a block of `p` parameters: two moments' codes (p bytes each) and their
/// absmax (4 bytes per 256), each allocation rounded up to 512 bytes.
fn state_bytes(p: usize) -> usize {
    2 * rounded(p) + 2 * rounded(4 * p.div_ceil(256))
}

#[test]
fn paged_states_give_the_8_bit_weights_with_one_block_on_the_device() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let (plain, t8) = run_alone(&run(Optimizer::AdamW8bit, precision));
        let (paged, tp) = run_alone(&run(Optimizer::PagedAdamW8bit, precision));
        assert!(plain == paged, "{precision}: paging changed a value");
        let blocks: Vec<usize> = tp.model().blocks().iter().map(|b| b.numel()).collect();
        let all: usize = blocks.iter().map(|&p| state_bytes(p)).sum();
        let largest = blocks.iter().map(|&p| state_bytes(p)).max().unwrap();
        let peak = |t: &Trainer| t.report().memory.peak_bytes_by_category[Category::OptimizerState];
        assert_eq!(peak(&t8), all as u64, "{precision}");
        assert_eq!(peak(&tp), largest as u64, "{precision}");
        // Between steps nothing of the state is on the device.
        assert_eq!(
            tp.report().memory.breakdown.steady[Category::OptimizerState],
            0,
            "{precision}"
        );
    }
}

#[test]
fn a_steady_step_pages_every_state_in_and_out() {
    let corpus = Corpus::bundled();
    let c = run(Optimizer::PagedAdamW8bit, Precision::Fp32);
    let dry = headroom_train::predict::dry_run_counted(&c, &corpus).unwrap();
    let (_, t) = run_alone(&c);
    // After the first step every block's state is on the host: a steady step copies each one
    // onto the device for its update and back (the allocator's 512-byte rounding is device
    // padding, not copied bytes).
    let exact = |p: usize| 2 * p + 2 * 4 * p.div_ceil(256);
    let all: usize = t.model().blocks().iter().map(|b| exact(b.numel())).sum();
    assert_eq!(dry.step_work.host_transfer_bytes, 2.0 * all as f64);
    let unpaged = headroom_train::predict::dry_run_counted(
        &run(Optimizer::AdamW8bit, Precision::Fp32),
        &corpus,
    )
    .unwrap();
    assert_eq!(unpaged.step_work.host_transfer_bytes, 0.0);
}

#[test]
fn the_dry_run_predicts_paged_states_exactly() {
    assert_dry_run_exact(
        &run(Optimizer::PagedAdamW8bit, Precision::Bf16Mixed),
        "paged",
    );
    let mut c = run(Optimizer::PagedAdamW8bit, Precision::Fp32);
    c.grad_clip = None;
    c.strategy.optimizer_in_backward = true;
    assert_dry_run_exact(&c, "paged, step in backward");
}

#[test]
fn a_paged_save_resumes_bitwise_and_matches_the_step_in_backward() {
    let dir = tempfile::tempdir().unwrap();
    let c = run(Optimizer::PagedAdamW8bit, Precision::Fp32);
    let (straight, _) = run_alone(&c);
    let mut half = c.clone();
    half.steps = 3;
    let (_, mut first) = run_alone(&half);
    let saved = first.save(dir.path()).unwrap();
    let mut resumed = Trainer::new(c.clone(), &Corpus::bundled()).unwrap();
    resumed.resume(&saved).unwrap();
    resumed.train(&mut |_| {}).unwrap();
    let (losses, weights) = outcome(&mut resumed);
    assert_eq!(losses[3..], straight.0[3..]);
    assert!(weights == straight.1);
    // In backward, without clipping: the ordinary paged step's bits.
    let mut ordinary = c.clone();
    ordinary.grad_clip = None;
    let mut fused = ordinary.clone();
    fused.strategy.optimizer_in_backward = true;
    assert!(run_alone(&ordinary).0 == run_alone(&fused).0);
}
