//! The training part of the offload experiment: the step time of each offload mode against
//! none, on the default model and on a 25 M-parameter GPT under a device budget that only offload
//! fits (its reference runs without the budget), with each mode's device peak, host and disk
//! bytes and the share of transfer time hidden behind the update.
//!
//! Not for: the host update, copy and disk measurements (`offload`).

use super::{BenchError, median};
use crate::Trainer;
use crate::config::{RunConfig, TrainConfig};
use crate::data::Corpus;
use crate::predict::predict;
use crate::strategy::{Offload, Precision, ZeroStage};
use headroom_memory::{AllocatorConfig, Device};
use headroom_offload::TierKind;
use serde::Serialize;

/// One offload mode on one model.
#[derive(Debug, Clone, Serialize)]
pub struct TrainingRow {
    pub model: String,
    pub mode: String,
    pub device_budget: Option<u64>,
    /// Whether the mode fits the budget (the other figures are 0 or none when not).
    pub fits: bool,
    /// Median seconds per step, the first (which allocates the optimizer state) left out.
    pub step_s: f64,
    /// Step time over the mode without offload's.
    pub vs_none: Option<f64>,
    pub peak_device_bytes: u64,
    pub host_bytes: u64,
    pub disk_bytes: u64,
    /// Share of the transfer time hidden behind the update.
    pub hidden_fraction: Option<f64>,
}

/// Offload modes: (label, ZeRO stage, optimizer tier, parameter tier).
const MODES: [(&str, u8, Offload, Offload); 5] = [
    ("none", 1, Offload::None, Offload::None),
    ("optimizer cpu", 1, Offload::Cpu, Offload::None),
    ("optimizer nvme", 1, Offload::Nvme, Offload::None),
    ("all cpu (ZeRO-3)", 3, Offload::Cpu, Offload::Cpu),
    ("all nvme (ZeRO-3)", 3, Offload::Nvme, Offload::Nvme),
];

/// The default model, and a 25 M-parameter GPT under a budget only offload fits.
pub(super) fn training(steps: u64, dir: &std::path::Path) -> Result<Vec<TrainingRow>, BenchError> {
    let default = TrainConfig {
        steps: Some(steps),
        eval_every: Some(0),
        eval_batches: Some(1),
        ..Default::default()
    }
    .resolve()?;
    let large = TrainConfig {
        layers: Some(8),
        width: Some(512),
        heads: Some(8),
        seq_len: Some(64),
        micro_batch: Some(1),
        precision: Some(Precision::Bf16Mixed),
        ..default.as_keys()
    }
    .resolve()?;
    let corpus = Corpus::bundled();
    let mut rows = Vec::new();
    for (model, base, budgeted) in [("default", &default, false), ("25M, budget", &large, true)] {
        let configs: Vec<(&str, RunConfig)> = MODES
            .iter()
            .map(|&(label, stage, optimizer, params)| {
                let mut c = base.clone();
                c.strategy.placement.zero_stage = ZeroStage::new(stage).expect("a stage");
                c.strategy.placement.offload_optimizer = optimizer;
                c.strategy.placement.offload_params = params;
                c.offload_dir = Some(dir.to_path_buf());
                (label, c)
            })
            .collect();
        // The budget: the optimizer-offload run's reserved peak (which ZeRO-3 offload also
        // fits); without offload the run does not fit.
        let budget = match budgeted {
            false => None,
            true => {
                let p = predict(&configs[1].1, &corpus)?;
                Some(p.memory.peak_reserved_bytes)
            }
        };
        let mut none_s = None;
        for (label, mut c) in configs {
            if let Some(b) = budget {
                c.device_memory = b;
            }
            let mut fits = predict(&c, &corpus)?.fits;
            let mut mode = label.to_string();
            if !fits && label == "none" {
                // The reference step time, measured without the budget it does not fit.
                c.device_memory = u64::MAX / 4;
                mode = "none (over the budget)".into();
                fits = true;
            }
            if !fits {
                rows.push(TrainingRow {
                    model: model.into(),
                    mode: label.into(),
                    device_budget: budget,
                    fits,
                    step_s: 0.0,
                    vs_none: None,
                    peak_device_bytes: 0,
                    host_bytes: 0,
                    disk_bytes: 0,
                    hidden_fraction: None,
                });
                continue;
            }
            let device = Device::cpu(c.device_memory, AllocatorConfig::default());
            let mut t = Trainer::on_device(c, &corpus, device)?;
            t.train(&mut |_| {})?;
            let r = t.report();
            // The first step allocates the optimizer state: left out when there are others.
            let skip = usize::from(r.step_times_s.len() > 1);
            let step_s = median(&mut r.step_times_s[skip..].to_vec());
            if label == "none" {
                none_s = Some(step_s);
            }
            let off = r.offload.as_ref();
            // The disk's transfers, or else the gradient copies; none when nothing moved.
            let hidden =
                off.and_then(
                    |o| match o.stores.iter().find(|s| s.tier == TierKind::Disk) {
                        Some(s) => Some(s.hidden_fraction()),
                        None if o.gradient_copy_seconds > 0.0 => Some(o.gradient_hidden_fraction()),
                        None => None,
                    },
                );
            rows.push(TrainingRow {
                model: model.into(),
                mode,
                device_budget: budget,
                fits,
                step_s,
                vs_none: none_s.map(|n| step_s / n),
                peak_device_bytes: r.memory.peak_allocated_bytes,
                host_bytes: off.map_or(0, |o| o.host_total()),
                disk_bytes: off.map_or(0, |o| o.disk.total()),
                hidden_fraction: hidden,
            });
        }
    }
    Ok(rows)
}
