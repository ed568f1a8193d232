//! How well `--auto`'s speed model ranks strategies. For a model, every precision × checkpoint
//! (none, all) × attention × split (whole batch, quarter batch) is timed for real (median step
//! after a warm-up step) and predicted by the speed model (work counted by a dry run over rates
//! measured at start); the result holds both and their error, the mean and worst error, the
//! rank correlation, and where the predicted-fastest strategy ranks among the measured ones.
//!
//! Not for: memory (the `predict` experiment).

use super::{BenchError, median};
use crate::auto::{SpeedModel, calibration_shapes, evaluate};
use crate::config::{RunConfig, TrainConfig};
use crate::data::Corpus;
use crate::strategy::{Attention, Checkpoint, Precision, Strategy};
use crate::{Trainer, model_spec};
use serde::Serialize;

/// What to measure.
#[derive(Debug, Clone)]
pub struct SpeedOptions {
    /// Model preset or model TOML.
    pub model: String,
    /// Sequences per optimizer step (the whole batch; the quarter-batch split accumulates 4).
    pub batch: usize,
    /// Timed steps per strategy, after one warm-up step.
    pub steps: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpeedRow {
    pub strategy: String,
    pub predicted_tokens_per_s: f64,
    pub measured_tokens_per_s: f64,
    pub error: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpeedBench {
    pub model: String,
    pub speed: SpeedModel,
    pub rows: Vec<SpeedRow>,
    pub mean_abs_error: f64,
    pub max_abs_error: f64,
    /// Spearman's rank correlation of predicted and measured throughput.
    pub rank_correlation: f64,
    /// Measured rank (1 = fastest) of the strategy predicted fastest.
    pub predicted_best_measured_rank: usize,
}

/// Runs the experiment on the bundled corpus; `on_strategy(i, total)` is called before the i-th
/// (from 1) of `total` strategies is predicted and measured.
pub fn measure(
    options: &SpeedOptions,
    on_strategy: &mut dyn FnMut(usize, usize),
) -> Result<SpeedBench, BenchError> {
    let batch = options.batch;
    if batch < 4 || !batch.is_multiple_of(4) {
        return Err(BenchError::BatchNotSplit(batch));
    }
    let corpus = Corpus::bundled();
    let base = TrainConfig {
        model: Some(options.model.clone()),
        micro_batch: Some(batch),
        steps: Some(options.steps + 1),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some(headroom_memory::ByteSize(64 << 30)),
        ..Default::default()
    }
    .resolve()?;
    let spec = model_spec(&base)?;
    let seq_len = base.seq_len_of(&spec);
    let speed = SpeedModel::measure(calibration_shapes(&spec, seq_len, batch))?;
    let attentions: &[Attention] = match spec.attention_heads() {
        Some(_) => &[Attention::Naive, Attention::MemoryEfficient],
        None => &[Attention::Naive],
    };
    let mut candidates = Vec::new();
    for precision in Precision::ALL {
        for checkpoint in [Checkpoint::None, Checkpoint::ALL_BLOCKS] {
            for &attention in attentions {
                for (micro_batch, accumulation) in [(batch, 1), (batch / 4, 4)] {
                    candidates.push(Strategy {
                        precision: *precision,
                        checkpoint,
                        attention,
                        micro_batch: micro_batch as u64,
                        accumulation,
                        ..base.strategy
                    });
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        on_strategy(i + 1, candidates.len());
        let predicted = evaluate(&base, &corpus, c, &speed)?.0.time.tokens_per_s;
        let measured = measure_tokens_per_s(&base.with_strategy(*c), &corpus, seq_len)?;
        rows.push(SpeedRow {
            strategy: c.describe(spec.attention_heads().is_some()),
            predicted_tokens_per_s: predicted,
            measured_tokens_per_s: measured,
            error: (predicted - measured) / measured,
        });
    }
    let errors: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    let predicted: Vec<f64> = rows.iter().map(|r| r.predicted_tokens_per_s).collect();
    let measured: Vec<f64> = rows.iter().map(|r| r.measured_tokens_per_s).collect();
    let best = argmax(&predicted);
    let measured_ranks = ranks(&measured);
    Ok(SpeedBench {
        model: options.model.clone(),
        speed,
        mean_abs_error: errors.iter().sum::<f64>() / errors.len() as f64,
        max_abs_error: errors.iter().cloned().fold(0.0, f64::max),
        rank_correlation: spearman(&predicted, &measured),
        predicted_best_measured_rank: measured_ranks[best],
        rows,
    })
}

/// Median tokens/s of the run's steps after the first.
fn measure_tokens_per_s(
    config: &RunConfig,
    corpus: &Corpus,
    seq_len: usize,
) -> Result<f64, BenchError> {
    let mut t = Trainer::new(config.clone(), corpus)?;
    let report = t.train(&mut |_| {})?;
    let mut times: Vec<f64> = report.step_times_s.iter().skip(1).copied().collect();
    Ok((config.effective_batch() * seq_len) as f64 / median(&mut times))
}

fn argmax(v: &[f64]) -> usize {
    (0..v.len())
        .max_by(|&a, &b| v[a].total_cmp(&v[b]))
        .unwrap_or(0)
}

/// Rank of each value, 1 for the largest.
fn ranks(v: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..v.len()).collect();
    order.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    let mut r = vec![0; v.len()];
    for (rank, i) in order.into_iter().enumerate() {
        r[i] = rank + 1;
    }
    r
}

/// Spearman's ρ = 1 − 6·Σd² / (n·(n² − 1)) (no ties in measured times).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let d2: f64 = ra
        .iter()
        .zip(&rb)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_hand_ranked_lists() {
        assert_eq!(ranks(&[3.0, 1.0, 2.0]), vec![1, 3, 2]);
        assert!((spearman(&[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[30.0, 20.0, 10.0]) + 1.0).abs() < 1e-12);
        // One swap among 3: d² = 1 + 1, ρ = 1 − 12/24 = 0.5.
        assert!((spearman(&[1.0, 2.0, 3.0], &[2.0, 1.0, 3.0]) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn argmax_is_the_index_of_the_largest() {
        assert_eq!(argmax(&[2.0, 9.0, 4.0]), 1);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn a_batch_that_does_not_split_in_four_is_refused_before_measuring() {
        for batch in [0, 2, 6, 17] {
            let options = SpeedOptions {
                model: "gpt-tiny".into(),
                batch,
                steps: 1,
            };
            let mut started = false;
            let r = measure(&options, &mut |_, _| started = true);
            assert!(matches!(r, Err(BenchError::BatchNotSplit(b)) if b == batch));
            assert!(!started);
        }
    }
}
