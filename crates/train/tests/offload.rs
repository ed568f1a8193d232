//! Offload in the engine: optimizer states (with their fp32 master weights) and ZeRO-3
//! parameters on the host or disk tier train bitwise as on the device, the device bytes drop by
//! what the tests derive by hand, the dry run predicts every tier, saves resume bitwise, a model
//! too large for the device trains with offload, and disk errors are named.

use crate::common;

use common::{config, outcome, run_ranks, zero};
use headroom_memory::{AllocatorConfig, Category, Device};
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::data::Corpus;
use headroom_train::strategy::{Offload, Optimizer, Precision};
use std::path::Path;

const PAGE: u64 = 4096;

fn pages(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(PAGE) * PAGE
}

/// `c` with its optimizer states on `optimizer` and its parameters on `params`, files under
/// `dir`.
fn offloaded(
    c: &RunConfig,
    optimizer: Offload,
    params: Offload,
    dir: &std::path::Path,
) -> RunConfig {
    let mut c = c.clone();
    c.strategy.placement.offload_optimizer = optimizer;
    c.strategy.placement.offload_params = params;
    c.offload_dir = Some(dir.to_path_buf());
    c
}

/// One process, no group: losses and weights as bits, and the trainer.
fn run_alone(c: &RunConfig) -> ((Vec<u64>, Vec<u32>), Trainer) {
    let mut t = Trainer::new(c.clone(), &Corpus::bundled()).unwrap();
    t.train(&mut |_| {}).unwrap();
    (outcome(&mut t), t)
}

fn mixed(ranks: usize, stage: u8) -> RunConfig {
    let mut c = zero(config(Optimizer::AdamW, 2, 1, ranks), stage);
    c.strategy.precision = Precision::Bf16Mixed;
    c
}

#[test]
fn offloaded_states_train_bitwise_as_on_the_device_alone_and_in_a_group() {
    let dir = tempfile::tempdir().unwrap();
    for tier in [Offload::Cpu, Offload::Nvme] {
        // Alone: ZeRO-1's placement with offload against the plain run; ZeRO-3's parameter
        // offload runs stage 3 in a group of one.
        let plain = run_alone(&mixed(1, 1)).0;
        let states = run_alone(&offloaded(&mixed(1, 1), tier, Offload::None, dir.path())).0;
        assert_eq!(states, plain, "optimizer on {tier}, alone");
        let params = run_alone(&offloaded(&mixed(1, 3), tier, tier, dir.path())).0;
        assert_eq!(params, plain, "optimizer and parameters on {tier}, alone");
        // Two ranks: each stage against itself on the device.
        for stage in [1, 2, 3] {
            let device = run_ranks(&mixed(2, stage), 2);
            let off = run_ranks(
                &offloaded(&mixed(2, stage), tier, Offload::None, dir.path()),
                2,
            );
            for (d, o) in device.iter().zip(&off) {
                assert_eq!(o.bits, d.bits, "ZeRO-{stage}, optimizer on {tier}");
            }
        }
        let device = run_ranks(&mixed(2, 3), 2);
        let off = run_ranks(&offloaded(&mixed(2, 3), tier, tier, dir.path()), 2);
        for (d, o) in device.iter().zip(&off) {
            assert_eq!(o.bits, d.bits, "ZeRO-3, everything on {tier}");
        }
    }
    // Every scratch file is gone with its run.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn sgd_momentum_and_lamb_offload_bitwise_too() {
    let dir = tempfile::tempdir().unwrap();
    for optimizer in [Optimizer::SgdMomentum, Optimizer::Lamb] {
        let c = zero(config(optimizer, 2, 1, 2), 2);
        let device = run_ranks(&c, 2);
        let off = run_ranks(&offloaded(&c, Offload::Nvme, Offload::None, dir.path()), 2);
        assert_eq!(off[0].bits, device[0].bits, "{optimizer}");
    }
}

