//! Advice in the terms of the decision framework: why the recommended plan looks the way it does
//! (model states too big → sharding or offload; activations → checkpointing or memory-efficient
//! attention; large batch → accumulation; fragmentation reserve), and, when nothing fits, how
//! many bytes are missing and the smallest changes that would fit.
//!
//! Not for: computing costs (see `cost`) or ranking (see `search`).

use crate::cost::memory::Phase;
use crate::cost::sdpa::{self, SdpaKernel};
use crate::cost::{Plan, Problem, activation, memory};
use crate::hardware::{self, Hardware};
use crate::search::search;
use crate::strategy::{Attention, Checkpoint, Loss, Offload, Pins, Placement, Strategy};
use crate::workload::{BatchSpec, Workload};
use headroom_memory::format_bytes;
use serde::Serialize;

/// The reasons behind a plan, one sentence each.
pub fn explain(problem: &Problem, plan: &Plan) -> Vec<String> {
    let s = &plan.strategy;
    let usable = problem.usable_device_bytes();
    let mut out = Vec::new();

    let replicated = Strategy {
        placement: Placement::default(),
        ..*s
    };
    let full_states = memory::model_state_bytes(problem, &replicated);
    let states = memory::model_state_bytes(problem, s);
    let n = problem.hardware.world_size();
    let pl = s.placement;
    if pl.zero_stage.number() > 0 || pl.offload_optimizer != Offload::None {
        let how = match (pl.zero_stage, pl.offload_optimizer, pl.offload_params) {
            (z, Offload::None, _) if n == 1 => format!(
                "ZeRO-{z} on one GPU shards nothing (each state has a single shard, as replicated)"
            ),
            (z, Offload::None, _) => format!("ZeRO-{z} shards them over {n} GPUs"),
            (z, o, Offload::None) => format!("ZeRO-{z} with optimizer states offloaded to {o}"),
            (z, o, p) => format!("ZeRO-{z} with optimizer states on {o} and parameters on {p}"),
        };
        let verdict = if full_states > usable {
            "more than"
        } else {
            "out of"
        };
        out.push(format!(
            "Model states: replicated they would take {} per GPU ({verdict} the {} usable); {how}, leaving {} per GPU.",
            format_bytes(full_states),
            format_bytes(usable),
            format_bytes(states)
        ));
    } else {
        out.push(format!(
            "Model states: {} per GPU fit replicated (no sharding or offload needed).",
            format_bytes(states)
        ));
    }

    let (seq, b) = (problem.workload.seq_len as f64, s.micro_batch as f64);
    let e = activation::Width::of(problem.framework, s);
    let plain = activation::model_activations(
        &problem.spec,
        seq,
        b,
        e,
        Attention::Naive,
        Checkpoint::None,
        Loss::Plain,
    );
    // The activations the plan keeps during backward (at an optimizer-step peak they are freed
    // and the breakdown at the peak holds none), with the attention as its kernel runs (SDPA's
    // math path keeps the scores, `sdpa`).
    let (on, run) = sdpa::as_run(problem, s);
    let offloaded = crate::cost::memory::offloaded_activation_bytes(&on, &run);
    let act =
        (activation::model_activations(&on.spec, seq, b, e, run.attention, s.checkpoint, s.loss)
            - offloaded.device_saving)
            .round() as u64;
    let at_step = plan.memory.peak_phase == Phase::OptimizerStep;
    if s.checkpoint != Checkpoint::None
        || s.attention == Attention::MemoryEfficient
        || s.loss != Loss::Plain
    {
        let recompute = 100.0 * plan.time.recompute_flops / plan.time.model_flops;
        let mut levers = Vec::new();
        if s.checkpoint != Checkpoint::None {
            levers.push(format!(
                "checkpointing ({}, +{recompute:.1}% FLOPs recomputed)",
                s.checkpoint
            ));
        }
        if offloaded.host > 0.0 {
            levers.push(format!(
                "the checkpointed inputs kept in host memory ({} there, one fetched back at a time)",
                format_bytes(offloaded.host.round() as u64)
            ));
        }
        match sdpa::kernel(problem, s) {
            Some(SdpaKernel::Math) => levers.push(
                "SDPA, which runs its math path here (no fused kernel takes these grouped-query \
                 heads at this precision, so the s² probabilities are stored as with naive attention)"
                    .to_string(),
            ),
            _ if s.attention == Attention::MemoryEfficient => {
                levers.push("memory-efficient attention (no s² scores stored)".to_string())
            }
            _ => {}
        }
        if let Loss::Chunked(k) = s.loss {
            levers.push(format!(
                "the loss in {k} chunks (1/{k} of the fp32 logits at once)"
            ));
        }
        out.push(format!(
            "Activations: {} per GPU at micro-batch {} with naive attention and no checkpointing; {} {} them to {}.",
            format_bytes(plain.round() as u64),
            s.micro_batch,
            levers.join(" and "),
            if levers.len() == 1 { "brings" } else { "bring" },
            format_bytes(act)
        ) + if at_step {
            " They do not lower the peak: it is in the optimizer step, after the activations are freed."
        } else {
            ""
        });
    } else {
        out.push(format!(
            "Activations: {} per GPU fit without checkpointing{}.",
            format_bytes(act),
            if at_step {
                " (the peak is in the optimizer step, after they are freed)"
            } else {
                ""
            }
        ));
    }

    out.push(format!(
        "Batch: global batch {} = micro-batch {} × {} accumulation steps × {n} GPU{}.",
        problem.workload.global_batch,
        s.micro_batch,
        s.accumulation,
        if n == 1 { "" } else { "s" }
    ));
    out.push(format!(
        "Reserve: {} of CUDA context and {:.0}% fragmentation reserve are counted in 'other'; plans must stay under {} ({:.0}% margin below {}).",
        format_bytes(problem.hardware.cuda_context_bytes),
        100.0 * problem.cost.fragmentation,
        format_bytes(usable),
        100.0 * problem.cost.margin,
        format_bytes(problem.hardware.gpu.memory_bytes)
    ));
    let offloads = s.placement.offload_optimizer != crate::strategy::Offload::None
        || s.placement.offload_params != crate::strategy::Offload::None
        || s.placement.offload_activations != crate::strategy::Offload::None;
    let loader = problem.workload.loader;
    if offloads {
        out.push(format!(
            "Offload needs {} of host RAM and {} of NVMe per node{}.",
            format_bytes(plan.memory.host_bytes_per_node),
            format_bytes(plan.memory.nvme_bytes_per_node),
            if loader.is_some() {
                " (the data loaders included)"
            } else {
                ""
            }
        ));
    } else if let Some(l) = loader {
        out.push(format!(
            "The data loaders ({} workers, {} batches queued per GPU) need {} of host RAM per node.",
            l.workers,
            l.prefetch,
            format_bytes(plan.memory.host_bytes_per_node)
        ));
    }
    if plan.fidelity_tier > 0 {
        out.push(format!(
            "Note: this plan changes the training numerics (precision {}, optimizer {}); nothing with mixed-precision AdamW fits.",
            s.precision, s.optimizer
        ));
    }
    out
}

