//! `headroom params`: the exact parameter count of a model, its largest layer (DeepSpeed's
//! definition: most parameters owned directly by one module) and a per-module breakdown. The
//! model is named as for `train` and `plan`: one of headroom's own (a preset or a model TOML)
//! or a Hugging Face model.

use super::plan_output::group_digits;
use anyhow::{Context, Result};
use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use headroom_plan::model::ParamInventory;
use headroom_train::models::{accepted_models, planner_model};
use serde_json::json;

/// Count the parameters of a model.
#[derive(Debug, Args)]
#[command(after_help = format!("Models: {}.", accepted_models()))]
pub struct ParamsArgs {
    /// One of headroom's own models (a preset or a model TOML), a built-in Hugging Face model,
    /// or a Hugging Face config.json.
    #[arg(long)]
    pub model: String,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ParamsArgs) -> Result<()> {
    let (spec, model_type) =
        planner_model(&args.model).with_context(|| format!("--model {}", args.model))?;
    let inv = ParamInventory::of(&spec);
    let (largest_name, largest) = inv.largest_layer();
    let groups = inv.groups();
    if args.json {
        let value = json!({
            "model": spec.name,
            "model_type": model_type,
            "total": inv.total(),
            "largest_layer": { "name": largest_name, "params": largest },
            "modules": groups,
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    println!("{} ({})", spec.name, model_type);
    println!("total parameters: {}", group_digits(inv.total()));
    println!(
        "largest layer:    {largest_name} ({})",
        group_digits(largest)
    );
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["module", "count", "params each", "params total"]);
    for g in &groups {
        t.add_row([
            g.name.clone(),
            g.count.to_string(),
            group_digits(g.params_each),
            group_digits(g.params_total),
        ]);
    }
    println!("{t}");
    Ok(())
}
