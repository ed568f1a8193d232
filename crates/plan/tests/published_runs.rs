//! The planner held to published runs on real GPUs (`tests/data/published/runs.toml`, each row
//! with its source): every run that worked must be predicted to fit, the memory within the
//! errors stated in docs/planner.md ("Held to reality"), the throughput of the rows the speed
//! model was not fitted to within the stated mean error; the rows it was fitted to reproduce
//! their throughput, and the fitted efficiencies are what `--calibrate` derives from them.
//!
//! `cargo test -p headroom-plan --test published_runs -- --nocapture` prints the table.

mod support;

use headroom_plan::calibrate::{Measurement, calibrate};
use headroom_plan::cost::{Plan, efficiency, evaluate};
use headroom_plan::strategy::{Category, Strategy};
use support::published::{Row, error, gib, mean, print_table, worst};

fn rows() -> Vec<Row> {
    support::published::rows("runs.toml")
}

#[test]
fn published_runs_fit_and_are_predicted_within_the_stated_errors() {
    let rows = rows();
    let mut sources: Vec<&str> = rows.iter().map(|r| r.run.source.as_str()).collect();
    sources.sort();
    sources.dedup();
    assert!(
        rows.len() >= 12 && sources.len() >= 4,
        "{} rows, {sources:?}",
        rows.len()
    );
    print_table(&rows);
    // Every published run worked, so every one must fit.
    for r in &rows {
        assert!(
            r.plan.fits,
            "{}: predicted {} GiB on a {} GiB GPU",
            r.run.id,
            gib(r.plan.memory.per_device_peak_bytes as f64),
            gib(r.problem.hardware.gpu.memory_bytes as f64)
        );
    }
    let mem: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.memory)
        .map(|m| error(m).abs())
        .collect();
    let speed: Vec<f64> = rows
        .iter()
        .filter(|r| !r.run.fitted)
        .filter_map(|r| r.speed)
        .map(|s| error(s).abs())
        .collect();
    println!(
        "\nmemory: {} rows, mean |error| {:.1} %, worst {:.1} %; throughput: {} rows not fitted, mean |error| {:.1} %, worst {:.1} %",
        mem.len(),
        100.0 * mean(&mem),
        100.0 * worst(&mem),
        speed.len(),
        100.0 * mean(&speed),
        100.0 * worst(&speed)
    );
    // The errors docs/planner.md states.
    assert!(
        mean(&mem) <= MEMORY_MEAN && worst(&mem) <= MEMORY_WORST,
        "{mem:?}"
    );
    assert!(
        mean(&speed) <= SPEED_MEAN && worst(&speed) <= SPEED_WORST,
        "{speed:?}"
    );
}

#[test]
fn zero_offload_fits_its_v100_by_moving_the_checkpoints_to_the_host() {
    // ZeRO-Offload's 10B GPT-2 on one 32 GB V100 runs with DeepSpeed's cpu_checkpointing
    // (DeepSpeedExamples' ds_zero-offload_10B_config.json). Each of the 50 checkpointed blocks
    // keeps its fp16 input, b·s·h·2 = 10·1024·4096·2 = 83,886,080 bytes: all 50 go to the host,
    // and the device keeps the one fetched back for the block being recomputed.
    let rows = rows();
    let row = rows
        .iter()
        .find(|r| r.run.id == "zero-offload-10b-1xv100")
        .unwrap();
    assert!(row.plan.fits);
    let input = 10.0 * 1024.0 * 4096.0 * 2.0;
    let kept_on_device = Strategy {
        placement: headroom_plan::strategy::Placement {
            offload_activations: headroom_plan::strategy::Offload::None,
            ..row.run.strategy.placement
        },
        ..row.run.strategy
    };
    let on_device = evaluate(&row.problem, &kept_on_device);
    let act = |p: &Plan| p.memory.breakdown.at_peak[Category::Activation] as f64;
    let scale = row.problem.cost.activation_scale;
    assert!((act(&on_device) - act(&row.plan) - 49.0 * input * scale).abs() <= 1.0);
    assert_eq!(
        on_device.memory.host_bytes_per_node as f64 + 50.0 * input * scale,
        row.plan.memory.host_bytes_per_node as f64
    );
    // Without it the run does not fit: the lever is what makes the tutorial's model possible.
    assert!(!on_device.fits);
    println!(
        "peak with offload {} GiB, without {} GiB, usable {} GiB",
        gib(row.plan.memory.per_device_peak_bytes as f64),
        gib(on_device.memory.per_device_peak_bytes as f64),
        gib(row.problem.usable_device_bytes() as f64)
    );
}

// The errors docs/planner.md states (the goals: memory 10 % mean and 20 % worst,
// throughput 25 % mean).
const MEMORY_MEAN: f64 = 0.06;
const MEMORY_WORST: f64 = 0.125;
const SPEED_MEAN: f64 = 0.105;
const SPEED_WORST: f64 = 0.51;

#[test]
fn fitted_efficiencies_are_what_calibration_derives_from_their_runs() {
    for r in rows().into_iter().filter(|r| r.run.fitted) {
        let (measured, _) = r.speed.unwrap();
        let world = r.problem.hardware.world_size() as f64;
        let m = Measurement {
            strategy: r.run.strategy,
            seq_len: None,
            tokens_per_s: measured * world,
            peak_allocated_bytes: None,
            source: Some(r.run.id.clone()),
        };
        let (_, c) = calibrate(&r.problem, &m).unwrap();
        let (table, _) =
            efficiency::fitted(&r.problem.hardware.gpu.name, r.run.strategy.precision).unwrap();
        println!(
            "{}: calibrated {:.4}, table {table:.4}",
            r.run.id, c.efficiency_after
        );
        assert!(
            (c.efficiency_after - table).abs() < 5e-4,
            "{}: calibration gives {:.4}, the table {table:.4}",
            r.run.id,
            c.efficiency_after
        );
        // And the fitted row's throughput is then reproduced.
        assert!(error(r.speed.unwrap()).abs() < 2e-3, "{}", r.run.id);
    }
}
