//! Helpers shared by the integration tests: a planning problem on a GPU preset, the published
//! runs' tables, and the export schemas.

#![allow(dead_code)] // each test file uses its own subset

pub mod mesh_schemas;
pub mod published;
pub mod schemas;

use headroom_plan::cost::{CostModel, Plan, Problem, evaluate};
use headroom_plan::hardware;
use headroom_plan::model::load_model;
use headroom_plan::strategy::{
    Attention, Checkpoint, Loss, Offload, Optimizer, Placement, Precision, Strategy, ZeroStage,
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

/// AdamW at micro-batch 1 (accumulating the rest of the per-GPU batch) with the precision,
/// ZeRO stage, offload tiers and checkpointing given, memory-efficient attention.
pub fn plan(
    p: &Problem,
    precision: Precision,
    zero: u8,
    opt: Offload,
    params: Offload,
    ckpt: Checkpoint,
) -> Plan {
    let world = p.hardware.world_size();
    evaluate(
        p,
        &Strategy {
            precision,
            optimizer: Optimizer::AdamW,
            placement: Placement {
                zero_stage: ZeroStage::new(zero).unwrap(),
                offload_optimizer: opt,
                offload_params: params,
                offload_activations: Offload::None,
            },
            checkpoint: ckpt,
            attention: Attention::MemoryEfficient,
            loss: Loss::Plain,
            optimizer_in_backward: false,
            micro_batch: 1,
            accumulation: p.workload.global_batch / world,
        },
    )
}
