//! The recommendation across layouts: the planner's best plain data-parallel plan beside the
//! searched meshes, and, for every value of an axis the recommendation did not take (tp = 1,
//! pp = 1, another tp or pp, the other schedule, another ZeRO stage), the best layout with that
//! value and why it lost: it does not fit (its peak against the usable memory), or it fits but
//! runs fewer tokens/s.
//!
//! Ranking is the search's: plans that fit, then tokens/s. Plain data parallelism is the layout
//! a run has before it is split, so, as the single-device search keeps a configured strategy
//! among plans within `SAME_SPEED` of the fastest, a mesh must beat it by more than that.
//!
//! Not for: searching (`search`) or rendering (the CLI).

use super::MeshPlan;
use crate::cost::Plan;
use crate::search::{SAME_SPEED, SearchOutcome};
use crate::strategy::PipelineSchedule;
use serde::Serialize;

/// A layout of either kind.
#[derive(Clone, Copy, Debug)]
pub enum Layout<'a> {
    /// Plain data parallelism over every GPU (the planner's own search).
    Plain(&'a Plan),
    Mesh(&'a MeshPlan),
}

/// What the report shows of a layout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayoutSummary {
    /// "dp 8 × tp 8 × pp 8, interleaved:2, m 64, SP on".
    pub layout: String,
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    /// Context- and expert-parallel ranks (1 for plain data parallelism).
    pub cp: u64,
    pub ep: u64,
    pub schedule: String,
    pub microbatches: u64,
    pub sequence_parallel: bool,
    pub zero_stage: u8,
    pub checkpoint: String,
    pub micro_batch: u64,
    pub fits: bool,
    pub peak_bytes: u64,
    pub usable_bytes: u64,
    pub tokens_per_s: f64,
}

impl Layout<'_> {
    fn fits(&self) -> bool {
        match self {
            Layout::Plain(p) => p.fits,
            Layout::Mesh(m) => m.fits,
        }
    }

    fn tokens_per_s(&self) -> f64 {
        match self {
            Layout::Plain(p) => p.time.tokens_per_s,
            Layout::Mesh(m) => m.tokens_per_s,
        }
    }

    fn peak_bytes(&self) -> u64 {
        match self {
            Layout::Plain(p) => p.memory.per_device_peak_bytes,
            Layout::Mesh(m) => m.peak_bytes,
        }
    }

    /// The value of `axis` this layout takes.
    fn value(&self, axis: Axis) -> String {
        let s = self.summary(0);
        match axis {
            Axis::Tp => s.tp.to_string(),
            Axis::Pp => s.pp.to_string(),
            // The kind, not each chunk count: the best v stands for the interleaved schedule.
            Axis::Schedule => match s.schedule.as_str() {
                "1f1b" => s.schedule,
                _ => "interleaved".into(),
            },
            Axis::Zero => s.zero_stage.to_string(),
            Axis::Ep => s.ep.to_string(),
        }
    }

    /// The layout in words and figures; `world` is the GPU count (plain data parallelism's dp).
    pub fn summary(&self, world: u64) -> LayoutSummary {
        match self {
            Layout::Plain(p) => {
                let s = &p.strategy;
                LayoutSummary {
                    layout: format!("dp {world} (plain data parallelism)"),
                    dp: world,
                    tp: 1,
                    pp: 1,
                    cp: 1,
                    ep: 1,
                    schedule: PipelineSchedule::OneFOneB.to_string(),
                    microbatches: s.accumulation,
                    sequence_parallel: false,
                    zero_stage: s.placement.zero_stage.number(),
                    checkpoint: s.checkpoint.to_string(),
                    micro_batch: s.micro_batch,
                    fits: p.fits,
                    peak_bytes: p.memory.per_device_peak_bytes,
                    usable_bytes: p.memory.usable_bytes,
                    tokens_per_s: p.time.tokens_per_s,
                }
            }
            Layout::Mesh(m) => {
                let mesh = &m.mesh;
                LayoutSummary {
                    layout: format!(
                        "dp {}{} × tp {} × pp {}{}, {}, m {}, SP {}{}{}",
                        mesh.dp,
                        match mesh.cp {
                            1 => String::new(),
                            c => format!(" × cp {c}"),
                        },
                        mesh.tp,
                        mesh.pp,
                        match mesh.ep {
                            1 => String::new(),
                            e => format!(" (ep {e} of the dp·cp ranks)"),
                        },
                        mesh.schedule,
                        mesh.microbatches,
                        if mesh.sequence_parallel { "on" } else { "off" },
                        if mesh.tp_comm_overlap {
                            ", TP overlapped"
                        } else {
                            ""
                        },
                        match mesh.fewer_layers_at_ends {
                            0 => String::new(),
                            k => format!(", ends −{k} layer"),
                        }
                    ),
                    dp: mesh.dp,
                    tp: mesh.tp,
                    pp: mesh.pp,
                    cp: mesh.cp,
                    ep: mesh.ep,
                    schedule: mesh.schedule.to_string(),
                    microbatches: mesh.microbatches,
                    sequence_parallel: mesh.sequence_parallel,
                    zero_stage: m.zero_stage.number(),
                    checkpoint: m.checkpoint.to_string(),
                    micro_batch: m.micro_batch,
                    fits: m.fits,
                    peak_bytes: m.peak_bytes,
                    usable_bytes: m.usable_bytes,
                    tokens_per_s: m.tokens_per_s,
                }
            }
        }
    }
}