#[test]
fn device_bytes_move_to_the_host_and_disk_tiers_as_derived_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let c = mixed(1, 1);
    let (_, t) = run_alone(&c);
    let blocks: Vec<usize> = t.model().blocks().iter().map(|b| b.numel()).collect();
    let on_device = t.report().memory.peak_bytes_by_category;
    // AdamW: the master (f32) and two f32 states per parameter, each part in whole pages.
    let master: u64 = blocks.iter().map(|&p| pages(4 * p)).sum();
    let largest = *blocks.iter().max().unwrap();
    // Two host f32 gradient buffers for the largest block.
    let gradient_buffers = 2 * pages(4 * largest);
    for tier in [Offload::Cpu, Offload::Nvme] {
        let (_, t) = run_alone(&offloaded(&c, tier, Offload::None, dir.path()));
        let r = t.report();
        let device = r.memory.peak_bytes_by_category;
        assert_eq!(device[Category::MasterWeight], 0, "{tier}");
        assert_eq!(device[Category::OptimizerState], 0, "{tier}");
        assert!(on_device[Category::OptimizerState] > 0 && on_device[Category::MasterWeight] > 0);
        // The rest of the device is untouched.
        for cat in [
            Category::Parameter,
            Category::Gradient,
            Category::Activation,
        ] {
            assert_eq!(device[cat], on_device[cat], "{tier} {cat}");
        }
        let off = r.offload.as_ref().unwrap();
        assert_eq!(off.host[Category::Gradient], gradient_buffers, "{tier}");
        let (resident, file) = match tier {
            Offload::Cpu => (&off.host, &off.disk),
            _ => (&off.disk, &off.host),
        };
        assert_eq!(resident[Category::MasterWeight], master, "{tier}");
        assert_eq!(resident[Category::OptimizerState], 2 * master, "{tier}");
        assert_eq!(
            file[Category::MasterWeight] + file[Category::OptimizerState],
            0
        );
        match tier {
            Offload::Cpu => assert_eq!(off.swap_bytes, 0),
            // Three swap buffers of the largest region: its master and two states.
            _ => assert_eq!(off.swap_bytes, 3 * 3 * pages(4 * largest)),
        }
    }
    // ZeRO-3 with parameters on disk: between steps the device holds no parameter and no
    // gradient; the parameter shards (bf16; alone a shard is its block) are in the file and the
    // reduced gradient shards (f32, the sums rounded to bf16 before the step) in host memory,
    // with no staging buffers.
    let c3 = offloaded(&mixed(1, 3), Offload::Nvme, Offload::Nvme, dir.path());
    let (_, t) = run_alone(&c3);
    let r = t.report();
    assert_eq!(r.memory.breakdown.steady[Category::Parameter], 0);
    assert_eq!(r.memory.breakdown.steady[Category::Gradient], 0);
    let bf16: u64 = blocks.iter().map(|&p| pages(2 * p)).sum();
    let off = r.offload.as_ref().unwrap();
    assert_eq!(off.disk[Category::Parameter], bf16);
    let f32_shards: u64 = blocks.iter().map(|&p| pages(4 * p)).sum();
    assert_eq!(off.host[Category::Gradient], f32_shards);
    assert_eq!(off.gradient_buffers, 0);
    // ZeRO-2 with two ranks: each rank's f32 gradient shard (half a block, padded) on the host.
    let c2 = offloaded(&mixed(2, 2), Offload::Cpu, Offload::None, dir.path());
    let rank0 = &run_ranks(&c2, 2)[0];
    let shards: u64 = blocks.iter().map(|&p| pages(4 * p.div_ceil(2))).sum();
    let off = rank0.report.offload.as_ref().unwrap();
    assert_eq!(off.host[Category::Gradient], shards);
    assert_eq!(rank0.report.memory.breakdown.steady[Category::Gradient], 0);
}

#[test]
fn the_dry_run_predicts_device_host_and_disk_bytes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    for (stage, optimizer, params) in [
        (1, Offload::Cpu, Offload::None),
        (2, Offload::Nvme, Offload::None),
        (3, Offload::Cpu, Offload::Cpu),
        (3, Offload::Nvme, Offload::Nvme),
    ] {
        for ranks in [1, 2] {
            let c = offloaded(&mixed(ranks, stage), optimizer, params, dir.path());
            let label = format!("ZeRO-{stage} {optimizer}/{params} at {ranks}");
            let predicted = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
            let measured = match ranks {
                1 => run_alone(&c).1.report().clone(),
                _ => run_ranks(&c, ranks).remove(0).report,
            };
            assert_eq!(
                predicted.memory.peak_bytes_by_category, measured.memory.peak_bytes_by_category,
                "{label}"
            );
            let (p, m) = (predicted.offload.unwrap(), measured.offload.unwrap());
            assert_eq!(
                (p.host, p.disk, p.swap_bytes),
                (m.host, m.disk, m.swap_bytes),
                "{label}"
            );
        }
    }
}

