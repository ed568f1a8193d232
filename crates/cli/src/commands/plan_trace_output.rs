//! The report of `headroom plan --trace`: one row per traced setting (its levers, the replayed
//! allocated and reserved peaks, whether it fits, the speed model's tokens/s), ranked as `plan`
//! ranks, the recommendation, and the same as one JSON object.
//!
//! Not for: tracing or ranking (`plan_trace`).

use super::plan_trace_variants::Variant;
use headroom_memory::size::format_bytes;
use headroom_plan::cost::{Problem, StepTime};
use std::cmp::Ordering;

/// What a setting's reserved peak is held against.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Device bytes a plan may use (`--device-memory`, or the GPU's memory less the margin).
    pub bytes: u64,
    /// The CUDA context, outside the caching allocator, added to the reserved peak.
    pub context: u64,
    /// Whether `bytes` is `--device-memory` (the reserved bytes alone) or the GPU's.
    pub explicit: bool,
}

/// One traced setting.
#[derive(Clone, Debug)]
pub struct Row {
    pub variant: Variant,
    /// (allocated, reserved) peaks of the replayed trace, or why it could not be traced.
    pub peaks: Result<(u64, u64), String>,
    pub budget: Budget,
    pub time: StepTime,
    pub tier: u8,
}

impl Row {
    /// The device bytes at the peak: the reserved peak plus the CUDA context.
    pub fn device_peak(&self) -> Option<u64> {
        self.peaks
            .as_ref()
            .ok()
            .map(|&(_, reserved)| reserved + self.budget.context)
    }

    pub fn fits(&self) -> bool {
        self.device_peak().is_some_and(|p| p <= self.budget.bytes)
    }

    /// `plan`'s order of fitting plans: fidelity tier, tokens/s, then the lower peak, then the
    /// larger micro-batch.
    pub fn rank(&self, other: &Row) -> Ordering {
        self.tier
            .cmp(&other.tier)
            .then(
                other
                    .time
                    .tokens_per_s
                    .partial_cmp(&self.time.tokens_per_s)
                    .unwrap_or(Ordering::Equal),
            )
            .then(self.device_peak().cmp(&other.device_peak()))
            .then(other.variant.micro_batch.cmp(&self.variant.micro_batch))
    }

    fn levers(&self) -> [String; 4] {
        let v = &self.variant;
        [
            v.precision.to_string(),
            v.checkpoint.to_string(),
            format!("{} × {}", v.micro_batch, v.accumulation),
            match v.ranks {
                1 => v.optimizer_impl.to_string(),
                _ if v.zero.number() == 0 => format!("{}, DDP", v.optimizer_impl),
                _ => format!("{}, ZeRO-{}", v.optimizer_impl, v.zero.number()),
            },
        ]
    }
}

/// The rows in report order: the recommendation, the other fitting ones ranked, then those
/// over the budget by device peak, then those that could not be traced.
fn order(rows: &[Row], recommended: Option<usize>) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..rows.len()).collect();
    idx.sort_by(|&a, &b| {
        let (ra, rb) = (&rows[a], &rows[b]);
        (Some(b) == recommended)
            .cmp(&(Some(a) == recommended))
            .then(rb.fits().cmp(&ra.fits()))
            .then(rb.peaks.is_ok().cmp(&ra.peaks.is_ok()))
            .then(if ra.fits() {
                ra.rank(rb)
            } else {
                ra.device_peak().cmp(&rb.device_peak())
            })
    });
    idx
}