/// The axes a verdict is given for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Axis {
    Tp,
    Pp,
    Schedule,
    Zero,
    Ep,
}

impl Axis {
    const ALL: [Axis; 5] = [Axis::Tp, Axis::Pp, Axis::Schedule, Axis::Zero, Axis::Ep];

    fn name(self) -> &'static str {
        match self {
            Axis::Tp => "tp",
            Axis::Pp => "pp",
            Axis::Schedule => "schedule",
            Axis::Zero => "zero stage",
            Axis::Ep => "ep",
        }
    }
}

/// Why one value of an axis lost to the recommendation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AxisVerdict {
    pub axis: &'static str,
    pub value: String,
    /// The best layout with that value (fitting and fastest, else the smallest peak); `None`
    /// when no layout can take it (`search::unreachable_values`).
    pub best: Option<LayoutSummary>,
    pub reason: String,
}

/// The recommended layout (or, when nothing fits, the closest miss) and the verdicts.
#[derive(Clone, Debug)]
pub struct MeshChoice<'a> {
    pub recommended: Option<Layout<'a>>,
    /// When nothing fits: the layout with the smallest peak.
    pub closest: Option<Layout<'a>>,
    pub verdicts: Vec<AxisVerdict>,
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn better<'a>(a: Layout<'a>, b: Layout<'a>) -> Layout<'a> {
    match (a.fits(), b.fits()) {
        (true, false) => a,
        (false, true) => b,
        (true, true) if b.tokens_per_s() > a.tokens_per_s() => b,
        (false, false) if b.peak_bytes() < a.peak_bytes() => b,
        _ => a,
    }
}

/// Sets the best plain data-parallel plan (`plain`, when the pins admit it) beside the mesh
/// plans (ranked by `search::rank_meshes`) and explains each rejected axis value; `world` is
/// the GPU count.
pub fn choose<'a>(
    plain: Option<&'a SearchOutcome>,
    meshes: &'a [MeshPlan],
    world: u64,
) -> MeshChoice<'a> {
    let plain_best = plain.and_then(|o| o.recommended().or(o.closest.as_ref()));
    let mut layouts: Vec<Layout<'a>> = plain_best.map(Layout::Plain).into_iter().collect();
    layouts.extend(meshes.iter().map(Layout::Mesh));
    let fastest_mesh = meshes.iter().find(|m| m.fits);
    let recommended = match (plain_best.filter(|p| p.fits), fastest_mesh) {
        (Some(p), Some(m)) if p.time.step_s <= m.step_s * (1.0 + SAME_SPEED) => {
            Some(Layout::Plain(p))
        }
        (_, Some(m)) => Some(Layout::Mesh(m)),
        (Some(p), None) => Some(Layout::Plain(p)),
        (None, None) => None,
    };
    let closest = match recommended {
        Some(_) => None,
        None => layouts.iter().copied().reduce(better),
    };
    let Some(chosen) = recommended.or(closest) else {
        return MeshChoice {
            recommended,
            closest,
            verdicts: Vec::new(),
        };
    };
    let chosen_summary = chosen.summary(world);
    let mut verdicts = Vec::new();
    for axis in Axis::ALL {
        let mut values: Vec<String> = Vec::new();
        for l in &layouts {
            let v = l.value(axis);
            if v != chosen.value(axis) && !values.contains(&v) {
                values.push(v);
            }
        }
        for value in values {
            let Some(best) = layouts
                .iter()
                .copied()
                .filter(|l| l.value(axis) == value)
                .reduce(better)
            else {
                continue;
            };
            let summary = best.summary(world);
            let reason = if !summary.fits {
                format!(
                    "does not fit: peak {} > usable {}",
                    gib(summary.peak_bytes),
                    gib(summary.usable_bytes)
                )
            } else if !chosen_summary.fits {
                "fits, unlike the closest miss".to_string()
            } else if summary.tokens_per_s > chosen_summary.tokens_per_s {
                format!(
                    "fits and runs {:.0} tokens/s against {:.0}, within {:.0} % of it: plain data parallelism is kept among near-equals",
                    summary.tokens_per_s,
                    chosen_summary.tokens_per_s,
                    SAME_SPEED * 100.0
                )
            } else if summary.tokens_per_s >= chosen_summary.tokens_per_s {
                "as fast; ranked after it on fewer bytes communicated, then the lower peak"
                    .to_string()
            } else {
                format!(
                    "fits but slower: {:.0} tokens/s against {:.0} ({:+.0} %)",
                    summary.tokens_per_s,
                    chosen_summary.tokens_per_s,
                    100.0 * (summary.tokens_per_s / chosen_summary.tokens_per_s - 1.0)
                )
            };
            verdicts.push(AxisVerdict {
                axis: axis.name(),
                value,
                best: Some(summary),
                reason,
            });
        }
    }
    MeshChoice {
        recommended,
        closest,
        verdicts,
    }
}
