//! The search over meshes: every tp × pp (schedule) × dp × micro-batch layout `candidates`
//! admits beyond plain data parallelism, crossed with the levers a mesh run keeps (mixed
//! precision, the ZeRO stage across dp, selective or full recompute, the micro-batch), each
//! costed by `plan::evaluate_mesh`, and ranked as the single-device search ranks: plans that fit
//! first, then tokens/s, then fewer bytes communicated, then the lower peak.
//!
//! Plain data parallelism (tp = pp = 1) is not searched here: it is the planner's own search,
//! with its per-framework memory model, and `choice` sets its best plan beside the meshes'.
//!
//! Pins (`MeshPins`) fix an axis; a pin the model, batch or cluster cannot take is refused
//! before any search with the constraint it breaks (`Mesh::validate`'s messages, and the world
//! size and global batch the mesh must divide).
//!
//! Not for: costing one mesh (`plan`) or comparing the meshes with plain data parallelism
//! (`choice`).

use super::{
    AxisVerdict, MeshModel, MeshPlan, Recompute, candidate_meshes, evaluate_mesh, mesh_shape,
};
use crate::PlanError;
use crate::cost::Problem;
use crate::strategy::{
    Attention, Checkpoint, Mesh, Offload, Optimizer, Pins, PipelineSchedule, Precision,
    StrategyError, ZeroStage,
};
use std::cmp::Ordering;

/// The mesh axes a user fixed; `None`: searched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeshPins {
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub schedule: Option<PipelineSchedule>,
    pub microbatches: Option<u64>,
    pub sequence_parallel: Option<bool>,
    /// Context-parallel ranks; `None`: 1 (context parallelism is planned only when asked for).
    pub cp: Option<u64>,
    /// Expert-parallel ranks (a mixture of experts); `None`: searched.
    pub ep: Option<u64>,
    /// TP's collectives overlapped with the matmuls (`Mesh::tp_comm_overlap`); `None`: off,
    /// the frameworks' default.
    pub tp_comm_overlap: Option<bool>,
}

impl MeshPins {
    pub fn any(&self) -> bool {
        *self != MeshPins::default()
    }

    /// Whether plain data parallelism (every model-parallel axis 1) keeps the pins.
    pub fn admit_plain(&self) -> bool {
        self.tp.is_none_or(|t| t == 1)
            && self.pp.is_none_or(|p| p == 1)
            && self
                .schedule
                .is_none_or(|s| s == PipelineSchedule::OneFOneB)
            && self.sequence_parallel != Some(true)
            && self.microbatches.is_none()
            && self.cp.is_none_or(|c| c == 1)
            && self.ep.is_none_or(|e| e == 1)
            && self.tp_comm_overlap != Some(true)
    }

    /// Whether pins leave only plain data parallelism (no mesh to search).
    pub fn only_plain(&self) -> bool {
        self.tp == Some(1)
            && self.pp == Some(1)
            && self.cp.is_none_or(|c| c == 1)
            && self.ep.is_none_or(|e| e == 1)
    }

    fn allow(&self, mesh: &Mesh) -> bool {
        self.tp.is_none_or(|t| t == mesh.tp)
            && self.pp.is_none_or(|p| p == mesh.pp)
            && self.schedule.is_none_or(|s| s == mesh.schedule)
            && self.microbatches.is_none_or(|m| m == mesh.microbatches)
            && self
                .sequence_parallel
                .is_none_or(|sp| sp == mesh.sequence_parallel)
            && self.cp.unwrap_or(1) == mesh.cp
            && self.ep.is_none_or(|e| e == mesh.ep)
    }
}

/// The levers a mesh plan searches, from the single-device pins.
struct Levers {
    precisions: Vec<Precision>,
    zero_stages: Vec<ZeroStage>,
    recomputes: Vec<Recompute>,
    micro_batches: Vec<u64>,
}

/// Micro-batches tried when not pinned (sequences per micro-batch per replica).
const MICRO_BATCHES: [u64; 4] = [1, 2, 4, 8];

