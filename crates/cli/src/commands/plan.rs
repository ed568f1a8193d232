//! `headroom plan`: which combination of memory levers fits this model on this hardware, and
//! which of those is fastest. Arguments, hardware assembly (preset → TOML → flags), the search,
//! and the exports; rendering lives in `plan_output`.

use super::plan_mesh::{MeshArgs, MeshReport};
use super::{plan_emit, plan_output, plan_own, plan_trace};
use anyhow::{Context, Result, bail};
use clap::Args;
use headroom_memory::ByteSize;
use headroom_plan::PlanError;
use headroom_plan::calibrate::{Measurement, calibrate};
use headroom_plan::cost::{CostModel, Problem};
use headroom_plan::export::ExportOptions;
use headroom_plan::hardware::{self, Hardware, HardwareOverrides};
use headroom_plan::mesh::{Layout, choose, search_meshes, unreachable_values};
use headroom_plan::search::{SearchOutcome, search};
use headroom_plan::strategy::{
    BaseDtype, BaseWeights, Framework, Lora, LoraTargets, LossImpl, OptimizerImpl, Pins, parse_flag,
};
use headroom_plan::workload::{BatchSpec, LoaderSpec, Workload, context_warning};
use headroom_train::config::Levers;
use headroom_train::models::{hugging_face_model, is_engine_model, is_own_model};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Predict memory and time of a training run and choose the fastest plan that fits.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A built-in model (see `headroom params --help`), a Hugging Face config.json, or one of
    /// headroom's own models (gpt-small, gpt-tiny, gpt-medium, resmlp, or a model TOML), which
    /// are planned by dry runs on the real allocator within --device-memory. With --trace: the
    /// Hugging Face config.json the speed model reads when the traced model is a factory.
    #[arg(long, required_unless_present = "trace")]
    pub model: Option<String>,
    /// Plan the user's own PyTorch program by tracing it under every lever setting (precision,
    /// checkpointing, micro-batch, the optimizer's implementation, LoRA with --lora-rank) and
    /// replaying each trace through the caching allocator: a Hugging Face config.json (or its
    /// directory), or a model factory `package.module:function` (then --model names its
    /// config.json for the speed model). Needs Python with torch and transformers
    /// (HEADROOM_PYTHON), as `headroom trace` does.
    #[arg(long, value_name = "MODEL")]
    pub trace: Option<String>,
    /// With --trace: training steps traced per setting (the second step runs with the
    /// optimizer states already allocated, the steady state).
    #[arg(long, value_name = "K", default_value_t = 2, requires = "trace")]
    pub trace_steps: u64,
    /// With --trace: also trace the recommended setting at twice, four times, … 64 times
    /// --seq-len (no further than the model's position limit) and report the longest
    /// sequence that fits.
    #[arg(long, requires = "trace")]
    pub max_context: bool,
    /// Device budget for headroom's own models (e.g. 64MiB, 2GiB); a --gpu preset's memory less
    /// its CUDA context otherwise. With --trace: the bytes the caching allocator may reserve.
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<ByteSize>,
    /// GPU preset: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-80GB, H200-141GB, L4, A10G,
    /// RTX-4090, RTX-3090, RTX-A6000, L40S, H100-PCIe, H100-NVL, B200, MI300X (case, spaces
    /// and hyphens do not matter: `"rtx 4090"`; a leading part such as `h200` names the one
    /// preset it starts).
    #[arg(long)]
    pub gpu: Option<String>,
    /// TOML file with hardware fields (same names as the flags, e.g. `gpu_memory = "80GiB"`).
    #[arg(long, value_name = "FILE")]
    pub hardware: Option<PathBuf>,
    /// Hardware fields given as flags (the same names as the `--hardware` TOML).
    #[command(flatten)]
    pub hw: HardwareOverrides,
    /// Sequence length in tokens (a Hugging Face model's pre-training length where its config
    /// records one, `rope_scaling.original_max_position_embeddings`: 8192 for Llama 3.1; required
    /// otherwise; a headroom model's context by default).
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Global batch per optimizer step, in samples (default for a Hugging Face model: one
    /// sequence per GPU).
    #[arg(long, conflicts_with = "global_batch_tokens")]
    pub global_batch: Option<u64>,
    /// Global batch per optimizer step, in tokens (a multiple of --seq-len).
    #[arg(long)]
    pub global_batch_tokens: Option<u64>,
    /// Count each rank's data loader in host memory: N worker threads (and --prefetch batches
    /// queued in staging buffers), as headroom's loader states them.
    #[arg(long, value_name = "N")]
    pub workers: Option<u64>,
    /// Batches each rank's loader queues ahead (with --workers).
    #[arg(long, value_name = "K", default_value_t = 2, requires = "workers")]
    pub prefetch: u64,
    /// Plan a LoRA fine-tune with adapters of this rank: the base is frozen (parameters only)
    /// and only the adapters have gradients, master weights and optimizer states.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// The LoRA scale's numerator (updates × alpha/rank; default: the rank).
    #[arg(long, value_name = "ALPHA", requires = "lora_rank")]
    pub lora_alpha: Option<f32>,
    /// The projections LoRA adapts: comma-separated q, k, v, qkv, o, gate, up, down, or
    /// all-linear (default q,v). A fused projection (GPT-2's c_attn, Phi-3's qkv_proj) gets one
    /// adapter when any of q, k, v is named.
    #[arg(long, value_parser = parse_flag::<LoraTargets>, value_name = "LIST", requires = "lora_rank")]
    pub lora_targets: Option<LoraTargets>,
    /// How the frozen base is stored: plain (the parameter dtype) or nf4 (QLoRA: every block
    /// projection in 4-bit NormalFloat with double-quantised scales, 4.127 bits per weight).
    #[arg(long, value_parser = parse_flag::<BaseWeights>, value_name = "FORMAT", requires = "lora_rank")]
    pub lora_base: Option<BaseWeights>,
    /// The dtype the frozen base is loaded in (`torch_dtype`): fp32, bf16 or fp16 (default: the
    /// parameter dtype of --precision, 16-bit under mixed precision). PEFT's FSDP example loads
    /// it in fp32; DeepSpeed's 16-bit engines cast it to the compute dtype whatever it was.
    #[arg(long, value_parser = parse_flag::<BaseDtype>, value_name = "DTYPE", requires = "lora_rank")]
    pub lora_base_dtype: Option<BaseDtype>,
    /// PEFT's `lora_dropout`: the probability of the dropout on each adapter's input (default 0,
    /// none). Above 0 each adapted projection keeps a dropped copy of its input and a one-byte
    /// mask for backward (PEFT's guides run 0.1, Axolotl's examples 0.05).
    #[arg(long, value_name = "P", requires = "lora_rank")]
    pub lora_dropout: Option<f32>,
    /// headroom's own models: plan one rank of N data-parallel ranks (as `headroom train
    /// --data-parallel N` runs them), the ZeRO stage searched unless --zero pins it; the
    /// budget is per rank and --global-batch is split over the ranks.
    #[arg(long, value_name = "N")]
    pub data_parallel: Option<usize>,
    /// The strategy levers, pinned: the flags of `headroom train`, unset ones searched.
    #[command(flatten)]
    pub levers: Levers,
    /// The mesh axes (tensor, pipeline, sequence parallelism), pinned; searched on several GPUs.
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// Whose memory layout to predict: deepspeed (a 16-bit model, fp32 master weights and
    /// states, ZeRO-3 gathering module by module) or fsdp (PyTorch's DDP/FSDP with autocast or
    /// FSDP mixed precision: fp32 parameters that are the master copy, fp32 gradients, whole
    /// blocks gathered; offload only of everything to the CPU). Default: the framework of the
    /// exports asked for (`--emit deepspeed` → deepspeed; accelerate, torchtune or torchtitan
    /// without it → fsdp), deepspeed otherwise.
    #[arg(long, value_parser = parse_flag::<Framework>)]
    pub framework: Option<Framework>,
    /// How the optimizer steps the parameters, which sets its temporaries: foreach (PyTorch's
    /// default on CUDA: about one copy of the parameters updated), fused (`fused=True`: none),
    /// per-tensor (a loop such as Hugging Face's `adamw_hf` or `foreach=False`: one tensor's).
    /// Default foreach; with --trace, unset, all three are traced.
    #[arg(long, value_parser = parse_flag::<OptimizerImpl>)]
    pub optimizer_impl: Option<OptimizerImpl>,
    /// How the cross-entropy holds the vocabulary-sized tensors: hugging-face (a Hugging Face
    /// model's causal-LM loss: the model's 16-bit logits kept, upcast to fp32, fp32
    /// log-probabilities and two fp32 gradients in backward), separate (PyTorch's
    /// F.cross_entropy on fp32 logits released before backward, as torchtune and torchtitan
    /// run it: the gradient beside the saved log-probabilities) or in-place (Megatron-LM's
    /// vocab_parallel_cross_entropy: written into the saved softmax, so the fp32 logits exist
    /// once).
    #[arg(long, value_parser = parse_flag::<LossImpl>, default_value = "hugging-face")]
    pub loss_impl: LossImpl,
    /// Whether the training step runs under `torch.compile` (torchtitan's `compile`, the Hugging
    /// Face Trainer's `torch_compile`, torchtune's `compile`): its element-wise kernels fused, so
    /// it moves fewer bytes per token (docs/planner.md, "Matmul shape and element-wise kernels").
    /// Default: eager.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub compile: bool,
    /// Achievable fraction of the dense peak once micro-batches are large enough to fill the GPU
    /// and matmuls wide enough to feed it, for every precision (default: each GPU's value fitted
    /// to a published run, 0.45 where none is; see docs/planner.md); smaller micro-batches and
    /// narrower models reach less of it.
    #[arg(long)]
    pub efficiency: Option<f64>,
    /// Fragmentation reserve as a fraction of allocated bytes (default 0.10).
    #[arg(long)]
    pub fragmentation: Option<f64>,
    /// Safety margin below capacity (default 0.05).
    #[arg(long)]
    pub margin: Option<f64>,
    /// Rescale the speed model (and, given a peak, the activation bytes) to one measured step of
    /// this model on this hardware, from any framework: a JSON file with the measured run's
    /// `strategy`, `tokens_per_s` and optionally `peak_allocated_bytes`, `seq_len`, `source`
    /// (format in docs/planner.md).
    #[arg(long, value_name = "FILE")]
    pub calibrate: Option<PathBuf>,
    /// How many plans to show.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Print one JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write a config for the recommended plan: `--emit deepspeed ds.json`, `--emit accelerate
    /// acc.yaml`, `--emit headroom train.toml`, `--emit torchtune overrides.yaml` (a
    /// single-device recipe's keys), and with --lora-rank `--emit peft
    /// adapter_config.json` (PEFT's LoraConfig) and `--emit bitsandbytes quant.json` (QLoRA's
    /// BitsAndBytesConfig); for a mesh or plain data parallelism, `--emit torchtitan job.toml`
    /// (a torchtitan job config) and `--emit megatron args.txt` (Megatron-LM's arguments)
    /// (repeatable).
    #[arg(long, num_args = 2, value_names = ["KIND", "FILE"], action = clap::ArgAction::Append)]
    pub emit: Vec<String>,
    /// Directory on each node's NVMe for offloaded states, written into the exports
    /// (ds_config `nvme_path`, Accelerate `offload_*_nvme_path`).
    #[arg(long, value_name = "DIR", default_value = "/local_nvme")]
    pub nvme_path: String,
    /// Address of the machine of rank 0 for a multi-node Accelerate export (`main_process_ip`).
    #[arg(long, value_name = "HOST")]
    pub main_process_ip: Option<String>,
    /// Port on the machine of rank 0 for a multi-node Accelerate export (`main_process_port`;
    /// 29500 is torchrun's default).
    #[arg(long, value_name = "PORT", default_value_t = 29500)]
    pub main_process_port: u16,
}

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

