//! `--loss chunked:K` in the engine: it trains as the plain loss does (the first loss bitwise,
//! the rest within the rounding of the weight gradient's order of summation), its activation
//! peak drops by the bytes derived by hand from the op rules, and the dry run predicts it
//! exactly.

use crate::common;

use common::{assert_dry_run_exact, config, run_alone};
use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::strategy::{Loss, Optimizer, Precision};

fn with(loss: Loss, precision: Precision, steps: u64) -> RunConfig {
    let mut c = config(Optimizer::AdamW, 4, 1, 1);
    c.strategy.loss = loss;
    c.strategy.precision = precision;
    c.steps = steps;
    c
}

fn peak(t: &Trainer, c: Category) -> i64 {
    t.report().memory.peak_bytes_by_category[c] as i64
}

#[test]
fn it_trains_as_the_plain_loss_does() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let ((plain, wp), _) = run_alone(&with(Loss::Plain, precision, 20));
        let ((chunked, wc), _) = run_alone(&with(Loss::Chunked(4), precision, 20));
        // Same weights at step 1, and the loss is bitwise the plain one (chunks of 32 rows).
        assert_eq!(chunked[0], plain[0], "{precision}: first loss");
        // Later steps start from weights that differ in the last bits (the weight gradient of
        // the tied output projection is summed chunk by chunk).
        for (i, (a, b)) in chunked.iter().zip(&plain).enumerate() {
            let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
            assert!(
                ((a - b) / b).abs() < 1e-3,
                "{precision}: step {i}: {a} vs {b}"
            );
        }
        let apart: Vec<f32> = wc
            .iter()
            .zip(&wp)
            .map(|(a, b)| (f32::from_bits(*a) - f32::from_bits(*b)).abs())
            .collect();
        let mean = apart.iter().sum::<f32>() / apart.len() as f32;
        let max = apart.iter().copied().fold(0f32, f32::max);
        if precision == Precision::Fp32 {
            assert!(max < 1e-4, "{precision}: weights apart by up to {max}");
        } else {
            // A bf16 gradient near zero that rounds the other way flips the sign of AdamW's
            // normalised update (about lr = 3e-3 a step) for that weight: single weights part
            // by a few steps of lr, the mean stays at rounding level.
            assert!(
                mean < 1e-4,
                "{precision}: weights apart by {mean} on average"
            );
        }
    }
}

#[test]
fn the_activation_peak_drops_by_the_logits() {
    // gpt-tiny at micro-batch 4 × 32 tokens: N = 128 rows, V = 256. The peak of `activation`
    // is reached in the loss, above everything the blocks keep. Plain, it holds the f32 logits
    // and their log-softmax (2 · N·V·4 bytes), the picked log-probabilities (N·4, one 512-byte
    // block), their mean and the loss (512 each). Chunked in K, the last chunk's logits and
    // log-softmax (2 · (N/K)·V·4) beside the K chunks' picked log-probabilities (512 each).
    let (_, plain) = run_alone(&with(Loss::Plain, Precision::Fp32, 1));
    // K stops at 4: at K = 8 the loss's working set (2 · 16·256·4 bytes) is smaller than the
    // GELU output the last block's MLP holds for a moment (N·F·4 = 128·128·4, recomputed in
    // backward, not kept), so the peak of `activation` is reached there instead.
    let plain_loss = 2 * 128 * 256 * 4 + 512 + 2 * 512;
    for k in [2i64, 4] {
        let (_, t) = run_alone(&with(Loss::Chunked(k as u64), Precision::Fp32, 1));
        let chunked_loss = 2 * (128 / k) * 256 * 4 + k * 512;
        assert_eq!(
            peak(&plain, Category::Activation) - peak(&t, Category::Activation),
            plain_loss - chunked_loss,
            "chunked:{k}"
        );
        // The logits' gradients go too: backward works on one chunk's at a time.
        assert!(peak(&t, Category::Temporary) < peak(&plain, Category::Temporary));
        for c in [
            Category::Parameter,
            Category::Gradient,
            Category::OptimizerState,
        ] {
            assert_eq!(peak(&t, c), peak(&plain, c), "chunked:{k}: {c}");
        }
    }
}

#[test]
fn the_dry_run_predicts_it_exactly() {
    for precision in [Precision::Fp32, Precision::Bf16Mixed] {
        let c = with(Loss::Chunked(8), precision, 2);
        assert_dry_run_exact(&c, &precision.to_string());
    }
}
