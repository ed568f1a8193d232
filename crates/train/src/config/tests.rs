//! Reading, merging and resolving run configurations.

use super::*;
use headroom_strategy::{Precision, ZeroStage};

fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

#[test]
fn flags_override_the_file_and_defaults_fill_the_rest() {
    let (_d, path) =
        file("precision = \"bf16-mixed\"\nmicro_batch = 4\ndevice_memory = \"256MiB\"\n");
    let from_file = TrainConfig::from_file(&path).unwrap();
    let flags = TrainConfig {
        micro_batch: Some(8),
        ..Default::default()
    };
    let run = from_file.overridden_by(flags).resolve().unwrap();
    assert_eq!(run.strategy.precision, Precision::Bf16Mixed);
    assert_eq!(run.micro_batch(), 8);
    assert_eq!(run.device_memory, 256 << 20);
    assert_eq!(run.accumulation(), 1);
    assert_eq!(run.model, DEFAULT_MODEL);
    assert_eq!(run.effective_batch(), 8);
}

#[test]
fn the_planners_export_is_accepted() {
    let text = "precision = \"fp32\"\nmicro_batch = 2\naccumulation = 4\ncheckpoint = \"none\"\nattention = \"naive\"\noptimizer = \"adamw\"\nzero_stage = 0\noffload_optimizer = \"none\"\noffload_params = \"none\"\ndevice_memory = 85899345920\n";
    let (_d, path) = file(text);
    let run = TrainConfig::from_file(&path).unwrap().resolve().unwrap();
    assert_eq!(run.effective_batch(), 8);
    assert_eq!(run.device_memory, 80 << 30);
}

#[test]
fn malformed_files_name_the_key_and_line() {
    let (_d, path) = file("steps = 10\nmicro_bach = 4\n");
    let e = TrainConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("micro_bach"), "{e}");
    let (_d, path) = file("steps = \"ten\"\n");
    let e = TrainConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("steps"), "{e}");
    let (_d, path) = file("device_memory = \"lots\"\n");
    let e = TrainConfig::from_file(&path).unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("GiB = 2^30"), "{e}");
}

#[test]
fn bad_names_in_files_name_the_flag_the_line_and_the_accepted_values() {
    for (text, needle) in [
        ("precision = \"fp8\"\n", "bf16-mixed"),
        ("optimizer = \"adagrad\"\n", "sgd-momentum"),
        ("steps = 3\ncheckpoint = \"every:0\"\n", "every:K"),
    ] {
        let (_d, path) = file(text);
        let e = TrainConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains(needle) && e.contains("line"), "{e}");
    }
}

#[test]
fn the_old_save_keys_still_read() {
    let (_d, path) = file("checkpoint_dir = \"runs\"\ncheckpoint_every = 5\n");
    let run = TrainConfig::from_file(&path).unwrap().resolve().unwrap();
    assert_eq!(run.save_dir, Some(PathBuf::from("runs")));
    assert_eq!(run.save_every, 5);
}

#[test]
fn bad_values_name_the_key_and_the_accepted_values() {
    let cases = [
        (
            TrainConfig {
                micro_batch: Some(0),
                ..Default::default()
            },
            "micro_batch",
        ),
        (
            TrainConfig {
                micro_batch: Some(1 << 40),
                accumulation: Some(1 << 30),
                ..Default::default()
            },
            "1,048,576 sequences",
        ),
        (
            TrainConfig {
                collective_timeout: Some(0.0),
                ..Default::default()
            },
            "collective_timeout",
        ),
    ];
    for (config, needle) in cases {
        let e = config.resolve().unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
    // LAMB runs sharded: the sums of the weights a shard cuts are completed over ranks.
    let lamb = TrainConfig {
        zero_stage: Some(ZeroStage::new(2).unwrap()),
        data_parallel: Some(2),
        optimizer: Some(headroom_strategy::Optimizer::Lamb),
        ..Default::default()
    };
    assert!(lamb.resolve().is_ok());
}

#[test]
fn a_resolved_configuration_is_its_own_keys() {
    let run = TrainConfig {
        precision: Some(Precision::Bf16Mixed),
        micro_batch: Some(4),
        accumulation: Some(3),
        grad_clip: Some(0.0),
        steps: Some(7),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(run.grad_clip, None);
    assert_eq!(run.as_keys().resolve().unwrap(), run);
    assert_eq!(
        TrainConfig::default()
            .resolve()
            .unwrap()
            .as_keys()
            .resolve()
            .unwrap(),
        TrainConfig::default().resolve().unwrap()
    );
}

#[test]
fn data_loader_keys_read_from_toml_and_resume_may_change_them() {
    let (_d, path) = file(
        "workers = 2\nprefetch = 4\nhost_memory = \"64MiB\"\npin_memory = false\nsampler = \"sequential\"\n",
    );
    let run = TrainConfig::from_file(&path).unwrap().resolve().unwrap();
    assert_eq!((run.workers, run.prefetch), (2, 4));
    assert_eq!(run.host_memory, Some(64 << 20));
    assert!(!run.pin_memory);
    assert_eq!(run.sampler, crate::data::SamplerKind::Sequential);
    // Defaults: no workers, a queue of 2, page-locked, shuffled.
    let d = TrainConfig::default().resolve().unwrap();
    assert_eq!((d.workers, d.prefetch, d.pin_memory), (0, 2, true));
    assert_eq!(d.sampler, crate::data::SamplerKind::Shuffled);
    // The loader's keys leave the batches as they are: a resume may change them, not the
    // sampler, which changes the order of the data.
    let more = TrainConfig {
        workers: Some(4),
        ..Default::default()
    };
    let (resumed, changes) = run.resumed_with(&more).unwrap();
    assert_eq!(resumed.workers, 4);
    assert_eq!(changes, ["workers: 2 → 4"]);
    let reorder = TrainConfig {
        sampler: Some(crate::data::SamplerKind::Shuffled),
        ..Default::default()
    };
    let e = run.resumed_with(&reorder).unwrap_err().to_string();
    assert!(e.contains("sampler"), "{e}");
    let zero = TrainConfig {
        prefetch: Some(0),
        ..Default::default()
    };
    assert!(zero.resolve().unwrap_err().to_string().contains("prefetch"));
}

#[test]
fn the_collective_timeout_is_a_positive_number_of_seconds_up_to_a_week() {
    // 1e300 s is finite but no Duration holds it (the largest is about 1.8e19 s).
    for bad in [
        1e300,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -1.0,
        0.0,
        -0.0,
        604_800.5,
    ] {
        let e = TrainConfig {
            collective_timeout: Some(bad),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("collective_timeout") && e.contains("604800"),
            "{bad}: {e}"
        );
    }
    for good in [0.001, 600.0, 604_800.0] {
        let run = TrainConfig {
            collective_timeout: Some(good),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(run.collective_timeout_s, good);
        // Every accepted value is a duration.
        assert!(std::time::Duration::try_from_secs_f64(good).is_ok());
    }
}

#[test]
fn the_loader_queues_at_most_64_batches_ahead() {
    for bad in [65, 100_000, usize::MAX] {
        let e = TrainConfig {
            prefetch: Some(bad),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("prefetch") && e.contains("64 or less"),
            "{bad}: {e}"
        );
    }
    let run = TrainConfig {
        prefetch: Some(64),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(run.prefetch, 64);
}
