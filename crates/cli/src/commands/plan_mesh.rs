//! `headroom plan` on a mesh: the pins of the tensor, pipeline and sequence axes (`MeshArgs`),
//! and the report of the mesh search — the layout chosen, its most loaded rank and why, memory
//! per stage, the bubble, and why each rejected axis value lost — as text and as the `mesh`
//! object of `--json`.
//!
//! Not for: the search (`headroom_plan::mesh`) or the plain data-parallel report
//! (`plan_output`).

use super::plan_output::group_digits;
use clap::Args;
use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::format_bytes;
use headroom_plan::mesh::{Layout, MeshChoice, MeshPins, MeshPlan, MeshSearch};
use headroom_plan::strategy::{PipelineSchedule, parse_flag};
use serde_json::{Value, json};
use std::time::Duration;

/// The mesh axes, pinned; unset ones are searched when the model runs on several GPUs.
#[derive(Debug, Args, Default)]
pub struct MeshArgs {
    /// Tensor-parallel ranks (Megatron-LM's column- and row-parallel linears, each layer's
    /// weights split N ways): searched over the divisors of --gpus-per-node unless pinned. N must
    /// stay within a node and divide the attention and key/value heads; `--tp 1 --pp 1` plans
    /// plain data parallelism only.
    #[arg(long, value_name = "N")]
    pub tp: Option<u64>,
    /// Pipeline stages (the layers split into N consecutive stages, across nodes): searched over
    /// the divisors of the layers unless pinned. N times the schedule's chunks must divide the
    /// layers, and tp·pp the GPUs.
    #[arg(long, value_name = "N")]
    pub pp: Option<u64>,
    /// The pipeline schedule: 1f1b (one forward, one backward; stage i holds p − i micro-batches)
    /// or interleaved:V (V model chunks per stage: the bubble divided by V, stage 0 holding about
    /// (1 + (p − 1)/(p·V)) times the layers' activations; needs m a multiple of pp).
    #[arg(long, value_parser = parse_flag::<PipelineSchedule>, value_name = "SCHEDULE")]
    pub pp_schedule: Option<PipelineSchedule>,
    /// Micro-batches per optimizer step on each data-parallel replica (m; the pipeline's bubble
    /// is (p − 1)/(V·m)): the global batch must equal dp·m·micro-batch.
    #[arg(long, value_name = "M")]
    pub microbatches: Option<u64>,
    /// Sequence parallelism (Korthikanti et al. 2022): the norms' and dropouts' activations
    /// split along the sequence across the tp ranks, at the same communication volume. On
    /// whenever tp > 1 unless pinned off; on needs tp ≥ 2.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub sequence_parallel: Option<bool>,
    /// Context-parallel ranks (PyTorch's context parallelism, as torchtitan runs it for long
    /// sequences): each rank holds 1/N of every sequence's activations and gathers the keys and
    /// values of the whole sequence for each layer's attention. Not searched: 1 unless given.
    /// The sequence length must divide into 2·N load-balanced chunks, and tp·pp·N the GPUs.
    #[arg(long, value_name = "N")]
    pub cp: Option<u64>,
    /// Expert-parallel ranks of a mixture of experts (Mixtral, Qwen-MoE): each holds E/N of
    /// every layer's experts and exchanges tokens with the others in two all-to-alls per layer.
    /// Taken from the data- and context-parallel ranks (N divides dp·cp and the experts);
    /// searched unless pinned.
    #[arg(long, value_name = "N")]
    pub ep: Option<u64>,
    /// Overlap tensor parallelism's communication with the matmuls (Megatron-LM's
    /// --tp-comm-overlap, torchtitan's async TP): the sequence-parallel all-gathers and
    /// reduce-scatters run in chunks under each projection's GEMM, so a layer pays the larger
    /// of the two rather than their sum. Needs tp ≥ 2 with sequence parallelism; torchtitan's
    /// needs --compile. Off unless given, as in both frameworks.
    #[arg(long)]
    pub tp_comm_overlap: bool,
}

fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err("accepted: on, off".into()),
    }
}

impl MeshArgs {
    pub fn pins(&self) -> MeshPins {
        MeshPins {
            tp: self.tp,
            pp: self.pp,
            schedule: self.pp_schedule,
            microbatches: self.microbatches,
            sequence_parallel: self.sequence_parallel,
            cp: self.cp,
            ep: self.ep,
            tp_comm_overlap: self.tp_comm_overlap.then_some(true),
        }
    }
}

/// The mesh search's part of the report.
pub struct MeshReport<'a> {
    pub search: &'a MeshSearch,
    pub choice: MeshChoice<'a>,
    pub world: u64,
    pub elapsed: Duration,
}

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

fn mesh_json(m: &MeshPlan, world: u64) -> Value {
    let mut v = serde_json::to_value(m).unwrap_or(Value::Null);
    v["summary"] = serde_json::to_value(Layout::Mesh(m).summary(world)).unwrap_or(Value::Null);
    v["most_loaded"] = json!({
        "stage": m.peak_stage,
        "rank": m.peak_rank,
        "peak_bytes": m.peak_bytes,
        "why": m.why_peak(),
    });
    v
}

