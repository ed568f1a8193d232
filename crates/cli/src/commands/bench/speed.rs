//! `headroom bench speed`: how well `--auto`'s speed model ranks strategies. For a model, every
//! precision × checkpoint (none, all) × attention × split (whole batch, quarter batch) is timed
//! for real (median step after a warm-up step) and predicted by the speed model (work counted
//! by a dry run over rates measured at start); the table gives both and their error, and the
//! summary the mean and worst error, the rank correlation, and where the predicted-fastest
//! strategy ranks among the measured ones.
//!
//! Not for: memory (see `headroom bench predict`).

use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_nn::models::ModelSpec;
use headroom_plan::strategy::{Attention, Checkpoint, Precision, Strategy};
use headroom_train::auto::{SpeedModel, calibration_shapes, evaluate};
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::{Trainer, model_spec};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct SpeedBenchArgs {
    /// Model preset or model TOML.
    #[arg(long, default_value = "gpt-small")]
    pub model: String,
    /// Sequences per optimizer step (the whole batch; the quarter-batch split accumulates 4).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Timed steps per strategy, after one warm-up step.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub steps: u64,
    /// One JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
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

pub fn run(args: SpeedBenchArgs) -> anyhow::Result<()> {
    if args.batch < 4 || !args.batch.is_multiple_of(4) {
        anyhow::bail!(
            "--batch {} must be a multiple of 4 (the quarter-batch split)",
            args.batch
        );
    }
    let corpus = Corpus::bundled();
    let base = TrainConfig {
        model: Some(args.model.clone()),
        micro_batch: Some(args.batch),
        steps: Some(args.steps + 1),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some(headroom_memory::ByteSize(64 << 30)),
        ..Default::default()
    }
    .resolve()?;
    let spec = model_spec(&base)?;
    let seq_len = base.seq_len_of(&spec);
    let speed = SpeedModel::measure(calibration_shapes(&spec, seq_len, args.batch))?;
    let attentions: &[Attention] = match spec {
        ModelSpec::Gpt(_) => &[Attention::Naive, Attention::MemoryEfficient],
        ModelSpec::Resmlp(_) => &[Attention::Naive],
    };
    let mut candidates = Vec::new();
    for precision in Precision::ALL {
        for checkpoint in [Checkpoint::None, Checkpoint::ALL_BLOCKS] {
            for &attention in attentions {
                for (micro_batch, accumulation) in [(args.batch, 1), (args.batch / 4, 4)] {
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
        if !args.json {
            eprint!("\rstrategy {}/{}", i + 1, candidates.len());
        }
        let predicted = evaluate(&base, &corpus, c, &speed)?.0.time.tokens_per_s;
        let measured = measure(&base.with_strategy(*c), &corpus, seq_len)?;
        rows.push(SpeedRow {
            strategy: c.describe(matches!(spec, ModelSpec::Gpt(_))),
            predicted_tokens_per_s: predicted,
            measured_tokens_per_s: measured,
            error: (predicted - measured) / measured,
        });
    }
    if !args.json {
        eprintln!();
    }
    let errors: Vec<f64> = rows.iter().map(|r| r.error.abs()).collect();
    let predicted: Vec<f64> = rows.iter().map(|r| r.predicted_tokens_per_s).collect();
    let measured: Vec<f64> = rows.iter().map(|r| r.measured_tokens_per_s).collect();
    let best = argmax(&predicted);
    let measured_ranks = ranks(&measured);
    let bench = SpeedBench {
        model: args.model,
        speed,
        mean_abs_error: errors.iter().sum::<f64>() / errors.len() as f64,
        max_abs_error: errors.iter().cloned().fold(0.0, f64::max),
        rank_correlation: spearman(&predicted, &measured),
        predicted_best_measured_rank: measured_ranks[best],
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print_table(&bench);
    }
    Ok(())
}

/// Median tokens/s of the run's steps after the first.
fn measure(config: &RunConfig, corpus: &Corpus, seq_len: usize) -> anyhow::Result<f64> {
    let mut t = Trainer::new(config.clone(), corpus)?;
    let report = t.train(&mut |_| {})?;
    let mut times: Vec<f64> = report.step_times_s.iter().skip(1).copied().collect();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok((config.effective_batch() * seq_len) as f64 / median)
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
fn spearman(a: &[f64], b: &[f64]) -> f64 {
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let d2: f64 = ra
        .iter()
        .zip(&rb)
        .map(|(x, y)| (*x as f64 - *y as f64).powi(2))
        .sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

fn print_table(b: &SpeedBench) {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "strategy",
        "predicted tokens/s",
        "measured tokens/s",
        "error",
    ]);
    for r in &b.rows {
        t.add_row([
            r.strategy.clone(),
            format!("{:.0}", r.predicted_tokens_per_s),
            format!("{:.0}", r.measured_tokens_per_s),
            format!("{:+.1} %", 100.0 * r.error),
        ]);
    }
    println!("{}: the speed model against measured steps", b.model);
    println!("{t}");
    println!(
        "Mean |error| {:.1} %, worst {:.1} %; Spearman rank correlation {:.2}; the predicted fastest ranks {} of {} measured.",
        100.0 * b.mean_abs_error,
        100.0 * b.max_abs_error,
        b.rank_correlation,
        b.predicted_best_measured_rank,
        b.rows.len()
    );
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
}