/// The levers a mesh run keeps, or why the pinned ones leave none: the mesh model is
/// Megatron-LM's mixed-precision AdamW with flash attention and nothing offloaded.
fn levers(problem: &Problem, pins: &Pins) -> Result<Levers, String> {
    let mixed = if problem.hardware.gpu.bf16_tflops > 0.0 {
        Precision::Bf16Mixed
    } else {
        Precision::Fp16Mixed
    };
    let precisions = match pins.precision {
        None => vec![mixed],
        Some(p @ (Precision::Bf16Mixed | Precision::Fp16Mixed)) => vec![p],
        Some(p) => {
            return Err(format!(
                "mesh plans model Megatron-LM's mixed precision (16-bit weights and activations, fp32 gradients and Adam states); --precision {p} is not modelled: use bf16-mixed or fp16-mixed"
            ));
        }
    };
    if let Some(o) = pins.optimizer.filter(|o| *o != Optimizer::AdamW) {
        return Err(format!(
            "mesh plans model AdamW's two fp32 moments; --optimizer {o} is not modelled: use adamw"
        ));
    }
    let offloaded = [
        pins.offload_optimizer,
        pins.offload_params,
        pins.offload_activations,
    ]
    .iter()
    .any(|o| o.is_some_and(|o| o != Offload::None));
    if offloaded || pins.optimizer_in_backward == Some(true) {
        return Err(
            "mesh plans keep every state on the GPU and step after backward: drop the offload and --optimizer-in-backward pins".into(),
        );
    }
    if pins.attention == Some(Attention::Naive) {
        return Err(
            "mesh plans assume memory-efficient (flash) attention, as Megatron-LM and torchtitan run it: drop --attention naive".into(),
        );
    }
    let recomputes = match pins.checkpoint {
        None => vec![Recompute::Selective, Recompute::Full],
        Some(Checkpoint::None | Checkpoint::Selective) => vec![Recompute::Selective],
        Some(c) if c == Checkpoint::ALL_BLOCKS => vec![Recompute::Full],
        Some(c) => {
            return Err(format!(
                "mesh plans recompute selectively (Korthikanti et al.; none, with flash attention) or every layer; --checkpoint {c} is not modelled: use none, selective or all"
            ));
        }
    };
    Ok(Levers {
        precisions,
        zero_stages: pins.zero_stage.map_or(ZeroStage::ALL.to_vec(), |z| vec![z]),
        recomputes,
        micro_batches: pins.micro_batch.map_or(MICRO_BATCHES.to_vec(), |b| vec![b]),
    })
}

