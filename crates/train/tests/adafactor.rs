//! Adafactor in the engine: it trains no worse than 2 % behind AdamW, its factored state bytes
//! are derived by hand from the weights' shapes, the dry run counts them exactly, a save resumes
//! bitwise, the step in backward gives the same bits, and ZeRO's shards (which cut weights) are
//! refused.

use crate::common;

use common::{assert_dry_run_exact, config, outcome, run_alone};
use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::data::Corpus;
use headroom_train::strategy::{Optimizer, ZeroStage};

fn adafactor(steps: u64) -> RunConfig {
    let mut c = config(Optimizer::Adafactor, 4, 1, 1);
    c.steps = steps;
    c
}

fn rounded(bytes: usize) -> usize {
    bytes.div_ceil(512) * 512
}

#[test]
fn it_trains_as_well_as_adamw_with_factored_state() {
    // 200 steps, as the bound on the default model (docs/benchmarks.md) is stated.
    let mut adamw = config(Optimizer::AdamW, 4, 1, 1);
    adamw.steps = 200;
    let (_, a) = run_alone(&adamw);
    let (_, b) = run_alone(&adafactor(200));
    let last = |t: &Trainer| t.report().losses.iter().rev().take(10).sum::<f64>() / 10.0;
    let (la, lb) = (last(&a), last(&b));
    // No worse than 2 % (here it ends lower than AdamW's).
    assert!(lb < la * 1.02, "Adafactor {lb} against AdamW {la}");
    assert!(lb < b.report().losses[0] * 0.8, "it learns: {lb}");
    // State by hand: per block one f32 buffer holding, for each weight, its row and column
    // means if it is a matrix (rows + cols values) or every value if it is a vector.
    let want: usize = b
        .model()
        .blocks()
        .iter()
        .map(|block| {
            let values: usize = block
                .specs()
                .iter()
                .map(|p| match p.shape.as_slice() {
                    [rows, cols] => rows + cols,
                    [n] => *n,
                    other => panic!("gpt-tiny has no weight of shape {other:?}"),
                })
                .sum();
            rounded(4 * values)
        })
        .sum();
    let state = b.report().memory.peak_bytes_by_category[Category::OptimizerState] as usize;
    assert_eq!(state, want);
    // AdamW's two f32 moments per parameter.
    let full: usize = b
        .model()
        .blocks()
        .iter()
        .map(|b| 2 * rounded(4 * b.numel()))
        .sum();
    assert!(state * 4 < full, "{state} against AdamW's {full}");
}

#[test]
fn the_dry_run_predicts_it_exactly() {
    assert_dry_run_exact(&adafactor(3), "adafactor");
}

#[test]
fn a_save_resumes_bitwise_and_the_step_in_backward_gives_the_same_bits() {
    let dir = tempfile::tempdir().unwrap();
    let mut whole = adafactor(12);
    whole.grad_clip = None;
    let (bits, _) = run_alone(&whole);
    let (_, mut t) = run_alone(&RunConfig {
        steps: 6,
        ..whole.clone()
    });
    let save = t.save(dir.path()).unwrap();
    let mut t = Trainer::new(whole.clone(), &Corpus::bundled()).unwrap();
    t.resume(&save).unwrap();
    t.train(&mut |_| {}).unwrap();
    assert_eq!(outcome(&mut t), bits);
    let mut fused = whole.clone();
    fused.strategy.optimizer_in_backward = true;
    assert_eq!(run_alone(&fused).0, bits);
}

#[test]
fn zero_shards_in_a_group_are_refused() {
    let mut c = config(Optimizer::Adafactor, 4, 1, 2);
    c.strategy.placement.zero_stage = ZeroStage::new(1).unwrap();
    let e = Trainer::new(c, &Corpus::bundled()).unwrap_err().to_string();
    assert!(e.contains("adafactor") && e.contains("--zero 0"), "{e}");
}
