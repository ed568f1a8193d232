//! `headroom plan` for headroom's own models (a preset such as `gpt-small`, or a model TOML):
//! every strategy the engine runs is dry-run on the real allocator within the device budget
//! (`--device-memory`, or a GPU preset's memory less its CUDA context) and timed by the
//! measured speed model; the output has the planner's shape (text tables and `--json`).
//!
//! Not for: Hugging Face models (the analytical planner in `plan`).

use super::plan_args::PlanArgs;
use super::plan_output::{group_digits, plan_rows, plans_table, shown_plans};
use anyhow::{Context, Result, bail};
use headroom_memory::format_bytes;
use headroom_plan::advice::Shortfall;
use headroom_plan::cost::Plan;
use headroom_plan::export::write_export;
use headroom_plan::hardware;
use headroom_plan::strategy::Offload;
use headroom_train::auto::{AutoPlan, plan};
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::data::Corpus;
use headroom_train::models::OwnModel;
use serde_json::{Value, json};

pub fn run(args: &PlanArgs) -> Result<()> {
    reject_planner_only_flags(args)?;
    let (budget, gpu) = budget(args)?;
    let config = run_config(args, budget)?;
    let pins = args.levers.pins();
    let corpus = Corpus::bundled();
    let outcome = plan(&config, &corpus, &pins)?;
    let model = OwnModel::of(&config)?;
    let shown = shown_plans(&outcome.search, args.top);
    let advice: Vec<String> = outcome
        .reason(budget)
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    let shortfall = outcome.closest().map(|c| Shortfall {
        missing_bytes_per_device: c.memory.per_device_peak_bytes.saturating_sub(budget),
        missing_host_bytes_per_node: 0,
        missing_nvme_bytes_per_node: 0,
        suggestions: vec![format!(
            "--device-memory {}: enough for the closest plan ({}), its reserved peak with no limit",
            format_bytes(c.memory.per_device_peak_bytes),
            c.strategy.describe(outcome.has_attention)
        )],
    });
    if args.json {
        let mut report = to_json(&config, &model, &outcome, &shown, gpu.as_deref(), &advice);
        report["shortfall"] = json!(shortfall);
        crate::json_out::print_json(&report)?;
    } else {
        print!(
            "{}",
            to_text(&config, &model, &outcome, &shown, &advice, &shortfall)
        );
    }
    let Some(best) = outcome.recommended() else {
        let missing = shortfall.map_or(0, |s| s.missing_bytes_per_device);
        bail!(
            "no strategy fits the device budget of {}: --device-memory {} is enough for the closest plan ({} more), or shorten --seq-len",
            format_bytes(budget),
            format_bytes(budget + missing),
            format_bytes(missing)
        );
    };
    for pair in args.emit.chunks(2) {
        let (kind, path) = (&pair[0], std::path::Path::new(&pair[1]));
        if kind != "headroom" {
            bail!(
                "--emit {kind}: headroom's own models train with `headroom train`; accepted here: --emit headroom FILE"
            );
        }
        let chosen = RunConfig {
            allocator: outcome.allocator,
            ..config.with_strategy(best.strategy)
        };
        write_export(path, &train_toml(&chosen)?).with_context(|| format!("--emit {kind}"))?;
        if !args.json {
            println!("wrote headroom config to {}", path.display());
        }
    }
    Ok(())
}