/// The first constraint a set of pins breaks on this model, batch and cluster, with the fix.
fn check_pins(problem: &Problem, mesh_pins: &MeshPins, micro_batch: u64) -> Result<(), PlanError> {
    let hw = &problem.hardware;
    let world = hw.world_size();
    let global = problem.workload.global_batch;
    let tp = mesh_pins.tp.unwrap_or(1);
    let pp = mesh_pins.pp.unwrap_or(1);
    let cp = mesh_pins.cp.unwrap_or(1);
    if tp == 0 || pp == 0 || cp == 0 || mesh_pins.ep == Some(0) || mesh_pins.microbatches == Some(0)
    {
        return Err(PlanError::Mesh(
            "--tp, --pp, --cp, --ep and --microbatches must be at least 1".into(),
        ));
    }
    if !world.is_multiple_of(tp * pp * cp) {
        return Err(PlanError::Mesh(format!(
            "tp·pp·cp = {tp}·{pp}·{cp} does not divide the {world} GPUs ({} nodes × {}): pick a tp, pp and cp whose product divides {world}",
            hw.nodes, hw.gpus_per_node
        )));
    }
    // PyTorch's context parallelism balances causal attention by cutting each sequence into
    // 2·cp chunks, rank r taking chunks r and 2·cp − 1 − r (`_HeadTailLoadBalancer`).
    let seq = problem.workload.seq_len;
    if cp > 1 && !seq.is_multiple_of(2 * cp) {
        return Err(PlanError::Mesh(format!(
            "context parallelism cuts each sequence into 2·cp = {} load-balanced chunks: --seq-len {seq} is not divisible by {}; use a sequence length that is",
            2 * cp,
            2 * cp
        )));
    }
    let dp = world / (tp * pp * cp);
    let m = mesh_pins.microbatches.unwrap_or(1);
    let schedule = mesh_pins.schedule.unwrap_or_default();
    let mesh = Mesh {
        dp,
        tp,
        sequence_parallel: mesh_pins.sequence_parallel.unwrap_or(tp > 1),
        pp,
        schedule,
        // The split the search would take: even, or one layer fewer at both ends.
        fewer_layers_at_ends: super::candidates::fewer_at_ends(
            problem.spec.num_layers,
            pp,
            schedule.chunks(),
        )
        .unwrap_or(0),
        microbatches: mesh_pins
            .microbatches
            .unwrap_or((global / (dp * micro_batch)).max(1)),
        cp,
        ep: mesh_pins.ep.unwrap_or(1),
        tp_comm_overlap: mesh_pins.tp_comm_overlap.unwrap_or(false),
    };
    // The model's and the node's constraints first (against the batch this mesh runs), then
    // the global batch's.
    let runs = mesh.dp * mesh.microbatches * micro_batch;
    let shape = mesh_shape(&problem.spec, runs, micro_batch, hw.gpus_per_node);
    mesh.validate(&shape).map_err(|e| match e {
        StrategyError::Incompatible(why) => PlanError::Mesh(why),
        other => PlanError::Mesh(other.to_string()),
    })?;
    let per_step = dp * micro_batch * m;
    if !global.is_multiple_of(per_step) {
        return Err(PlanError::Mesh(format!(
            "the global batch of {global} sequences is not divisible by dp·m·micro-batch = {dp}·{m}·{micro_batch}: give a --global-batch that is a multiple of {per_step}"
        )));
    }
    Ok(())
}

/// Every mesh plan evaluated, ranked, and how many were evaluated.
#[derive(Clone, Debug, Default)]
pub struct MeshSearch {
    /// Fitting plans best first, then the others by peak.
    pub plans: Vec<MeshPlan>,
    pub evaluated: usize,
}

/// Orders mesh plans: fitting first, then tokens/s, fewer bytes communicated, the lower peak.
pub fn rank_meshes(a: &MeshPlan, b: &MeshPlan) -> Ordering {
    let by = |x: f64, y: f64| x.partial_cmp(&y).unwrap_or(Ordering::Equal);
    b.fits.cmp(&a.fits).then_with(|| {
        if a.fits {
            by(b.tokens_per_s, a.tokens_per_s)
                .then(by(
                    a.communication_bytes_per_device,
                    b.communication_bytes_per_device,
                ))
                .then(a.peak_bytes.cmp(&b.peak_bytes))
        } else {
            a.peak_bytes.cmp(&b.peak_bytes)
        }
    })
}