/// What to do when no plan fits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Shortfall {
    /// Bytes the closest plan lacks on each device (peak − usable).
    pub missing_bytes_per_device: u64,
    /// Host RAM the closest plan lacks on each node (offloaded states, loaders), 0 if none.
    pub missing_host_bytes_per_node: u64,
    /// NVMe the closest plan lacks on each node, 0 if none.
    pub missing_nvme_bytes_per_node: u64,
    /// Changes that make at least one plan fit, smallest first within each kind.
    pub suggestions: Vec<String>,
}

/// Finds how far the closest plan misses and which single changes would fit.
pub fn shortfall(problem: &Problem, pins: &Pins, closest: &Plan) -> Shortfall {
    let missing = closest
        .memory
        .per_device_peak_bytes
        .saturating_sub(problem.usable_device_bytes());
    let mut suggestions = Vec::new();
    let fits =
        |p: &Problem, pins: &Pins| search(p, pins, None).is_ok_and(|o| !o.fitting.is_empty());

    // More GPUs of the same kind: fill the node up to 8, then add nodes.
    let hw = &problem.hardware;
    let mut candidate = hw.clone();
    for _ in 0..12 {
        if candidate.gpus_per_node < 8 {
            candidate.gpus_per_node = (candidate.gpus_per_node * 2).min(8);
        } else {
            candidate.nodes *= 2;
        }
        if let Some(p) = with_hardware(problem, &candidate)
            && fits(&p, pins)
        {
            let batch = if p.workload.global_batch == problem.workload.global_batch {
                String::new()
            } else {
                format!(" --global-batch {}", p.workload.global_batch)
            };
            suggestions.push(format!(
                "use {} GPUs ({} per node × {} nodes): --gpus-per-node {} --nodes {}{batch}",
                candidate.world_size(),
                candidate.gpus_per_node,
                candidate.nodes,
                candidate.gpus_per_node,
                candidate.nodes
            ));
            break;
        }
    }

    // A larger GPU, same count.
    let mut bigger: Vec<Hardware> = hardware::gpu_preset_names()
        .into_iter()
        .filter_map(|n| hardware::preset(n).ok())
        .filter(|h| h.gpu.memory_bytes > hw.gpu.memory_bytes)
        .collect();
    bigger.sort_by_key(|h| h.gpu.memory_bytes);
    for mut h in bigger {
        h.gpus_per_node = hw.gpus_per_node;
        h.nodes = hw.nodes;
        if let Some(p) = with_hardware(problem, &h)
            && fits(&p, pins)
        {
            suggestions.push(format!("use a larger GPU: --gpu {}", h.gpu.name));
            break;
        }
    }

    // Offload, where the pins forbade it.
    if pins.offload_optimizer == Some(Offload::None) || pins.offload_params == Some(Offload::None) {
        let freed = Pins {
            offload_optimizer: None,
            offload_params: None,
            zero_stage: None,
            ..*pins
        };
        if fits(problem, &freed) {
            suggestions.push(
                "allow offload: drop --offload-optimizer none / --offload-params none / --zero"
                    .into(),
            );
        }
    }

    // A shorter sequence.
    let mut seq = problem.workload.seq_len / 2;
    while seq >= 64 {
        let w = Workload {
            seq_len: seq,
            ..problem.workload.clone()
        };
        let p = Problem {
            workload: w,
            ..problem.clone()
        };
        if fits(&p, pins) {
            suggestions.push(format!("shorten the sequence: --seq-len {seq}"));
            break;
        }
        seq /= 2;
    }
    let keep = 1.0 - problem.cost.margin;
    let host_usable = (hw.host_memory_bytes as f64 * keep) as u64;
    Shortfall {
        missing_bytes_per_device: missing,
        missing_host_bytes_per_node: closest
            .memory
            .host_bytes_per_node
            .saturating_sub(host_usable),
        missing_nvme_bytes_per_node: closest
            .memory
            .nvme_bytes_per_node
            .saturating_sub(hw.nvme_bytes),
        suggestions,
    }
}

