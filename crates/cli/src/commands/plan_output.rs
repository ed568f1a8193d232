//! Rendering of `headroom plan`: the text report (model, hardware, ranked table with the
//! per-category breakdown, the recommendation and its reasons, or the shortfall) and the JSON
//! object of `--json`.

use comfy_table::{ContentArrangement, Table, presets::UTF8_FULL_CONDENSED};
use headroom_memory::{Category, CategoryBytes, format_bytes};
use headroom_plan::advice::{Shortfall, explain, shortfall};
use headroom_plan::calibrate::Calibration;
use headroom_plan::cost::{Plan, Problem};
use headroom_plan::model::ParamInventory;
use headroom_plan::search::SearchOutcome;
use headroom_plan::strategy::Pins;
use serde_json::{Value, json};
use std::time::Duration;

/// Everything the plan command prints.
pub struct Report<'a> {
    problem: &'a Problem,
    outcome: &'a SearchOutcome,
    elapsed: Duration,
    shown: Vec<&'a Plan>,
    reasons: Vec<String>,
    shortfall: Option<Shortfall>,
    largest_layer: (String, u64),
    warnings: Vec<String>,
    calibration: Option<Calibration>,
}

impl<'a> Report<'a> {
    pub fn new(
        problem: &'a Problem,
        pins: &Pins,
        outcome: &'a SearchOutcome,
        elapsed: Duration,
        top: usize,
    ) -> Report<'a> {
        let shown = shown_plans(outcome, top);
        let reasons = outcome
            .recommended()
            .map(|p| explain(problem, p))
            .unwrap_or_default();
        let shortfall = match (outcome.recommended(), &outcome.closest) {
            (None, Some(closest)) => Some(shortfall(problem, pins, closest)),
            _ => None,
        };
        let inv = ParamInventory::of(&problem.spec);
        let (name, params) = inv.largest_layer();
        Report {
            problem,
            outcome,
            elapsed,
            shown,
            reasons,
            shortfall,
            largest_layer: (name.to_string(), params),
            warnings: Vec::new(),
            calibration: None,
        }
    }

    /// What `--calibrate` changed, shown under the workload and as `calibration` in the JSON.
    pub fn with_calibration(mut self, calibration: Option<Calibration>) -> Report<'a> {
        self.calibration = calibration;
        self
    }

    /// Warnings about the inputs (also printed on stderr), listed under `warnings` in the JSON.
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Report<'a> {
        self.warnings = warnings;
        self
    }

    /// Bytes the closest plan lacks per GPU (0 when a plan fits).
    /// What the closest plan lacks, in words (see `Shortfall::missing_text`).
    pub fn missing_text(&self) -> String {
        self.shortfall
            .as_ref()
            .map_or_else(|| "memory".into(), |s| s.missing_text())
    }

    pub fn to_json(&self) -> Value {
        let p = self.problem;
        let spec = &p.spec;
        let mut hardware = serde_json::to_value(&p.hardware).unwrap_or(Value::Null);
        hardware["world_size"] = json!(p.hardware.world_size());
        let mut workload = serde_json::to_value(&p.workload).unwrap_or(Value::Null);
        workload["tokens_per_step"] = json!(p.workload.tokens_per_step());
        json!({
            "model": {
                "name": spec.name,
                "model_type": spec.family.model_type(),
                "params": p.facts.params,
                "largest_layer": { "name": self.largest_layer.0, "params": self.largest_layer.1 },
                "layers": spec.total_blocks(),
                "hidden_size": spec.hidden_size,
                "vocab_size": spec.vocab_size,
            },
            "hardware": hardware,
            "workload": workload,
            "cost_model": p.cost,
            "framework": p.framework,
            "optimizer_impl": p.optimizer_impl,
            "compile": p.compile,
            "search": {
                "evaluated": self.outcome.evaluated,
                "fitting": self.outcome.fitting.len(),
                "seconds": self.elapsed.as_secs_f64(),
            },
            "plans": self.shown,
            "recommended": self.outcome.recommended(),
            "advice": self.reasons,
            "shortfall": self.shortfall,
            "warnings": self.warnings,
            "calibration": self.calibration,
        })
    }

    pub fn to_text(&self) -> String {
        let mut out = self.header_text();
        out += &self.plans_text();
        out
    }

    /// The model, hardware, workload and layout lines.
    pub fn header_text(&self) -> String {
        let p = self.problem;
        let hw = &p.hardware;
        let spec = &p.spec;
        let mut out = format!(
            "Model     {} ({}): {} parameters; largest layer {} ({})\n",
            spec.name,
            spec.family.model_type(),
            group_digits(p.facts.total_params),
            self.largest_layer.0,
            group_digits(self.largest_layer.1)
        );
        if let (Some(lora), Some(counts)) = (&p.workload.lora, &p.facts.lora) {
            out += &format!(
                "Fine-tune {lora}: {} trainable parameters in {} adapters ({:.3} %), the base frozen{}\n",
                group_digits(counts.trainable),
                counts.adapted_modules,
                100.0 * counts.trainable as f64 / p.facts.total_params.max(1) as f64,
                match counts.frozen_nf4 {
                    0 => String::new(),
                    n => format!(
                        "; {} block weights in NF4 ({})",
                        group_digits(n),
                        format_bytes(counts.frozen_nf4_bytes)
                    ),
                }
            );
        }
        out += &format!(
            "Hardware  {} × {} ({} per node × {} node{}), {} each, {} usable\n",
            hw.world_size(),
            hw.gpu.name,
            hw.gpus_per_node,
            hw.nodes,
            if hw.nodes == 1 { "" } else { "s" },
            format_bytes(hw.gpu.memory_bytes),
            format_bytes(p.usable_device_bytes())
        );
        if let Some(c) = &self.calibration {
            out += &calibration_text(c);
        }
        out += &format!(
            "Workload  seq {} × global batch {} = {} tokens per step\n",
            p.workload.seq_len,
            p.workload.global_batch,
            group_digits(p.workload.tokens_per_step())
        );
        out += &format!(
            "Layout    {} ({}), {} optimizer step, {}{}{}\n",
            p.framework,
            match p.framework {
                headroom_plan::strategy::Framework::DeepSpeed => {
                    "16-bit model, fp32 master weights and states, modules gathered one by one"
                }
                headroom_plan::strategy::Framework::Fsdp => {
                    "fp32 parameters as the master copy, fp32 gradients, blocks gathered whole"
                }
            },
            p.optimizer_impl,
            match p.compile {
                true => "compiled (torch.compile)",
                false => "eager",
            },
            match p.zero_grad {
                headroom_plan::strategy::ZeroGrad::SetToNone => "",
                headroom_plan::strategy::ZeroGrad::ZeroFill => {
                    ", gradients zero-filled between steps (held through each step)"
                }
            },
            match p.spec.outputs_kept {
                true => ", the loop keeps the model's output into the next step",
                false => "",
            }
        );
        out
    }

    /// The search's count, the ranked table and the recommendation or the shortfall.
    pub fn plans_text(&self) -> String {
        let mut out = String::new();
        out += &format!(
            "Searched  {} strategies in {:.1} ms; {} fit\n\n",
            group_digits(self.outcome.evaluated as u64),
            self.elapsed.as_secs_f64() * 1e3,
            group_digits(self.outcome.fitting.len() as u64)
        );
        out += &self.table();
        out += "\n";
        match (self.outcome.recommended(), &self.shortfall) {
            (Some(best), _) => {
                out += &format!(
                    "Recommended: plan 1 — {:.2} s per step, {} tokens/s, MFU {:.0}%, peak {} per GPU\n",
                    best.time.step_s,
                    group_digits(best.time.tokens_per_s.round() as u64),
                    100.0 * best.time.mfu,
                    format_bytes(best.memory.per_device_peak_bytes)
                );
                for r in &self.reasons {
                    out += &format!("  - {r}\n");
                }
            }
            (None, Some(short)) => {
                out += &format!(
                    "Nothing fits: the closest plan (shown) needs {}.\n",
                    short.missing_text()
                );
                if short.suggestions.is_empty() {
                    out += "  No single change among more GPUs, a larger GPU, offload or a shorter sequence makes it fit.\n";
                }
                for s in &short.suggestions {
                    out += &format!("  - {s}\n");
                }
            }
            (None, None) => {}
        }
        out
    }

    fn table(&self) -> String {
        plans_table(&plan_rows(&self.shown, true), "GPU")
    }
}

