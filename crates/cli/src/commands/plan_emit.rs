//! `headroom plan --emit KIND FILE`: the export kinds, which of them can express a mesh, the
//! framework they imply, and writing the files of the recommended layout — every file built (and
//! held to its documented rules) before any is written, then all written or none.

use super::plan_args::PlanArgs;
use anyhow::{Context, Result, bail};
use headroom_plan::cost::Problem;
use headroom_plan::export::mesh_run::MeshRun;
use headroom_plan::export::{
    ExportOptions, accelerate, deepspeed, headroom, megatron, peft, torchtitan, torchtune,
    write_exports,
};
use headroom_plan::mesh::Layout;
use headroom_plan::strategy::Framework;
use std::path::{Path, PathBuf};

/// Every kind `--emit` accepts.
pub const EMIT_KINDS: &str =
    "deepspeed, accelerate, headroom, torchtune, peft, bitsandbytes, torchtitan, megatron";

/// The kinds that express a tp × pp mesh as well as plain data parallelism.
const MESH_KINDS: [&str; 2] = ["torchtitan", "megatron"];

/// `--emit` pairs as (kind, path), each kind checked.
pub fn parse(emit: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let emits: Vec<(String, PathBuf)> = emit
        .chunks(2)
        .map(|c| (c[0].clone(), PathBuf::from(&c[1])))
        .collect();
    for (kind, _) in &emits {
        if !EMIT_KINDS.split(", ").any(|k| k == kind) {
            bail!("unknown --emit kind '{kind}'; accepted: {EMIT_KINDS}");
        }
    }
    Ok(emits)
}

/// The asked-for kinds that express plain data parallelism only.
pub fn plain_only(emits: &[(String, PathBuf)]) -> Vec<&str> {
    emits
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !MESH_KINDS.contains(k))
        .collect()
}

/// Whether the exports asked for keep the search to plain data parallelism: some are asked
/// for, and none of them can express a mesh.
pub fn keeps_search_plain(emits: &[(String, PathBuf)]) -> bool {
    !emits.is_empty() && plain_only(emits).len() == emits.len()
}

fn build(
    problem: &Problem,
    layout: &Layout,
    world: u64,
    kind: &str,
    opts: &ExportOptions,
) -> Result<String> {
    let mesh_run = |format: &str| match layout {
        Layout::Plain(plan) => MeshRun::of_plain(problem, plan, world, format),
        Layout::Mesh(plan) => MeshRun::of_mesh(problem, plan, format),
    };
    if let Some(format) = MESH_KINDS.iter().find(|k| **k == kind) {
        let run = mesh_run(format)?;
        return Ok(match kind {
            "torchtitan" => torchtitan::torchtitan_toml(problem, &run)?,
            _ => megatron::megatron_args(problem, &run)?,
        });
    }
    let Layout::Plain(best) = layout else {
        bail!(
            "--emit {kind}: the recommended layout splits the model with tensor or pipeline parallelism, which the {kind} export cannot express; use --emit torchtitan or megatron, or pin --tp 1 --pp 1 to export the best plain data-parallel plan"
        );
    };
    Ok(match kind {
        "deepspeed" => {
            serde_json::to_string_pretty(&deepspeed::ds_config(problem, best, opts)?)? + "\n"
        }
        "accelerate" => accelerate::accelerate_config(problem, best, opts)?,
        "torchtune" => torchtune::torchtune_config(problem, best)?,
        "peft" => serde_json::to_string_pretty(&peft::adapter_config(problem)?)? + "\n",
        "bitsandbytes" => {
            serde_json::to_string_pretty(&peft::bitsandbytes_config(problem, best)?)? + "\n"
        }
        _ => headroom::headroom_toml(problem, best),
    })
}

/// Builds every asked-for file of `layout` (over `world` GPUs), then writes them all or none.
pub fn write(
    problem: &Problem,
    layout: Layout,
    world: u64,
    emits: &[(String, PathBuf)],
    opts: &ExportOptions,
    json: bool,
) -> Result<()> {
    let mut texts = Vec::new();
    for (kind, path) in emits {
        if emits.iter().filter(|(_, p)| p == path).count() > 1 {
            bail!(
                "--emit {kind} {}: the same path is given to two --emit; give each its own file",
                path.display()
            );
        }
        texts.push(build(problem, &layout, world, kind, opts)?);
    }
    let files: Vec<(&Path, &str)> = emits
        .iter()
        .zip(&texts)
        .map(|((_, p), t)| (p.as_path(), t.as_str()))
        .collect();
    let kinds: Vec<&str> = emits.iter().map(|(k, _)| k.as_str()).collect();
    write_exports(&files).with_context(|| {
        format!(
            "--emit {}: nothing was written (all the files or none)",
            kinds.join(", --emit ")
        )
    })?;
    if !json {
        for (kind, path) in emits {
            println!("wrote {kind} config to {}", path.display());
        }
    }
    Ok(())
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
    write(problem, Layout::Plain(best), world, emits, &opts, args.json)
}

pub(super) fn export_options(args: &PlanArgs, emits: &[(String, PathBuf)]) -> ExportOptions {
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