#[test]
fn a_save_taken_with_states_on_disk_resumes_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let saves = tempfile::tempdir().unwrap();
    for (stage, params) in [(1, Offload::None), (3, Offload::Nvme)] {
        let c = offloaded(&mixed(1, stage), Offload::Nvme, params, dir.path());
        let whole = run_alone(&c).0;
        let mut first = c.clone();
        first.steps = 10;
        let (_, mut t) = run_alone(&first);
        let save = t.save(saves.path()).unwrap();
        drop(t);
        let mut t = Trainer::new(c.clone(), &Corpus::bundled()).unwrap();
        t.resume(&save).unwrap();
        t.train(&mut |_| {}).unwrap();
        assert_eq!(
            outcome(&mut t),
            whole,
            "ZeRO-{stage}, parameters on {params}"
        );
        // The same save resumes without offload, and the other way round.
        let mut plain = mixed(1, stage);
        plain.steps = 20;
        let mut t = Trainer::new(plain, &Corpus::bundled()).unwrap();
        t.resume(&save).unwrap();
        t.train(&mut |_| {}).unwrap();
        assert_eq!(
            outcome(&mut t).1,
            whole.1,
            "ZeRO-{stage} resumed on the device"
        );
    }
}

#[test]
fn a_model_that_does_not_fit_the_device_trains_with_offload() {
    let dir = tempfile::tempdir().unwrap();
    // A GPT of 3.2 M parameters (4 layers of width 256) in bf16-mixed with AdamW, one short
    // sequence per step: master weights and states are 12 of its 16 bytes per parameter. A
    // budget of the offloaded run's reserved peak is below the plain run's allocated peak.
    let mut c = mixed(1, 1);
    (c.layers, c.width, c.heads) = (Some(4), Some(256), Some(4));
    c.steps = 5;
    c = c.with_split(1, 1);
    let off = offloaded(&c, Offload::Cpu, Offload::None, dir.path());
    let needed = headroom_train::predict::predict(&off, &Corpus::bundled()).unwrap();
    let budget = needed.memory.peak_reserved_bytes;
    c.device_memory = budget;
    let plain = headroom_train::predict::predict(&c, &Corpus::bundled()).unwrap();
    assert!(
        !plain.fits,
        "without offload {} > {budget}",
        plain.memory.peak_allocated_bytes
    );
    let mut off = off;
    off.device_memory = budget;
    let device = Device::cpu(budget, AllocatorConfig::default());
    let mut t = Trainer::on_device(off, &Corpus::bundled(), device).unwrap();
    t.train(&mut |_| {}).unwrap();
    assert_eq!(t.report().losses.len(), 5);
    assert!(t.report().memory.peak_reserved_bytes <= budget);
}

#[test]
fn a_disk_that_refuses_writes_is_named_and_the_last_save_stays_intact() {
    let saves = tempfile::tempdir().unwrap();
    let mut c = mixed(1, 1);
    c.steps = 4;
    let (_, mut t) = run_alone(&c);
    let save = t.save(saves.path()).unwrap();
    // A directory where no file can be created, even by root: sysfs answers "permission
    // denied" (the offload crate's own tests give a file whose every write answers "no space
    // left on device").
    let broken = offloaded(&c, Offload::Nvme, Offload::None, Path::new("/sys"));
    let e = Trainer::new(broken, &Corpus::bundled())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot be written") && e.contains("/sys/optimizer.rank0."),
        "{e}"
    );
    // An offload directory that is a file.
    let file = saves.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let e = Trainer::new(
        offloaded(&c, Offload::Nvme, Offload::None, &file),
        &Corpus::bundled(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("offload directory") && e.contains("--offload-dir"),
        "{e}"
    );
    // The save is whole: it resumes.
    let mut t = Trainer::new(c, &Corpus::bundled()).unwrap();
    t.resume(&save).unwrap();
}