/// The plans a report shows: the best `top` that fit, or the closest miss when none does.
/// The lines that say what a calibration changed.
fn calibration_text(c: &Calibration) -> String {
    let mut out = format!(
        "Calibrated to {:.0} measured tokens/s{} (the default model predicted {:.0}): efficiency {:.3} -> {:.3}",
        c.measured_tokens_per_s,
        c.source
            .as_ref()
            .map(|s| format!(" from {s}"))
            .unwrap_or_default(),
        c.predicted_tokens_per_s,
        c.efficiency_before,
        c.efficiency_after
    );
    match (c.measured_peak_allocated_bytes, &c.memory_note) {
        (Some(peak), None) => {
            out += &format!(
                "; peak allocated {} measured, {} predicted: activations × {:.3}",
                format_bytes(peak),
                format_bytes(c.predicted_peak_allocated_bytes),
                c.activation_scale
            )
        }
        (_, Some(note)) => out += &format!("; {note}"),
        (None, None) => {}
    }
    out + "\n"
}

pub fn shown_plans(outcome: &SearchOutcome, top: usize) -> Vec<&Plan> {
    if outcome.fitting.is_empty() {
        outcome.closest.iter().collect()
    } else {
        outcome.fitting.iter().take(top.max(1)).collect()
    }
}

