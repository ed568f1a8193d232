//! `headroom plan --trace MODEL`: the levers of the user's own PyTorch program as re-traces.
//! Every setting of precision (fp32, bf16 autocast, fp16 autocast with a GradScaler, pure
//! bf16), activation checkpointing (none,
//! Hugging Face's of every block), micro-batch (the powers of two that divide the global batch,
//! the rest accumulated) and AdamW's implementation (foreach, fused, for-loop), with a LoRA
//! fine-tune through peft under --lora-rank, is traced by one Python process
//! (`python -m headroom.trace.sweep`), each trace replayed through the caching allocator, and
//! each setting timed by the planner's speed model for the equivalent strategy
//! (`headroom_plan::cost::time`). The ranking is `plan`'s: what fits first, then the fidelity
//! tier, then tokens/s; among the plans within 5 % of the fastest the one that changes the
//! fewest levers of the plain configuration (fp32, no checkpointing, the whole batch in one
//! micro-batch, foreach) is recommended (`headroom_plan::search`).
//!
//! On several GPUs (`--gpus-per-node`, `--nodes`) each setting is one rank of a data-parallel
//! run: FSDP2 under PyTorch's fake process group (`headroom.trace(fsdp=N)`) at ZeRO-3
//! (`fully_shard`'s `reshard_after_forward=True`) and ZeRO-2 (`False`), and DDP with its
//! gradient buckets (`headroom.trace(ddp=True)`) at ZeRO-0; the global batch is split over the
//! ranks.
//!
//! Not for: the settings themselves (`plan_trace_variants`), the tracer's rules (Python), the
//! analytical search (`plan`), or ZeRO-1 (not traced).

use super::plan_args::PlanArgs;
use super::plan_emit::{default_framework, write_emits};
use super::plan_hardware::build_hardware;
use super::plan_trace_context as context;
use super::plan_trace_output::{Budget, Row, print_text, to_json};
use super::plan_trace_sweep::trace_peaks;
use super::plan_trace_variants::{Variant, variants};
use anyhow::{Context, Result, bail};
use headroom_plan::cost::{CostModel, Problem, evaluate, sdpa, time};
use headroom_plan::search::SAME_SPEED;
use headroom_plan::strategy::{BaseWeights, LossImpl};
use headroom_plan::workload::{BatchSpec, Workload};
use headroom_train::models::hugging_face_model;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Index of the recommended row: among those that fit, the best fidelity tier, then the
/// fastest; within [`SAME_SPEED`] of it, the fewest levers changed from `configured`.
pub fn recommend(rows: &[Row], configured: &Variant) -> Option<usize> {
    let mut fitting: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].fits()).collect();
    fitting.sort_by(|&a, &b| rows[a].rank(&rows[b]));
    let best = &rows[*fitting.first()?];
    let (tier, limit) = (best.tier, best.time.step_s * (1.0 + SAME_SPEED));
    fitting
        .iter()
        .enumerate()
        .filter(|(_, i)| rows[**i].tier == tier && rows[**i].time.step_s <= limit)
        .min_by_key(|(k, i)| (rows[**i].variant.changes(configured), *k))
        .map(|(_, i)| *i)
}

