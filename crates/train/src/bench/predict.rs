//! Predicted against measured memory over the 32-configuration matrix of headroom runs: each
//! configuration trained for three steps, dry-run, and costed by the planner's analytical model,
//! with the worst and mean absolute relative error of both predictions for the allocated peak,
//! the activations' own peak and the reserved peak (the analytical model's with its
//! fragmentation reserve).
//!
//! Not for: asserting anything (the prediction test bounds the dry run's error).

use super::BenchError;
use crate::data::Corpus;
use crate::predict::error::{PredictionError, evaluate, matrix, relative_error};
use headroom_memory::{Category, MemoryPeaks};
use serde::Serialize;

/// Worst and mean absolute relative error of one prediction of one figure.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorSummary {
    pub figure: &'static str,
    pub predictor: &'static str,
    pub max_abs: f64,
    pub mean_abs: f64,
    pub configurations: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct PredictBench {
    pub rows: Vec<PredictionError>,
    pub summary: Vec<ErrorSummary>,
}

/// One figure of a run's memory.
pub type Figure = fn(&MemoryPeaks) -> u64;

/// The figures compared, by name.
pub const FIGURES: [(&str, Figure); 3] = [
    ("allocated peak", |p| p.peak_allocated_bytes),
    ("activation peak", |p| {
        p.peak_bytes_by_category[Category::Activation]
    }),
    ("reserved peak", |p| p.peak_reserved_bytes),
];

/// Runs the matrix on the bundled corpus; `on_configuration(i, total)` is called before the
/// i-th (from 1) of `total` configurations.
pub fn measure(on_configuration: &mut dyn FnMut(usize, usize)) -> Result<PredictBench, BenchError> {
    let corpus = Corpus::bundled();
    let configs = matrix();
    let total = configs.len();
    let mut rows = Vec::new();
    for (i, c) in configs.into_iter().enumerate() {
        on_configuration(i + 1, total);
        rows.push(evaluate(c, &corpus)?);
    }
    let summary = summarize(&rows);
    Ok(PredictBench { rows, summary })
}

/// Each figure's error summary for the dry run and the analytical model.
fn summarize(rows: &[PredictionError]) -> Vec<ErrorSummary> {
    let mut summary = Vec::new();
    for (figure, get) in FIGURES {
        for predictor in ["dry run", "analytical"] {
            let errors: Vec<f64> = rows
                .iter()
                .map(|r| {
                    let p = if predictor == "dry run" {
                        &r.dry_run
                    } else {
                        &r.analytical
                    };
                    relative_error(get(p), get(&r.measured)).abs()
                })
                .collect();
            if errors.is_empty() {
                continue;
            }
            summary.push(ErrorSummary {
                figure,
                predictor,
                max_abs: errors.iter().cloned().fold(0.0, f64::max),
                mean_abs: errors.iter().sum::<f64>() / errors.len() as f64,
                configurations: errors.len(),
            });
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peaks(allocated: u64, activations: u64, reserved: u64) -> MemoryPeaks {
        let mut p = MemoryPeaks {
            peak_allocated_bytes: allocated,
            peak_reserved_bytes: reserved,
            ..Default::default()
        };
        p.peak_bytes_by_category[Category::Activation] = activations;
        p
    }

    #[test]
    fn summaries_hold_the_worst_and_mean_absolute_error_per_figure_and_predictor() {
        let row = |dry_run, analytical| PredictionError {
            label: String::new(),
            measured: peaks(100, 50, 200),
            dry_run,
            analytical,
        };
        let rows = [
            // Dry run: +10 %, −20 %, 0 %; analytical: −5 %, +40 %, +10 %.
            row(peaks(110, 40, 200), peaks(95, 70, 220)),
            // Dry run: −30 %, +10 %, +5 %; analytical: +15 %, −10 %, −50 %.
            row(peaks(70, 55, 210), peaks(115, 45, 100)),
        ];
        let s = summarize(&rows);
        let want = [
            ("allocated peak", "dry run", 0.30, 0.20),
            ("allocated peak", "analytical", 0.15, 0.10),
            ("activation peak", "dry run", 0.20, 0.15),
            ("activation peak", "analytical", 0.40, 0.25),
            ("reserved peak", "dry run", 0.05, 0.025),
            ("reserved peak", "analytical", 0.50, 0.30),
        ];
        assert_eq!(s.len(), want.len());
        for (got, (figure, predictor, max, mean)) in s.iter().zip(want) {
            assert_eq!((got.figure, got.predictor), (figure, predictor));
            assert!(
                (got.max_abs - max).abs() < 1e-12,
                "{figure} {predictor} max"
            );
            assert!(
                (got.mean_abs - mean).abs() < 1e-12,
                "{figure} {predictor} mean"
            );
            assert_eq!(got.configurations, 2);
        }
        assert!(summarize(&[]).is_empty(), "no configurations, no summary");
    }
}
