//! Helpers shared by the integration tests: a planning problem on a GPU preset, and the
//! export schemas.

#![allow(dead_code)] // each test binary uses its own subset

pub mod schemas;

use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::hardware;
use headroom_plan::model::load_model;
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Optimizer, Placement, Precision, Strategy,
};
use headroom_plan::workload::{BatchSpec, Workload};

/// `model` on `nodes` nodes of `per_node` GPUs of preset `gpu`, `batch` sequences of `seq`
/// tokens per step, the default cost model.
pub fn problem(model: &str, gpu: &str, per_node: u64, nodes: u64, seq: u64, batch: u64) -> Problem {
    let spec = load_model(model).unwrap();
    let mut hw = hardware::preset(gpu).unwrap();
    hw.gpus_per_node = per_node;
    hw.nodes = nodes;
    let w = Workload::new(
        &spec,
        seq,
        BatchSpec::Samples(batch),
        None,
        None,
        hw.world_size(),
    )
    .unwrap();
    Problem::new(spec, hw, w, CostModel::default())
}

/// AdamW at `precision` with nothing else changed: no sharding or offload, no checkpointing,
/// naive attention, the plain loss.
pub fn plain_strategy(precision: Precision, micro_batch: u64, accumulation: u64) -> Strategy {
    Strategy {
        precision,
        optimizer: Optimizer::AdamW,
        placement: Placement::default(),
        checkpoint: Checkpoint::None,
        attention: Attention::Naive,
        loss: Loss::Plain,
        optimizer_in_backward: false,
        micro_batch,
        accumulation,
    }
}