/// Flags of the analytical planner that have no meaning for a dry-run plan.
fn reject_planner_only_flags(args: &PlanArgs) -> Result<()> {
    let given = [
        ("--efficiency", args.efficiency.is_some()),
        ("--calibrate", args.calibrate.is_some()),
        ("--fragmentation", args.fragmentation.is_some()),
        ("--margin", args.margin.is_some()),
        ("--hardware", args.hardware.is_some()),
        ("--nodes", args.hw.nodes.is_some_and(|n| n != 1)),
        (
            "--gpus-per-node",
            args.hw.gpus_per_node.is_some_and(|n| n != 1),
        ),
        ("--global-batch-tokens", args.global_batch_tokens.is_some()),
    ];
    if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
        bail!(
            "{flag} applies to the analytical planner (Hugging Face models); headroom's own models are planned by dry runs on one device"
        );
    }
    let levers = &args.levers.keys;
    let offloaded = levers.offload_optimizer.is_some_and(|o| o != Offload::None)
        || levers.offload_params.is_some_and(|o| o != Offload::None);
    // Alone, a ZeRO stage only serves offload (DeepSpeed's rule: offload needs a stage).
    if let Some(zero) = levers.zero_stage.filter(|z| z.shards_optimizer())
        && ranks(args) < 2
        && !offloaded
    {
        bail!(
            "--zero {zero} shards over data-parallel ranks: add --data-parallel N (N ≥ 2), or drop --zero"
        );
    }
    Ok(())
}

/// The device budget: `--device-memory`, `--gpu-memory`, or the `--gpu` preset's memory less
/// its CUDA context.
fn budget(args: &PlanArgs) -> Result<(u64, Option<String>)> {
    if let Some(b) = args.device_memory.or(args.hw.gpu_memory) {
        return Ok((b.0, args.gpu.clone()));
    }
    if let Some(name) = &args.gpu {
        let hw = hardware::preset(name)?;
        let usable = hw.gpu.memory_bytes.saturating_sub(hw.cuda_context_bytes);
        return Ok((usable, Some(hw.gpu.name)));
    }
    bail!(
        "no device budget: give --device-memory SIZE (e.g. 64MiB) or --gpu PRESET ({})",
        hardware::gpu_preset_names().join(", ")
    )
}

/// The data-parallel ranks planned for (`--data-parallel`, 1 by default).
fn ranks(args: &PlanArgs) -> usize {
    args.data_parallel.unwrap_or(1)
}

/// The run to plan: the model, sequence, effective batch per rank, ranks and budget (the rest
/// at defaults).
fn run_config(args: &PlanArgs, budget: u64) -> Result<RunConfig> {
    let n = ranks(args);
    if n == 0 {
        bail!("--data-parallel 0: a run needs at least one rank");
    }
    let per_rank = match args.global_batch {
        Some(g) if g % n as u64 != 0 => bail!(
            "--global-batch {g} does not split over --data-parallel {n} ranks; give a multiple of {n}"
        ),
        g => g.map(|g| g / n as u64),
    };
    let (micro_batch, accumulation) = match (per_rank, args.split()) {
        (Some(0), _) => bail!("--global-batch 0: a batch needs at least one sequence"),
        (Some(g), (m, a)) => {
            let m = m.unwrap_or(g / a.unwrap_or(1).max(1));
            if m == 0 || g % m != 0 || a.is_some_and(|a| a.checked_mul(m) != Some(g)) {
                bail!("--global-batch {g} is not --micro-batch × --accumulation; give a divisor");
            }
            (Some(m as usize), Some((g / m) as usize))
        }
        // Without a global batch, the split `headroom train` would run: the levers given, the
        // rest at its defaults.
        (None, _) => (args.levers.keys.micro_batch, args.levers.keys.accumulation),
    };
    let config = TrainConfig {
        model: Some(args.model_name().to_string()),
        seq_len: args.seq_len.map(|s| s as usize),
        micro_batch,
        accumulation,
        device_memory: Some(headroom_memory::ByteSize(budget)),
        data_parallel: Some(n),
        lora_rank: args.lora_rank,
        lora_alpha: args.lora_alpha,
        lora_targets: args.lora_targets.clone(),
        lora_base: args.lora_base,
        ..Default::default()
    };
    Ok(config.resolve()?)
}