impl Shortfall {
    /// What the closest plan lacks, in words: per GPU, and host RAM or NVMe per node where
    /// those are what it misses.
    pub fn missing_text(&self) -> String {
        let mut parts = Vec::new();
        if self.missing_bytes_per_device > 0 {
            parts.push(format!(
                "{} more per GPU",
                format_bytes(self.missing_bytes_per_device)
            ));
        }
        if self.missing_host_bytes_per_node > 0 {
            parts.push(format!(
                "{} more host RAM per node",
                format_bytes(self.missing_host_bytes_per_node)
            ));
        }
        if self.missing_nvme_bytes_per_node > 0 {
            parts.push(format!(
                "{} more NVMe per node",
                format_bytes(self.missing_nvme_bytes_per_node)
            ));
        }
        match parts.is_empty() {
            true => "no more memory (it misses by less than a byte)".into(),
            false => parts.join(" and "),
        }
    }
}

/// The same problem on other hardware, if the batch still splits over its GPUs.
fn with_hardware(problem: &Problem, hw: &Hardware) -> Option<Problem> {
    let world = hw.world_size();
    let w = &problem.workload;
    // Keep the global batch when it splits over the new GPUs, else round it up to a multiple.
    let global = w.global_batch.max(world).div_ceil(world) * world;
    let batch = BatchSpec::Samples(global);
    let workload = Workload::new(
        &problem.spec,
        w.seq_len,
        batch,
        w.micro_batch,
        w.accumulation,
        world,
    )
    .ok()?;
    let workload = Workload {
        loader: w.loader,
        lora: w.lora.clone(),
        lora_base_dtype: w.lora_base_dtype,
        lora_dropout: w.lora_dropout,
        ..workload
    };
    Some(Problem {
        hardware: hw.clone(),
        workload,
        ..problem.clone()
    })
}