pub fn run(args: &PlanArgs, traced: &str, emits: &[(String, PathBuf)]) -> Result<()> {
    let hw = build_hardware(args)?;
    let ranks = hw.world_size();
    let arch_source = match &args.model {
        Some(m) => m.clone(),
        None if traced.contains(':') && !Path::new(traced).exists() => bail!(
            "--trace {traced} is a model factory; give --model CONFIG.json, the Hugging Face config the planner's speed model reads"
        ),
        None if Path::new(traced).is_dir() => {
            Path::new(traced).join("config.json").display().to_string()
        }
        None => traced.to_string(),
    };
    let spec =
        hugging_face_model(&arch_source).with_context(|| format!("--model {arch_source}"))?;
    let Some(seq_len) = args.seq_len else {
        bail!("--seq-len is required with --trace (e.g. --seq-len 2048)");
    };
    let (micro_batch, accumulation) = args.split();
    let global = match (args.global_batch, args.global_batch_tokens) {
        (Some(b), _) => b,
        (None, Some(t)) if t.is_multiple_of(seq_len) && t > 0 => t / seq_len,
        (None, Some(t)) => {
            bail!("--global-batch-tokens {t} is not a multiple of --seq-len {seq_len}")
        }
        (None, None) => micro_batch.unwrap_or(1) * accumulation.unwrap_or(1),
    };
    if global == 0 {
        bail!("the global batch is 0 samples; accepted: at least 1");
    }
    let lora = match args.lora()? {
        Some(_) if args.lora_targets.is_some() => bail!(
            "--lora-targets is not traced yet: with --trace, peft adapts its default modules for the model type"
        ),
        Some(l) if l.base != BaseWeights::default() => {
            bail!("--lora-base nf4 is not traced yet (bitsandbytes needs a GPU)")
        }
        other => other,
    };
    let (variants, configured) = variants(args, global, ranks)?;

    let mut cost = CostModel::default();
    if let Some(m) = args.margin {
        if !(0.0..1.0).contains(&m) {
            bail!("--margin {m} is out of range; accepted: a fraction in [0, 1)");
        }
        cost.margin = m;
    }
    if let Some(e) = args.efficiency {
        cost.efficiency = Some(e);
    }
    let mut workload = Workload::new(&spec, seq_len, BatchSpec::Samples(global), None, None, 1)?;
    if let Some(l) = lora.clone() {
        workload = workload.with_lora(&spec, l)?;
    }
    let framework = args.framework.unwrap_or_else(|| default_framework(emits));
    let problem = Problem::new(spec, hw, workload, cost)
        .with_framework(framework)
        .with_loss_impl(LossImpl::HuggingFace)
        .with_compile(args.compile);
    let budget = match args.device_memory {
        Some(b) => Budget {
            bytes: b.0,
            context: 0,
            explicit: true,
        },
        None => Budget {
            bytes: problem.usable_device_bytes(),
            context: problem.hardware.cuda_context_bytes,
            explicit: false,
        },
    };

    let lora_settings = lora.as_ref().map(|l| (l.rank, l.alpha));
    let settings: Vec<serde_json::Value> = variants
        .iter()
        .map(|v| v.tracer_settings(lora_settings))
        .collect();
    eprintln!("tracing {} settings of {traced}", variants.len());
    let started = Instant::now();
    let traced_peaks = trace_peaks(traced, seq_len, args.trace_steps, &settings)?;
    let has_attention = problem.spec.has_attention();
    let mut rows = Vec::new();
    for (variant, peaks) in variants.iter().zip(traced_peaks) {
        let strategy = variant.strategy(has_attention);
        let timed = problem.clone().with_optimizer_impl(variant.optimizer_impl);
        let (on, run) = sdpa::as_run(&timed, &strategy);
        rows.push(Row {
            variant: *variant,
            peaks,
            budget,
            time: time::predict(&on, &run),
            tier: strategy.fidelity_tier(),
        });
    }
    let traced_s = started.elapsed().as_secs_f64();
    if rows.iter().all(|r| r.peaks.is_err()) {
        let first = rows[0].peaks.as_ref().err().cloned().unwrap_or_default();
        bail!("no setting could be traced: {first}");
    }
    let recommended = recommend(&rows, &configured);
    let title = format!(
        "{} settings of {traced} traced in {traced_s:.1} s (seq {seq_len}, global batch {global}{})",
        rows.len(),
        lora.as_ref()
            .map_or(String::new(), |l| format!(", LoRA rank {}", l.rank))
    );
    // A learned position table (GPT-2's `n_positions`) cannot be read past its end; a rotary
    // model's trained length bounds what its quality was measured on.
    let limit = problem
        .spec
        .max_learned_positions
        .or(problem.spec.trained_context);
    let probes = match recommended {
        Some(best) if args.max_context => context::probe(
            traced,
            args.trace_steps,
            &rows[best],
            lora_settings,
            &context::lengths(seq_len, limit),
        )?,
        _ => Vec::new(),
    };
    if args.json {
        let mut v = to_json(&rows, recommended, &configured, &problem, &budget, &title);
        if args.max_context {
            v["max_context"] = context::to_json(seq_len, &probes);
        }
        crate::json_out::print_json(&v)?;
    } else {
        print_text(&rows, recommended, &problem, &budget, &title, args.top);
        if args.max_context && recommended.is_some() {
            print!("{}", context::to_text(seq_len, limit, &probes));
        }
    }
    let Some(best) = recommended else {
        bail!(
            "no traced setting fits: the smallest reserved peak is over the budget (see the table)"
        );
    };
    let row = &rows[best];
    let timed = problem
        .clone()
        .with_optimizer_impl(row.variant.optimizer_impl);
    let plan = headroom_plan::cost::Plan {
        fits: true,
        ..evaluate(&timed, &row.variant.strategy(has_attention))
    };
    write_emits(&timed, &plan, emits, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_plan::cost::StepTime;
    use headroom_plan::strategy::{Attention, Checkpoint, OptimizerImpl, Precision, ZeroStage};

    const BUDGET: Budget = Budget {
        bytes: 1000,
        context: 100,
        explicit: false,
    };

    fn row(precision: Precision, checkpoint: Checkpoint, reserved: u64, step_s: f64) -> Row {
        let variant = Variant {
            precision,
            checkpoint,
            micro_batch: 2,
            accumulation: 1,
            optimizer_impl: OptimizerImpl::Foreach,
            attention: Attention::MemoryEfficient,
            ranks: 1,
            zero: ZeroStage::default(),
        };
        Row {
            variant,
            peaks: Ok((reserved, reserved)),
            budget: BUDGET,
            time: StepTime {
                step_s,
                tokens_per_s: 1.0 / step_s,
                ..StepTime::default()
            },
            tier: variant.strategy(true).fidelity_tier(),
        }
    }

    #[test]
    fn recommends_the_fewest_changes_within_five_percent_of_the_fastest_fitting() {
        let configured = row(Precision::Fp32, Checkpoint::None, 0, 1.0).variant;
        let mut rows = vec![
            // The configuration itself: 800 reserved + 100 context ≤ 1000 fits.
            row(Precision::Fp32, Checkpoint::None, 800, 1.00),
            // One lever changed, 1/0.97 = 3.1 % faster: within 5 %, so not worth the change.
            row(Precision::Bf16Mixed, Checkpoint::None, 700, 0.97),
            // Faster still but over the budget: 950 + 100 > 1000.
            row(Precision::Bf16Mixed, Checkpoint::ALL_BLOCKS, 950, 0.90),
            // Pure bf16 is the next fidelity tier: ranked after any tier-0 plan that fits.
            row(Precision::Bf16, Checkpoint::None, 500, 0.50),
        ];
        assert!(!rows[2].fits() && rows[3].tier == 1);
        assert_eq!(recommend(&rows, &configured), Some(0));
        // 1/0.90 = 11 % faster is more than 5 %: the faster plan wins.
        rows[1].time.step_s = 0.90;
        assert_eq!(recommend(&rows, &configured), Some(1));
        // Nothing of tier 0 fits: the tier-1 plan is the recommendation.
        rows[0].peaks = Ok((950, 950));
        rows[1].peaks = Err("untraceable".into());
        assert_eq!(recommend(&rows, &configured), Some(3));
        rows[3].peaks = Ok((901, 901));
        assert_eq!(recommend(&rows, &configured), None);
    }
}
