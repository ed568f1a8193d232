//! The planner held to published runs on real GPUs (`tests/data/published/runs.toml`, each row
//! with its source): every run that worked must be predicted to fit, the memory within the
//! errors stated in docs/planner.md ("Held to reality"), the throughput of the rows the speed
//! model was not fitted to within the stated mean error; the rows it was fitted to reproduce
//! their throughput, the fitted efficiencies are what `--calibrate` derives from them, and the
//! matmul shape's constant is what nanoGPT's row gives (`fitted_constant`).
//!
//! `cargo test -p headroom-plan --test integration published_runs:: -- --nocapture` prints the table.

use crate::support;

use headroom_plan::calibrate::{Measurement, calibrate};
use headroom_plan::cost::{CostModel, Plan, Problem, efficiency, evaluate};
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
        .filter(|r| r.held())
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

#[test]
fn zero_offload_overlaps_its_copies_and_runs_within_a_quarter_of_40_tflops() {
    // The tutorial's 40 TFLOP/s over Megatron's 85.121 GFLOP per token with full recompute is
    // 469.9 tokens/s. ZeRO-Offload's schedule hides the gradients' trip to the host behind
    // backward and the parameters' trip back inside the CPU Adam step: the step charges
    // max(CPU step, parameters up) = max(10.28e9 / 3.9e9, 2 · 10.28e9 / 12e9) = 2.64 s of
    // host time, not the 2.64 + 3.43 s of the copies and the step one after the other.
    let rows = rows();
    let row = rows
        .iter()
        .find(|r| r.run.id == "zero-offload-10b-1xv100")
        .unwrap();
    let p = row.problem.facts.params as f64;
    let hw = &row.problem.hardware;
    let host_step = p / hw.cpu_optimizer_params_per_s;
    let activations = 2.0 * 50.0 * 10.0 * 1024.0 * 4096.0 * 2.0 * row.problem.cost.activation_scale
        / (hw.pcie_bandwidth_gbps * 1e9);
    assert!(2.0 * p / (hw.pcie_bandwidth_gbps * 1e9) < host_step);
    assert!(2.0 * p / (hw.pcie_bandwidth_gbps * 1e9) < row.plan.time.compute_s * 2.0 / 3.0);
    assert!((row.plan.time.offload_s - (host_step + activations)).abs() < 1e-6);
    let (measured, predicted) = row.speed.unwrap();
    assert!(
        (predicted / measured - 1.0).abs() <= 0.25,
        "{predicted} against {measured}"
    );
}

// The errors docs/planner.md states (the goals: memory 10 % mean and 20 % worst,
// throughput 25 % mean). Memory 4.7 % and 12.4 % (torchtune's packed Llama 3.2 3B): 7.4 % and
// 12.7 % while the four BERT-large rows of one micro-batch a step were planned with PyTorch
// 2.0's `zero_grad(set_to_none=True)`, which their PyTorch before 2.0 did not run (its
// `zero_grad()` zero-filled every gradient in place: `zero_grad = "zero-fill"`, −13…−9 % to
// −3…+1 %); 5.6 % and 12.4 % while the blocks' backward held every gradient beside every
// activation (`cost/backward.rs`).
const MEMORY_MEAN: f64 = 0.048;
const MEMORY_WORST: f64 = 0.125;
const SPEED_MEAN: f64 = 0.10;
const SPEED_WORST: f64 = 0.28;

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

/// The same problem under other cost-model constants.
fn with_cost(p: &Problem, set: impl Fn(&mut CostModel)) -> Problem {
    let mut q = p.clone();
    set(&mut q.cost);
    q
}

/// The value of the constant `set` changes at which `row` takes `step_s`, by bisection over
/// `(lo, hi)` (the step time rises with it).
fn solve(
    row: &Row,
    step_s: f64,
    (mut lo, mut hi): (f64, f64),
    set: impl Fn(&mut CostModel, f64),
) -> f64 {
    let at = |c: f64| {
        evaluate(&with_cost(&row.problem, |m| set(m, c)), &row.run.strategy)
            .time
            .step_s
    };
    assert!(
        at(lo) < step_s && step_s < at(hi),
        "{}: outside the bracket",
        row.run.id
    );
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        match at(mid) < step_s {
            true => lo = mid,
            false => hi = mid,
        }
    }
    0.5 * (lo + hi)
}

/// A row's measured step time.
fn measured_step_s(row: &Row) -> f64 {
    let world = row.problem.hardware.world_size() as f64;
    row.problem.workload.tokens_per_step() as f64 / (row.speed.unwrap().0 * world)
}

#[test]
fn the_shape_constant_is_what_its_run_gives() {
    // Two constants hang together: the A100's saturated efficiency (torchtitan's Llama 3 8B)
    // and the intensity at which the matmuls reach half of it (nanoGPT's GPT-2 on 8 A100,
    // compiled). Each is solved with the other held, until neither moves.
    let rows = rows();
    let find = |id: &str| rows.iter().find(|r| r.run.id == id).unwrap();
    let titan = find("torchtitan-llama3-8b-64xa100-op");
    let nano = find("nanogpt-gpt2-124m-8xa100");
    assert_eq!(
        nano.run.fitted_constant.as_deref(),
        Some("half_efficiency_intensity")
    );
    let (mut eff, mut kappa) = (0.6, 1.0);
    for _ in 0..30 {
        let m = Measurement {
            strategy: titan.run.strategy,
            seq_len: None,
            tokens_per_s: titan.speed.unwrap().0 * titan.problem.hardware.world_size() as f64,
            peak_allocated_bytes: None,
            source: None,
        };
        let held = with_cost(&titan.problem, |m| m.half_efficiency_intensity = kappa);
        eff = calibrate(&held, &m).unwrap().1.efficiency_after;
        kappa = solve(nano, measured_step_s(nano), (0.0, 100.0), |m, k| {
            m.efficiency = Some(eff);
            m.half_efficiency_intensity = k;
        });
    }
    let default = CostModel::default().half_efficiency_intensity;
    let (table, _) = efficiency::fitted("A100-40GB", titan.run.strategy.precision).unwrap();
    println!(
        "A100 efficiency {eff:.4} (table {table:.4}); kappa {kappa:.4} (default {default:.4})"
    );
    assert!((eff - table).abs() < 5e-4, "{eff} against {table}");
    assert!((kappa / default - 1.0).abs() < 2e-3, "{kappa}");
    // With the defaults the row reproduces its throughput.
    assert!(error(nano.speed.unwrap()).abs() < 5e-3, "{:?}", nano.speed);
}
