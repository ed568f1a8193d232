//! The layout of `--allocator planned`: a dry run of the configuration — the same requests in
//! the same order as the real run, on a shape-only device that records them — through its
//! first step, two steady steps and a validation; each window's requests are packed into one
//! arena (`headroom_memory::arena`). A window the dry run saw change between its steady steps
//! is left to the caching pools.
//!
//! Not for: serving the layout (the memory crate's allocator does that).

use crate::config::RunConfig;
use crate::data::Corpus;
use crate::trainer::{TrainError, Trainer};
use headroom_comm::ShapeOnlyRank;
use headroom_memory::{AllocatorKind, ArenaLayout, Device};

/// Steps the recording runs: the first step (which creates the optimizer state) and two steady
/// ones, which must agree for the steady window to be planned.
const RECORDED_STEPS: u64 = 3;
/// Capacity of the recording device: never reached, so nothing is reclaimed.
const UNLIMITED: u64 = 1 << 46;

/// Records and packs the windows of `config` as rank `rank` of `world` runs them.
pub fn record_arena_layout(
    config: &RunConfig,
    corpus: &Corpus,
    (rank, world): (usize, usize),
) -> Result<ArenaLayout, TrainError> {
    let mut c = config.clone();
    c.allocator = AllocatorKind::Caching;
    c.steps = c.steps.clamp(1, RECORDED_STEPS);
    c.eval_every = 0; // the validation after the last step remains
    c.save_dir = None;
    c.oom_recovery = false;
    let device = Device::shape_only(UNLIMITED, c.allocator.config());
    device.lock().record_windows();
    let mut trainer = if world > 1 {
        Trainer::on_rank(
            c,
            corpus,
            device.clone(),
            Box::new(ShapeOnlyRank::new(rank, world)),
        )?
    } else {
        Trainer::on_device(c, corpus, device.clone())?
    };
    trainer.train(&mut |_| {})?;
    // Taken while the trainer lives: what it still holds at the end is permanent.
    let plan = device.lock().take_recorded_layout();
    drop(trainer);
    Ok(plan.unwrap_or_default())
}