impl MeshReport<'_> {
    /// Whether a mesh (not plain data parallelism) is recommended.
    pub fn recommends_mesh(&self) -> bool {
        matches!(self.choice.recommended, Some(Layout::Mesh(_)))
    }

    pub fn to_json(&self) -> Value {
        let layout = |l: &Option<Layout>| match l {
            Some(Layout::Mesh(m)) => mesh_json(m, self.world),
            Some(p @ Layout::Plain(_)) => {
                serde_json::to_value(p.summary(self.world)).unwrap_or(Value::Null)
            }
            None => Value::Null,
        };
        json!({
            "evaluated": self.search.evaluated,
            "fitting": self.search.plans.iter().filter(|p| p.fits).count(),
            "seconds": self.elapsed.as_secs_f64(),
            "recommended_layout": match self.choice.recommended {
                Some(Layout::Mesh(_)) => "mesh",
                Some(Layout::Plain(_)) => "data-parallel",
                None => "none",
            },
            "recommended": layout(&self.choice.recommended),
            "closest": layout(&self.choice.closest),
            "rejected_axes": self.choice.verdicts,
        })
    }

    /// The recommended mesh: layout, speed, most loaded rank, memory per stage.
    pub fn recommended_text(&self, m: &MeshPlan) -> String {
        let s = Layout::Mesh(m).summary(self.world);
        let mut out = format!(
            "Recommended mesh: {} · ZeRO-{} across dp · checkpoint {} · micro-batch {}\n",
            s.layout, s.zero_stage, s.checkpoint, s.micro_batch
        );
        out += &format!(
            "  {:.2} s per step, {} tokens/s, MFU {:.0}%, bubble {:.1}% ((p − 1)/(v·m)); per step: compute {:.2} s, TP {:.2} s, {}PP {:.2} s, exposed DP {:.2} s\n",
            m.step_s,
            group_digits(m.tokens_per_s.round() as u64),
            100.0 * m.mfu,
            100.0 * m.bubble,
            m.compute_s,
            m.tp_s,
            [("CP", m.mesh.cp, m.cp_s), ("EP", m.mesh.ep, m.ep_s)]
                .iter()
                .filter(|(_, ranks, _)| *ranks > 1)
                .map(|(name, _, s)| format!("{name} {s:.2} s, "))
                .collect::<String>(),
            m.pp_s,
            m.dp_exposed_s
        );
        out += &format!(
            "  Most loaded rank: {}; peak {} of {} usable\n",
            m.why_peak(),
            format_bytes(m.peak_bytes),
            format_bytes(m.usable_bytes)
        );
        out += &stages_table(m);
        out
    }

    /// Why each value of an axis the recommendation did not take lost.
    pub fn verdicts_text(&self) -> String {
        if self.choice.verdicts.is_empty() {
            return String::new();
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Disabled);
        t.set_header([
            "axis",
            "value",
            "best layout with it",
            "zero",
            "ckpt",
            "mb",
            "peak GiB",
            "tokens/s",
            "why it lost",
        ]);
        for v in &self.choice.verdicts {
            let mut row = vec![v.axis.to_string(), v.value.clone()];
            match &v.best {
                Some(b) => row.extend([
                    b.layout.clone(),
                    b.zero_stage.to_string(),
                    b.checkpoint.clone(),
                    b.micro_batch.to_string(),
                    gib(b.peak_bytes),
                    group_digits(b.tokens_per_s.round() as u64),
                ]),
                None => row.extend(
                    ["none possible".to_string()]
                        .into_iter()
                        .chain(std::iter::repeat_n("".to_string(), 5)),
                ),
            }
            row.push(v.reason.clone());
            t.add_row(row);
        }
        format!("Why each rejected axis value lost:\n{t}\n")
    }

    /// The mesh part of the text report.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "Meshes    {} tp × pp × dp layouts with their levers searched in {:.1} ms; {} fit\n",
            group_digits(self.search.evaluated as u64),
            self.elapsed.as_secs_f64() * 1e3,
            group_digits(self.search.plans.iter().filter(|p| p.fits).count() as u64)
        );
        match self.choice.recommended {
            Some(Layout::Mesh(m)) => out += &self.recommended_text(m),
            Some(Layout::Plain(_)) => {
                out += "Recommended layout: plain data parallelism (plan 1 above).\n";
            }
            None => {
                if let Some(Layout::Mesh(m)) = self.choice.closest {
                    out += "No layout fits; the closest is a mesh:\n";
                    out += &self.recommended_text(m);
                } else {
                    out += "No layout fits; the closest is plain data parallelism (above).\n";
                }
            }
        }
        out += &self.verdicts_text();
        out
    }
}

/// Memory per pipeline stage (first, peak and last stages and their neighbours when there are
/// many).
fn stages_table(m: &MeshPlan) -> String {
    let n = m.stages.len();
    let shown: Vec<usize> = if n <= 8 {
        (0..n).collect()
    } else {
        let mut v = vec![0, 1, m.peak_stage as usize, n - 2, n - 1];
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t.set_header([
        "stage",
        "layers",
        "in flight",
        "states GiB",
        "activations GiB",
        "buffers GiB",
        "peak GiB",
    ]);
    for i in shown {
        let st = &m.stages[i];
        let mark = if st.stage == m.peak_stage { " *" } else { "" };
        t.add_row([
            format!("{}{mark}", st.stage),
            st.layers.to_string(),
            format!("{}", st.in_flight),
            gib(st.model_states_bytes),
            gib(st.activation_bytes),
            gib(st.buffer_bytes),
            gib(st.peak_bytes),
        ]);
    }
    let note = if n > 8 {
        format!(" ({n} stages; the first, last, most loaded and their neighbours shown)")
    } else {
        String::new()
    };
    format!(
        "Memory per stage, one GPU each (* most loaded; peak = (states + activations + buffers) × (1 + fragmentation) + CUDA context){note}:\n{t}\n"
    )
}