/// Searches the meshes beyond plain data parallelism for `problem` under `pins` and
/// `mesh_pins`. With no mesh pin, a model or lever the mesh model does not cover gives an empty
/// search (plain data parallelism alone); with one, it is an error naming why.
pub fn search_meshes(
    problem: &Problem,
    pins: &Pins,
    mesh_pins: &MeshPins,
) -> Result<MeshSearch, PlanError> {
    let hw = &problem.hardware;
    let world = hw.world_size();
    let refuse = |why: String| {
        if mesh_pins.any() && !mesh_pins.only_plain() {
            Err(PlanError::Mesh(why))
        } else {
            Ok(MeshSearch::default())
        }
    };
    if mesh_pins.only_plain() {
        return Ok(MeshSearch::default());
    }
    if problem.workload.lora.is_some() {
        return refuse("mesh plans train every weight; a LoRA fine-tune is planned with data parallelism: drop the mesh pins".into());
    }
    if world == 1 {
        return refuse("a mesh needs several GPUs: give --gpus-per-node and --nodes".into());
    }
    let levers = match levers(problem, pins) {
        Ok(l) => l,
        Err(why) => return refuse(why),
    };
    let seq = problem.workload.seq_len;
    if let Err(e) = MeshModel::from_architecture(&problem.spec, seq, 1) {
        return refuse(e.to_string());
    }
    if mesh_pins.any() {
        check_pins(problem, mesh_pins, levers.micro_batches[0])?;
    }
    let global = problem.workload.global_batch;
    let mut plans = Vec::new();
    for &b in &levers.micro_batches {
        let model = MeshModel::from_architecture(&problem.spec, seq, b)?;
        let shape = mesh_shape(&problem.spec, global, b, hw.gpus_per_node);
        for mut mesh in candidate_meshes(&shape, world, mesh_pins.cp.unwrap_or(1)) {
            if mesh.tp == 1 && mesh.pp == 1 && mesh.cp == 1 && mesh.ep == 1 {
                continue;
            }
            if mesh_pins.sequence_parallel == Some(false) {
                mesh.sequence_parallel = false;
            }
            if mesh_pins.tp_comm_overlap == Some(true) {
                // Overlapping needs TP's collectives to be the all-gather and reduce-scatter
                // of sequence parallelism (Megatron-LM's check).
                if mesh.tp == 1 || !mesh.sequence_parallel {
                    continue;
                }
                mesh.tp_comm_overlap = true;
            }
            if !mesh_pins.allow(&mesh) {
                continue;
            }
            for &precision in &levers.precisions {
                for &zero in &levers.zero_stages {
                    for &recompute in &levers.recomputes {
                        plans.push(evaluate_mesh(
                            problem, &model, &mesh, precision, zero, recompute,
                        ));
                    }
                }
            }
        }
    }
    if plans.is_empty() && mesh_pins.any() {
        return Err(PlanError::Mesh(format!(
            "no mesh keeps the pins on {world} GPUs with a global batch of {global} sequences: loosen a pin (the micro-batch count follows dp and the global batch: m = batch / (dp·micro-batch))"
        )));
    }
    let evaluated = plans.len();
    plans.sort_by(rank_meshes);
    Ok(MeshSearch { plans, evaluated })
}

/// Pipeline depths explained when no layout takes them: the divisors of the GPU count up to this
/// (the Llama 3 run's 16 stages), which keeps the report short.
const EXPLAINED_PP: u64 = 16;

/// For every tp (a divisor of the GPUs per node) and pp (a divisor of the GPU count up to 16)
/// that no searched layout takes (`taken`: the (tp, pp) of every layout searched, plain data
/// parallelism's (1, 1) among them when it ran), the constraint the simplest layout with it
/// breaks: that value with the other axis at 1 or its pin.
pub fn unreachable_values(
    problem: &Problem,
    mesh_pins: &MeshPins,
    micro_batch: u64,
    taken: &[(u64, u64)],
) -> Vec<AxisVerdict> {
    let hw = &problem.hardware;
    let world = hw.world_size();
    let divisors = |n: u64, max: u64| (1..=n.min(max)).filter(move |d| n.is_multiple_of(*d));
    let why = |pins: MeshPins| match check_pins(problem, &pins, micro_batch) {
        Err(PlanError::Mesh(m)) => m,
        Err(e) => e.to_string(),
        Ok(()) => "no layout with it keeps the other pins and divides the global batch".into(),
    };
    let mut out = Vec::new();
    if mesh_pins.tp.is_none() {
        for tp in divisors(hw.gpus_per_node, u64::MAX) {
            if !taken.iter().any(|&(t, _)| t == tp) {
                out.push(AxisVerdict {
                    axis: "tp",
                    value: tp.to_string(),
                    best: None,
                    reason: why(MeshPins {
                        tp: Some(tp),
                        sequence_parallel: None,
                        ..*mesh_pins
                    }),
                });
            }
        }
    }
    if mesh_pins.pp.is_none() {
        for pp in divisors(world, EXPLAINED_PP) {
            if !taken.iter().any(|&(_, p)| p == pp) {
                out.push(AxisVerdict {
                    axis: "pp",
                    value: pp.to_string(),
                    best: None,
                    reason: why(MeshPins {
                        pp: Some(pp),
                        ..*mesh_pins
                    }),
                });
            }
        }
    }
    out
}
