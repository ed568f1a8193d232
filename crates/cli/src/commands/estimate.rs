//! `headroom estimate deepspeed|accelerate`: DeepSpeed's and Accelerate's own memory estimators,
//! reproduced with their printed formats, for side-by-side comparison with `headroom plan`.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use headroom_plan::estimators::{accelerate, deepspeed};
use headroom_plan::model::{ParamInventory, load_model};

#[derive(Debug, Subcommand)]
pub enum EstimateCommand {
    /// DeepSpeed's estimate_zero2/zero3_model_states_mem_needs_all_cold/_all_live.
    Deepspeed(DeepspeedArgs),
    /// `accelerate estimate-memory` for a model.
    Accelerate(AccelerateArgs),
}

#[derive(Debug, Args)]
pub struct DeepspeedArgs {
    /// ZeRO stage: 2 or 3.
    #[arg(long, value_parser = clap::value_parser!(u8).range(2..=3))]
    pub stage: u8,
    /// Total parameters (e.g. 2851e6), as in `_all_cold`.
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    pub params: Option<String>,
    /// Largest layer's parameters (ZeRO-3 with --params).
    #[arg(long, conflicts_with = "model")]
    pub largest_layer: Option<String>,
    /// A model whose counts to use, as in `_all_live`.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub gpus_per_node: u64,
    #[arg(long, default_value_t = 1)]
    pub nodes: u64,
    #[arg(long, default_value_t = 1.5)]
    pub additional_buffer_factor: f64,
}

#[derive(Debug, Args)]
pub struct AccelerateArgs {
    /// A built-in model or a Hugging Face config.json.
    #[arg(long)]
    pub model: String,
    /// Dtypes to show: float32, float16, int8, int4.
    #[arg(long, num_args = 1.., default_values_t = accelerate::DTYPES.map(String::from))]
    pub dtypes: Vec<String>,
}

pub fn run(cmd: EstimateCommand) -> Result<()> {
    match cmd {
        EstimateCommand::Deepspeed(a) => run_deepspeed(a),
        EstimateCommand::Accelerate(a) => run_accelerate(a),
    }
}

fn count(flag: &str, text: &str) -> Result<f64> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => bail!(
            "{flag} '{text}' is not a parameter count; accepted: a positive number such as 2851e6"
        ),
    }
}

fn run_deepspeed(a: DeepspeedArgs) -> Result<()> {
    if a.gpus_per_node == 0 || a.nodes == 0 {
        bail!("--gpus-per-node and --nodes must be at least 1");
    }
    if !(a.additional_buffer_factor.is_finite() && a.additional_buffer_factor > 0.0) {
        bail!("--additional-buffer-factor must be a positive number");
    }
    let (total, largest) = match (&a.model, &a.params) {
        (Some(m), _) => {
            let inv = ParamInventory::of(&load_model(m).with_context(|| format!("--model {m}"))?);
            (inv.total() as f64, Some(inv.largest_layer().1 as f64))
        }
        (None, Some(p)) => {
            let largest = a
                .largest_layer
                .as_deref()
                .map(|l| count("--largest-layer", l))
                .transpose()?;
            (count("--params", p)?, largest)
        }
        (None, None) => bail!("give --params N or --model X"),
    };
    let setup = deepspeed::EstimateSetup {
        gpus_per_node: a.gpus_per_node,
        nodes: a.nodes,
        additional_buffer_factor: a.additional_buffer_factor,
    };
    let text = if a.stage == 2 {
        deepspeed::render(total, None, setup, &deepspeed::zero2_rows(total, setup))
    } else {
        let Some(largest) = largest else {
            bail!(
                "--stage 3 with --params needs --largest-layer N (DeepSpeed's largest_layer_params)"
            );
        };
        deepspeed::render(
            total,
            Some(largest),
            setup,
            &deepspeed::zero3_rows(total, largest, setup),
        )
    };
    print!("{text}");
    Ok(())
}

fn run_accelerate(a: AccelerateArgs) -> Result<()> {
    for d in &a.dtypes {
        if !accelerate::DTYPES.contains(&d.as_str()) {
            bail!(
                "--dtypes '{d}' is not accepted; accepted: {}",
                accelerate::DTYPES.join(", ")
            );
        }
    }
    let spec = load_model(&a.model).with_context(|| format!("--model {}", a.model))?;
    let inv = ParamInventory::of(&spec);
    let dtypes: Vec<&str> = a.dtypes.iter().map(String::as_str).collect();
    println!(
        "{}",
        accelerate::render(&a.model, &accelerate::rows(&inv, &dtypes))
    );
    Ok(())
}