/// Builds every `--emit` file for the recommended plain data-parallel plan over the problem's
/// GPUs, holds each to the rules, then writes all of them or none.
pub(super) fn write_emits(
    problem: &Problem,
    best: &headroom_plan::cost::Plan,
    emits: &[(String, PathBuf)],
    args: &PlanArgs,
) -> Result<()> {
    let opts = export_options(args, emits);
    let world = problem.hardware.world_size();
    plan_emit::write(problem, Layout::Plain(best), world, emits, &opts, args.json)
}

fn export_options(args: &PlanArgs, emits: &[(String, PathBuf)]) -> ExportOptions {
    ExportOptions {
        nvme_path: args.nvme_path.clone(),
        main_process_ip: args.main_process_ip.clone(),
        main_process_port: args.main_process_port,
        deepspeed_config_file: emits
            .iter()
            .find(|(k, _)| k == "deepspeed")
            .map(|(_, p)| p.display().to_string()),
    }
}

/// The framework the exports target: DeepSpeed when a ds_config is asked for (an Accelerate
/// export then uses its DeepSpeed plugin), FSDP when only Accelerate or torchtune files are,
/// DeepSpeed when none is.
pub(super) fn default_framework(emits: &[(String, PathBuf)]) -> Framework {
    let kinds: Vec<&str> = emits.iter().map(|(k, _)| k.as_str()).collect();
    if !kinds.contains(&"deepspeed")
        && kinds
            .iter()
            .any(|k| ["accelerate", "torchtune", "torchtitan"].contains(k))
    {
        Framework::Fsdp
    } else {
        Framework::DeepSpeed
    }
}