pub fn print_text(
    rows: &[Row],
    recommended: Option<usize>,
    problem: &Problem,
    budget: &Budget,
    title: &str,
    top: usize,
) {
    println!("{title} on {}.", problem.hardware.gpu.name);
    if budget.explicit {
        println!(
            "Budget: --device-memory {} for the caching allocator's reserved bytes.",
            format_bytes(budget.bytes)
        );
    } else {
        println!(
            "Budget: {} usable ({} × (1 − margin {})), of which the CUDA context takes {}.",
            format_bytes(budget.bytes),
            format_bytes(problem.hardware.gpu.memory_bytes),
            problem.cost.margin,
            format_bytes(budget.context)
        );
    }
    println!();
    let header = [
        "precision",
        "checkpoint",
        "micro × acc",
        "optimizer",
        "allocated",
        "reserved",
        "fits",
        "tokens/s",
    ];
    let mut table: Vec<[String; 8]> = Vec::new();
    let ordered = order(rows, recommended);
    let shown = top.max(1).min(ordered.len());
    for &i in &ordered[..shown] {
        let r = &rows[i];
        let [p, c, m, o] = r.levers();
        let (alloc, reserved, fits) = match &r.peaks {
            Ok((a, res)) => (
                format_bytes(*a),
                format_bytes(*res),
                if r.fits() { "yes" } else { "no" }.to_string(),
            ),
            Err(_) => ("-".into(), "-".into(), "error".into()),
        };
        table.push([
            p,
            c,
            m,
            o,
            alloc,
            reserved,
            fits,
            format!("{:.0}", r.time.tokens_per_s),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|k| {
            table
                .iter()
                .map(|row| row[k].chars().count())
                .chain([header[k].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[&str]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
    };
    println!("  {}", line(&header));
    for (k, cells) in table.iter().enumerate() {
        let mark = if Some(ordered[k]) == recommended {
            "→"
        } else {
            " "
        };
        let refs: Vec<&str> = cells.iter().map(String::as_str).collect();
        println!("{mark} {}", line(&refs).trim_end());
    }
    if shown < rows.len() {
        println!("  … {} more (--top {})", rows.len() - shown, rows.len());
    }
    for r in rows {
        if let Err(e) = &r.peaks {
            let [p, c, m, o] = r.levers();
            println!("not traced: {p}, checkpoint {c}, {m}, {o}: {e}");
        }
    }
    println!();
    match recommended {
        Some(i) => {
            let r = &rows[i];
            let [p, c, m, _] = r.levers();
            let o = match r.variant.ranks {
                1 => format!("{} AdamW", r.variant.optimizer_impl),
                n if r.variant.zero.number() == 0 => {
                    format!("{} AdamW, DDP on {n} GPUs", r.variant.optimizer_impl)
                }
                n => format!(
                    "{} AdamW, FSDP2 ZeRO-{} on {n} GPUs",
                    r.variant.optimizer_impl,
                    r.variant.zero.number()
                ),
            };
            let context = if budget.explicit {
                String::new()
            } else {
                format!(" + CUDA context {}", format_bytes(budget.context))
            };
            println!(
                "Recommended: {p}, checkpoint {c}, micro-batch {m}, {o}: reserved peak {}{context} of {}, {:.0} tokens/s predicted.",
                format_bytes(r.peaks.as_ref().map_or(0, |p| p.1)),
                format_bytes(budget.bytes),
                r.time.tokens_per_s
            );
        }
        None => println!("No traced setting fits."),
    }
}

pub fn to_json(
    rows: &[Row],
    recommended: Option<usize>,
    configured: &Variant,
    problem: &Problem,
    budget: &Budget,
    title: &str,
) -> serde_json::Value {
    let variant = |v: &Variant| {
        serde_json::json!({
            "precision": v.precision.to_string(),
            "checkpoint": v.checkpoint.to_string(),
            "micro_batch": v.micro_batch,
            "accumulation": v.accumulation,
            "optimizer_impl": v.optimizer_impl.to_string(),
            "attention": v.attention.to_string(),
            "ranks": v.ranks,
            "zero": v.zero.number(),
        })
    };
    let ordered = order(rows, recommended);
    serde_json::json!({
        "title": title,
        "gpu": problem.hardware.gpu.name,
        "budget_bytes": budget.bytes,
        "cuda_context_bytes": budget.context,
        "configured": variant(configured),
        "recommended": recommended.map(|i| ordered.iter().position(|&k| k == i)),
        "variants": ordered.iter().map(|&i| {
            let r = &rows[i];
            let mut v = variant(&r.variant);
            match &r.peaks {
                Ok((a, res)) => {
                    v["allocated_peak_bytes"] = (*a).into();
                    v["reserved_peak_bytes"] = (*res).into();
                    v["device_peak_bytes"] = r.device_peak().into();
                }
                Err(e) => v["error"] = e.clone().into(),
            }
            v["fits"] = r.fits().into();
            v["fidelity_tier"] = r.tier.into();
            v["step_s"] = r.time.step_s.into();
            v["tokens_per_s"] = r.time.tokens_per_s.into();
            v
        }).collect::<Vec<_>>(),
    })
}
