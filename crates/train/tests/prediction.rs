//! Predicted equals measured: over a matrix of configurations of the GPT and the residual MLP
//! (precision × micro-batch × accumulation × checkpoint policy × attention), the dry run's peak
//! equals the real run's within 1 %, and each category's peak within 1 % or 64 KiB.

use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::TrainConfig;
use headroom_train::data::Corpus;
use headroom_train::predict::error::{evaluate, matrix, relative_error};

#[test]
fn dry_run_peaks_equal_measured_peaks_across_the_matrix() {
    let configs = matrix();
    assert!(configs.len() >= 30, "{} configurations", configs.len());
    let corpus = Corpus::bundled();
    let mut checked = 0;
    for c in configs {
        let row = evaluate(c, &corpus).unwrap();
        let (label, p, m) = (&row.label, &row.dry_run, &row.measured);
        assert!(
            relative_error(p.peak_allocated_bytes, m.peak_allocated_bytes).abs() <= 0.01,
            "{label}: predicted peak {} vs measured {}",
            p.peak_allocated_bytes,
            m.peak_allocated_bytes
        );
        for cat in Category::ALL {
            let (p, m) = (p.peak_bytes_by_category[cat], m.peak_bytes_by_category[cat]);
            assert!(
                p.abs_diff(m) <= (m / 100).max(64 << 10),
                "{label}: {cat} predicted {p} vs measured {m}"
            );
        }
        // The analytical model's error is reported by `headroom bench predict`, not bounded.
        checked += 1;
    }
    assert!(checked >= 30);
}

#[test]
fn dry_runs_accumulating_two_micro_batches_predict_runs_accumulating_more() {
    // A dry-run step accumulates at most two micro-batches; the real runs accumulate five.
    let corpus = Corpus::bundled();
    for (model, precision) in [("gpt-tiny", "fp16-mixed"), ("resmlp", "fp32")] {
        let c = TrainConfig {
            model: Some(model.into()),
            precision: Some(precision.parse().unwrap()),
            micro_batch: Some(2),
            accumulation: Some(5),
            seq_len: Some(32),
            steps: Some(3),
            eval_every: Some(0),
            eval_batches: Some(1),
            device_memory: Some("256MiB".parse().unwrap()),
            ..Default::default()
        };
        let row = evaluate(c, &corpus).unwrap();
        let (p, m) = (&row.dry_run, &row.measured);
        assert_eq!(
            p.peak_allocated_bytes, m.peak_allocated_bytes,
            "{}",
            row.label
        );
        assert_eq!(
            p.peak_reserved_bytes, m.peak_reserved_bytes,
            "{}",
            row.label
        );
        assert_eq!(
            p.peak_bytes_by_category, m.peak_bytes_by_category,
            "{}",
            row.label
        );
    }
}

#[test]
fn the_largest_micro_batch_fits_and_one_more_does_not() {
    let corpus = Corpus::bundled();
    let run = TrainConfig {
        model: Some("gpt-tiny".into()),
        seq_len: Some(32),
        steps: Some(1),
        eval_every: Some(0),
        eval_batches: Some(1),
        device_memory: Some("3MiB".parse().unwrap()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let m = headroom_train::predict::largest_micro_batch(&run, &corpus, 4096)
        .unwrap()
        .unwrap();
    assert!(m >= 1);
    // Property, checked with independent real runs: m fits, m + 1 runs out of memory.
    let real = |micro: usize| {
        let mut c = run.with_split(micro, 1);
        c.oom_recovery = false;
        let mut t = Trainer::new(c, &corpus).unwrap();
        t.train(&mut |_| {}).map(|_| ())
    };
    assert!(real(m).is_ok(), "micro-batch {m} should fit");
    assert!(
        matches!(real(m + 1), Err(headroom_train::TrainError::OutOfMemory(_))),
        "micro-batch {} should not fit",
        m + 1
    );
}