/// One row per plan; `has_attention` false shows "-" for a model without attention.
pub fn plan_rows(plans: &[&Plan], has_attention: bool) -> Vec<PlanRow> {
    plans
        .iter()
        .map(|plan| {
            let s = &plan.strategy;
            PlanRow {
                fits: plan.fits,
                strategy: [
                    s.precision.to_string(),
                    s.optimizer.to_string(),
                    s.placement.zero_stage.to_string(),
                    format!(
                        "{}/{}/{}",
                        s.placement.offload_optimizer,
                        s.placement.offload_params,
                        s.placement.offload_activations
                    ),
                    s.checkpoint.to_string(),
                    if has_attention {
                        s.attention.to_string()
                    } else {
                        "-".to_string()
                    },
                    s.loss.to_string(),
                    format!("{}×{}", s.micro_batch, s.accumulation),
                ],
                by_category: plan.memory.breakdown.at_peak,
                peak: plan.memory.per_device_peak_bytes,
                step_s: plan.time.step_s,
                tokens_per_s: plan.time.tokens_per_s,
            }
        })
        .collect()
}

/// One row of a table of plans.
pub struct PlanRow {
    pub fits: bool,
    /// precision, optimizer, ZeRO stage, offload optimizer/params/activations, checkpoint, attention, loss,
    /// micro-batch × accumulation.
    pub strategy: [String; 8],
    pub by_category: CategoryBytes,
    pub peak: u64,
    pub step_s: f64,
    pub tokens_per_s: f64,
}

/// Plans with their bytes per category at the peak, in GiB or (for small peaks) MiB.
pub fn plans_table(rows: &[PlanRow], device: &str) -> String {
    let largest = rows.iter().map(|r| r.peak).max().unwrap_or(0);
    let (unit, scale) = if largest >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    };
    let amount = |bytes: u64| format!("{:.2}", bytes as f64 / scale);
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    let mut header: Vec<String> = [
        "#",
        "fits",
        "precision",
        "optimizer",
        "zero",
        "offload o/p/a",
        "ckpt",
        "attention",
        "loss",
        "mb×acc",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for c in Category::ALL {
        header.push(short_name(c).to_string());
    }
    header.extend([
        format!("peak {unit}"),
        "step s".to_string(),
        "tokens/s".to_string(),
    ]);
    t.set_header(header);
    for (i, r) in rows.iter().enumerate() {
        let mut row = vec![
            (i + 1).to_string(),
            if r.fits { "yes".into() } else { "no".into() },
        ];
        row.extend(r.strategy.iter().cloned());
        for c in Category::ALL {
            row.push(amount(r.by_category[c]));
        }
        row.push(amount(r.peak));
        row.push(format!("{:.3}", r.step_s));
        row.push(group_digits(r.tokens_per_s.round() as u64));
        t.add_row(row);
    }
    format!("Per-{device} bytes at the peak, {unit} (categories sum to the peak):\n{t}\n")
}

fn short_name(c: Category) -> &'static str {
    match c {
        Category::Parameter => "param",
        Category::Gradient => "grad",
        Category::MasterWeight => "master",
        Category::OptimizerState => "optim",
        Category::Activation => "activ",
        Category::Temporary => "temp",
        Category::Input => "input",
        Category::Communication => "comm",
        Category::Other => "other",
    }
}

/// `1234567` → `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}
