//! 8-bit AdamW in the engine: it trains as AdamW does within a few percent, its state bytes
//! are counted exactly by the dry run, it saves and resumes bitwise, offloads bitwise, and is
//! refused where ZeRO's shards would cut its blocks.

use crate::common;

use common::{assert_dry_run_exact, config, outcome, run_alone, run_ranks, zero};
use headroom_memory::Category;
use headroom_train::Trainer;
use headroom_train::config::RunConfig;
use headroom_train::data::Corpus;
use headroom_train::strategy::{Offload, Optimizer};

fn eight_bit(steps: u64) -> RunConfig {
    let mut c = config(Optimizer::AdamW8bit, 4, 1, 1);
    c.steps = steps;
    c
}

#[test]
fn it_trains_within_two_percent_of_adamw_with_a_quarter_of_the_state() {
    let mut adamw = config(Optimizer::AdamW, 4, 1, 1);
    adamw.steps = 60;
    let (_, a) = run_alone(&adamw);
    let (_, b) = run_alone(&eight_bit(60));
    let last = |t: &Trainer| t.report().losses.iter().rev().take(10).sum::<f64>() / 10.0;
    let (la, lb) = (last(&a), last(&b));
    assert!(
        ((lb - la) / la).abs() < 0.02,
        "8-bit {lb} against AdamW {la}"
    );
    assert!(lb < t0(&b) * 0.8, "it learns: {lb}");
    // States by hand: per block of P parameters, two moments' codes (P bytes each) and their
    // absmax (4 bytes per 256), each allocation rounded up to 512 bytes.
    let rounded = |b: usize| b.div_ceil(512) * 512;
    let blocks: Vec<usize> = b.model().blocks().iter().map(|b| b.numel()).collect();
    let want: usize = blocks
        .iter()
        .map(|&p| 2 * rounded(p) + 2 * rounded(4 * p.div_ceil(256)))
        .sum();
    let peaks = |t: &Trainer| t.report().memory.peak_bytes_by_category[Category::OptimizerState];
    assert_eq!(peaks(&b) as usize, want);
    // AdamW's f32 states: 8 bytes per parameter.
    let f32_states: usize = blocks.iter().map(|&p| 2 * rounded(4 * p)).sum();
    assert_eq!(peaks(&a) as usize, f32_states);
}

fn t0(t: &Trainer) -> f64 {
    t.report().losses[0]
}

#[test]
fn the_dry_run_predicts_it_exactly() {
    assert_dry_run_exact(&eight_bit(3), "adamw-8bit");
}

#[test]
fn a_save_resumes_bitwise_and_offload_changes_no_bit() {
    let dir = tempfile::tempdir().unwrap();
    let whole = run_alone(&eight_bit(20)).0;
    let (_, mut t) = run_alone(&eight_bit(10));
    let save = t.save(dir.path()).unwrap();
    let mut t = Trainer::new(eight_bit(20), &Corpus::bundled()).unwrap();
    t.resume(&save).unwrap();
    t.train(&mut |_| {}).unwrap();
    assert_eq!(outcome(&mut t), whole);
    for tier in [Offload::Cpu, Offload::Nvme] {
        let mut c = zero(eight_bit(20), 1);
        c.strategy.placement.offload_optimizer = tier;
        c.offload_dir = Some(dir.path().join("offload"));
        assert_eq!(run_alone(&c).0, whole, "{tier}");
    }
}

#[test]
fn zero_in_a_group_is_refused_and_ddp_runs() {
    let c = zero(config(Optimizer::AdamW8bit, 2, 1, 2), 1);
    let corpus = Corpus::bundled();
    let results = headroom_comm::ThreadGroup::run(2, std::time::Duration::from_secs(30), |comm| {
        let device = headroom_memory::Device::cpu(c.device_memory, Default::default());
        Trainer::on_rank(c.clone(), &corpus, device, Box::new(comm)).map(|_| ())
    });
    for r in results {
        let e = r.unwrap().unwrap_err().to_string();
        assert!(e.contains("adamw-8bit") && e.contains("--zero 0"), "{e}");
    }
    let ddp = run_ranks(&zero(config(Optimizer::AdamW8bit, 2, 1, 2), 0), 2);
    assert_eq!(ddp[0].bits, ddp[1].bits);
}