/// GPU preset, then the `--hardware` TOML, then the flags.
pub(super) fn build_hardware(args: &PlanArgs) -> Result<Hardware> {
    let file = match &args.hardware {
        Some(path) => Some(read_hardware(path)?),
        None => None,
    };
    let gpu = args
        .gpu
        .clone()
        .or_else(|| file.as_ref().and_then(|f| f.gpu.clone()));
    let Some(gpu) = gpu else {
        bail!(
            "--gpu is required (or `gpu = \"…\"` in the --hardware file); accepted: {}",
            hardware::gpu_preset_names().join(", ")
        );
    };
    let flags = HardwareOverrides {
        gpu: None,
        ..args.hw.clone()
    };
    let figures: Vec<&HardwareOverrides> = file.iter().chain([&flags]).collect();
    let mut hw = hardware::resolve(&gpu, &figures)?;
    if let Some(f) = &file {
        hw.apply(&HardwareOverrides {
            gpu: None,
            ..f.clone()
        })?;
    }
    hw.apply(&flags)?;
    Ok(hw)
}

fn read_hardware(path: &Path) -> Result<HardwareOverrides> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--hardware {}", path.display()))?;
    HardwareOverrides::from_toml(&text).with_context(|| format!("--hardware {}", path.display()))
}

impl PlanArgs {
    /// The `--model` given (clap requires it unless --trace is given, which is planned apart).
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or_default()
    }

    /// The pinned micro-batch and accumulation, if given.
    pub fn split(&self) -> (Option<u64>, Option<u64>) {
        let keys = &self.levers.keys;
        (
            keys.micro_batch.map(|m| m as u64),
            keys.accumulation.map(|a| a as u64),
        )
    }

    /// The LoRA fine-tune the `--lora-*` flags describe, if `--lora-rank` is given.
    pub fn lora(&self) -> Result<Option<Lora>> {
        let Some(rank) = self.lora_rank else {
            return Ok(None);
        };
        Ok(Some(Lora::new(
            rank,
            self.lora_alpha.unwrap_or(rank as f32),
            self.lora_targets.clone().unwrap_or_default(),
            self.lora_base.unwrap_or_default(),
        )?))
    }
}