fn to_json(
    config: &RunConfig,
    model: &OwnModel,
    outcome: &AutoPlan,
    shown: &[&Plan],
    gpu: Option<&str>,
    advice: &[String],
) -> Value {
    json!({
        "model": {
            "name": config.model,
            "model_type": model.model_type,
            "params": model.params,
            "layers": model.depth,
            "hidden_size": model.hidden_size,
            "vocab_size": model.vocab_size,
        },
        "hardware": {
            "device": "headroom CPU engine",
            "gpu": gpu,
            "world_size": config.data_parallel,
            "device_memory_bytes": config.device_memory,
            "speed": outcome.speed,
        },
        "workload": {
            "seq_len": outcome.seq_len,
            "batch_per_rank": outcome.effective_batch,
            "global_batch": outcome.effective_batch * config.data_parallel,
            "tokens_per_step": outcome.seq_len * outcome.effective_batch * config.data_parallel,
        },
        "cost_model": {
            "memory": "dry run: the trainer's steps on a shape-only device through the real allocator (caching pools, or the planned arena where it lets a faster plan fit)",
            "time": "work counted by the dry run over this machine's measured kernel rates",
        },
        "search": {
            "evaluated": outcome.evaluated(),
            "fitting": outcome.search.fitting.len(),
            "seconds": outcome.seconds,
        },
        "plans": shown,
        "recommended": outcome.recommended(),
        "allocator": outcome.allocator,
        "advice": advice,
    })
}

fn to_text(
    config: &RunConfig,
    model: &OwnModel,
    outcome: &AutoPlan,
    shown: &[&Plan],
    advice: &[String],
    shortfall: &Option<Shortfall>,
) -> String {
    let mut out = format!(
        "Model     {} ({}): {} parameters, {} blocks\n",
        config.model,
        model.model_type,
        group_digits(model.params as u64),
        model.depth
    );
    if let Some(lora) = &config.lora {
        out += &format!(
            "Fine-tune {lora}: {} trainable parameters, the base frozen\n",
            group_digits(model.trainable_params as u64)
        );
    }
    let n = config.data_parallel;
    let ranks = match n {
        1 => String::new(),
        n => format!(" per rank, {n} data-parallel ranks"),
    };
    out += &format!(
        "Device    headroom CPU engine, budget {}{ranks}\n",
        format_bytes(config.device_memory)
    );
    out += &format!(
        "Workload  seq {} × batch {}{} = {} tokens per step\n",
        outcome.seq_len,
        outcome.effective_batch,
        if n > 1 {
            format!(" per rank × {n} ranks")
        } else {
            String::new()
        },
        group_digits((outcome.seq_len * outcome.effective_batch * n) as u64)
    );
    out += &format!(
        "Searched  {} dry runs in {:.2} s (speed model measured on this machine); {} fit\n\n",
        outcome.evaluated(),
        outcome.seconds,
        outcome.search.fitting.len()
    );
    let rows = plan_rows(shown, outcome.has_attention);
    out += &plans_table(&rows, "device");
    out += "\n";
    match (outcome.recommended(), shortfall) {
        (Some(_), _) => {
            out += &format!("Recommended: plan 1 — {}\n", advice.join("\n  "));
        }
        (None, Some(s)) => {
            out += &format!(
                "Nothing fits: the closest plan (shown) fits in {} more.\n",
                format_bytes(s.missing_bytes_per_device)
            );
            for line in &s.suggestions {
                out += &format!("  - {line}\n");
            }
        }
        (None, None) => {}
    }
    out
}

/// The `headroom train --config` TOML of a run: model, sequence, budget, ranks, allocator and
/// fine-tune, and the strategy's keys as its one writer gives them.
fn train_toml(c: &RunConfig) -> Result<String> {
    let file = TrainConfig {
        model: Some(c.model.clone()),
        seq_len: c.seq_len,
        device_memory: Some(headroom_memory::ByteSize(c.device_memory)),
        data_parallel: (c.data_parallel > 1).then_some(c.data_parallel),
        allocator: Some(c.allocator),
        lora_rank: c.lora.as_ref().map(|l| l.rank),
        lora_alpha: c.lora.as_ref().map(|l| l.alpha),
        lora_targets: c.lora.as_ref().map(|l| l.targets.clone()),
        lora_base: c.lora.as_ref().map(|l| l.base),
        ..TrainConfig::of_strategy(&c.strategy)
    };
    Ok(format!(
        "# headroom train --config FILE: the fastest strategy that fits, from `headroom plan`\n{}",
        toml::to_string(&file)?
    ))
}
