//! `headroom plan`: which combination of memory levers fits this model on this hardware, and
//! which of those is fastest. The dispatch (own models, `--trace`) and, for a Hugging Face
//! model, the workload, the search of plain data parallelism and of meshes, and the report.
//!
//! Not for: the arguments (`plan_args`), the hardware (`plan_hardware`), the exports
//! (`plan_emit`) or rendering (`plan_output`).

use super::plan_emit::{self, default_framework, export_options, write_emits};
use super::plan_hardware::build_hardware;
use super::plan_mesh::MeshReport;
use super::{plan_output, plan_own, plan_trace};
use anyhow::{Context, Result, bail};
use headroom_plan::PlanError;
use headroom_plan::calibrate::{Measurement, calibrate};
use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::mesh::{choose, search_meshes, unreachable_values};
use headroom_plan::search::{SearchOutcome, search};
use headroom_plan::strategy::Pins;
use headroom_plan::workload::{BatchSpec, LoaderSpec, Workload, context_warning};
use headroom_train::models::{hugging_face_model, is_engine_model, is_own_model};
use std::time::Instant;

pub use super::plan_args::PlanArgs;

pub fn run(args: PlanArgs) -> Result<()> {
    let emits = plan_emit::parse(&args.emit)?;
    if let Some(traced) = &args.trace {
        return plan_trace::run(&args, traced, &emits);
    }
    let model = args.model_name();
    // A pretrained Llama-family model is planned on headroom's engine when its budget is
    // given, and as a Hugging Face model on GPUs otherwise.
    if is_own_model(model) || (args.device_memory.is_some() && is_engine_model(model)) {
        return plan_own::run(&args);
    }
    if args.device_memory.is_some() {
        bail!(
            "--device-memory is the budget of headroom's own models; for a Hugging Face model give --gpu and, to change its memory, --gpu-memory"
        );
    }
    if args.data_parallel.is_some() {
        bail!(
            "--data-parallel plans headroom's own models; for a Hugging Face model give --gpus-per-node and --nodes"
        );
    }
    let spec = hugging_face_model(model).with_context(|| format!("--model {model}"))?;
    let mut notes = Vec::new();
    let seq_len = match (args.seq_len, spec.pretraining_context) {
        (Some(s), _) => s,
        (None, Some(s)) => {
            notes.push(format!(
                "--seq-len {s}: {}'s pre-training sequence length (rope_scaling.original_max_position_embeddings)",
                spec.name
            ));
            s
        }
        (None, None) => {
            bail!("--seq-len is required for a Hugging Face model (e.g. --seq-len 4096)")
        }
    };
    let mut warnings: Vec<String> = context_warning(&spec, seq_len).into_iter().collect();
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let hw = build_hardware(&args)?;
    let (micro_batch, accumulation) = args.split();
    let batch = match (
        args.global_batch,
        args.global_batch_tokens,
        micro_batch,
        accumulation,
    ) {
        (Some(b), _, _, _) => BatchSpec::Samples(b),
        (None, Some(t), _, _) => BatchSpec::Tokens(t),
        (None, None, Some(micro_batch), Some(accumulation)) => BatchSpec::Split {
            micro_batch,
            accumulation,
        },
        (None, None, None, None) => {
            notes.push(format!(
                "--global-batch {}: one sequence per GPU (give --global-batch to plan another)",
                hw.world_size()
            ));
            BatchSpec::Samples(hw.world_size())
        }
        _ => bail!(
            "no batch given; accepted: --global-batch N, --global-batch-tokens N, or both --micro-batch and --accumulation"
        ),
    };
    for n in &notes {
        eprintln!("note: {n}");
    }
    warnings.extend(notes);
    // A global batch smaller than the GPUs rules out plain data parallelism (each GPU needs
    // whole sequences) but not a mesh, whose dp is smaller: only meshes are searched then
    // (Llama 3 trained 405B on 16,384 GPUs with 2,048 sequences per step; Llama 3 paper,
    // §3.3.2). A larger batch that is not a multiple of the GPUs stays an error.
    let world = hw.world_size();
    let global = match batch {
        BatchSpec::Samples(n) => Some(n),
        BatchSpec::Tokens(t) => t.is_multiple_of(seq_len).then(|| t / seq_len),
        BatchSpec::Split { .. } => None,
    };
    let early_pins = args.mesh.pins();
    if early_pins.only_plain()
        && let Some(m) = early_pins.microbatches
    {
        bail!(
            "--microbatches {m} counts a mesh replica's micro-batches, and --tp 1 --pp 1 leaves plain data parallelism, which accumulates them instead: give --accumulation {m} (with --micro-batch), or drop --tp 1 --pp 1 to plan meshes"
        );
    }
    let mut plain_possible =
        global.is_none_or(|g| g == 0 || g >= world) || world == 1 || early_pins.only_plain();
    if !plain_possible {
        let note = format!(
            "the global batch of {} sequences is smaller than the {world} GPUs: plain data parallelism cannot run it, only meshes whose dp divides it are searched",
            global.unwrap_or(0)
        );
        eprintln!("note: {note}");
        warnings.push(note);
    }
    // Pins that rule out plain data parallelism (--tp 8) leave the batch to the mesh's own
    // rule, global = dp · m · micro-batch, checked by the mesh search.
    if global.is_some() && !early_pins.admit_plain() {
        plain_possible = false;
    }
    let workload_over =
        |ranks: u64| Workload::new(&spec, seq_len, batch, micro_batch, accumulation, ranks);
    let workload = match workload_over(if plain_possible { world } else { 1 }) {
        Ok(w) => w,
        // A micro-batch plain data parallelism cannot split the batch into (512 sequences in
        // micro-batches of 16 over 256 GPUs, 2 per GPU) may still suit a mesh, whose dp is
        // smaller: search the meshes alone. A batch that is not a multiple of the GPUs stays
        // an error.
        Err(PlanError::Batch(why))
            if plain_possible
                && global.is_some_and(|g| g.is_multiple_of(world))
                && world > 1
                && !early_pins.only_plain() =>
        {
            let w = workload_over(1)?;
            let note = format!(
                "plain data parallelism cannot split this batch ({why}); only meshes whose dp · microbatches · micro-batch equals it are searched"
            );
            eprintln!("note: {note}");
            warnings.push(note);
            plain_possible = false;
            w
        }
        Err(e) => return Err(e.into()),
    };
    let workload = match args.workers {
        Some(workers) => workload.with_loader(LoaderSpec {
            workers,
            prefetch: args.prefetch,
        }),
        None => workload,
    };
    let workload = match args.lora()? {
        Some(lora) => workload.with_lora(&spec, lora)?,
        None => workload,
    };
    let workload = match args.lora_base_dtype {
        Some(dtype) => workload.with_lora_base_dtype(dtype)?,
        None => workload,
    };
    let workload = match args.lora_dropout {
        Some(p) => workload.with_lora_dropout(p)?,
        None => workload,
    };
    let mut cost = CostModel::default();
    if let Some(v) = args.efficiency {
        if !(v > 0.0 && v <= 1.0) {
            bail!("--efficiency {v} is out of range; accepted: a fraction in (0, 1]");
        }
        cost.efficiency = Some(v);
    }
    if let Some(v) = args.fragmentation {
        if !(0.0..=1.0).contains(&v) {
            bail!("--fragmentation {v} is out of range; accepted: a fraction in [0, 1]");
        }
        cost.fragmentation = v;
    }
    if let Some(v) = args.margin {
        if !(0.0..1.0).contains(&v) {
            bail!("--margin {v} is out of range; accepted: a fraction in [0, 1)");
        }
        cost.margin = v;
    }
    // The workload carries a given split; the search pins the other levers.
    let pins = Pins {
        micro_batch: None,
        accumulation: None,
        ..args.levers.pins()
    };
    let framework = args.framework.unwrap_or_else(|| default_framework(&emits));
    let mut problem = Problem::new(spec, hw, workload, cost)
        .with_framework(framework)
        .with_optimizer_impl(args.optimizer_impl.unwrap_or_default())
        .with_loss_impl(args.loss_impl)
        .with_zero_grad(args.zero_grad)
        .with_outputs_kept(args.loop_keeps_outputs)
        .with_compile(args.compile);
    let calibration = match &args.calibrate {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--calibrate {}", path.display()))?;
            let measurement = Measurement::from_json(&text)
                .with_context(|| format!("--calibrate {}", path.display()))?;
            let (cost, calibration) = calibrate(&problem, &measurement)
                .with_context(|| format!("--calibrate {}", path.display()))?;
            problem.cost = cost;
            Some(calibration)
        }
        None => None,
    };
    let started = Instant::now();
    let configured = problem.configured(&pins);
    let outcome = if plain_possible {
        search(&problem, &pins, Some(&configured))?
    } else {
        SearchOutcome {
            evaluated: 0,
            fitting: Vec::new(),
            rejected: Vec::new(),
            closest: None,
        }
    };
    let elapsed = started.elapsed();
    let mesh_pins = args.mesh.pins();
    let mesh_started = Instant::now();
    // Most exports express data parallelism only: asked for alone, they keep the search to it.
    let plain_kinds = plan_emit::plain_only(&emits);
    if !plain_kinds.is_empty() && mesh_pins.any() && !mesh_pins.only_plain() {
        bail!(
            "--emit {}: these exports express data parallelism only, not the pinned --tp/--pp/--pp-schedule/--microbatches/--sequence-parallel; drop the mesh pins, or emit torchtitan or megatron",
            plain_kinds.join(", ")
        );
    }
    let mesh_search = if plan_emit::keeps_search_plain(&emits) && plain_possible {
        headroom_plan::mesh::MeshSearch::default()
    } else {
        search_meshes(
            &problem,
            &Pins {
                micro_batch: micro_batch.or(args.levers.pins().micro_batch),
                ..pins
            },
            &mesh_pins,
        )?
    };
    if !plain_possible && mesh_search.evaluated == 0 {
        bail!(
            "global batch {} samples cannot be split evenly over {world} data-parallel GPUs, and no mesh applies (see the notes above); accepted: a multiple of {world}",
            global.unwrap_or(0)
        );
    }
    let mesh_report = (mesh_search.evaluated > 0).then(|| {
        let plain = (plain_possible && mesh_pins.admit_plain()).then_some(&outcome);
        let mut choice = choose(plain, &mesh_search.plans, world);
        let mut taken: Vec<(u64, u64)> = mesh_search
            .plans
            .iter()
            .map(|m| (m.mesh.tp, m.mesh.pp))
            .collect();
        if plain.is_some() {
            taken.push((1, 1));
        }
        let first_micro_batch = micro_batch.or(args.levers.pins().micro_batch).unwrap_or(1);
        choice.verdicts.extend(unreachable_values(
            &problem,
            &mesh_pins,
            first_micro_batch,
            &taken,
        ));
        MeshReport {
            search: &mesh_search,
            choice,
            world,
            elapsed: mesh_started.elapsed(),
        }
    });
    let report = plan_output::Report::new(&problem, &pins, &outcome, elapsed, args.top)
        .with_warnings(warnings)
        .with_calibration(calibration);
    let recommends_mesh = mesh_report.as_ref().is_some_and(|m| m.recommends_mesh());
    if args.json {
        let mut v = report.to_json();
        v["mesh"] = mesh_report
            .as_ref()
            .map_or(serde_json::Value::Null, |m| m.to_json());
        crate::json_out::print_json(&v)?;
    } else if let Some(m) = &mesh_report {
        if recommends_mesh || !mesh_pins.admit_plain() || !plain_possible {
            print!("{}{}", report.header_text(), m.to_text());
        } else {
            print!("{}{}", report.to_text(), m.to_text());
        }
    } else {
        print!("{}", report.to_text());
    }
    if let Some(m) = &mesh_report
        && m.choice.recommended.is_some()
        && (recommends_mesh || !mesh_pins.admit_plain() || !plain_possible)
    {
        if let Some(layout) = &m.choice.recommended
            && !emits.is_empty()
        {
            let opts = export_options(&args, &emits);
            return plan_emit::write(&problem, *layout, world, &emits, &opts, args.json);
        }
        return Ok(());
    }
    if let Some(m) = &mesh_report
        && (!mesh_pins.admit_plain() || !plain_possible)
    {
        bail!(
            "no mesh keeps the pins and fits: the closest peaks at {} per GPU against {} usable (see the table above)",
            m.choice.closest.map_or(0, |c| c.summary(world).peak_bytes),
            problem.usable_device_bytes()
        );
    }
    let Some(best) = outcome.recommended() else {
        bail!(
            "no plan fits: the closest needs {} ({})",
            report.missing_text(),
            if args.json {
                "the changes that would fit are in the JSON's shortfall.suggestions"
            } else {
                "see the suggestions above"
            }
        );
    };
    write_emits(&problem, best, &emits, &args)
}
