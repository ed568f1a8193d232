//! The hardware `headroom plan` plans for: the GPU preset, then the `--hardware` TOML, then the
//! flags, each overriding the one before.
//!
//! Not for: the presets and fields themselves (`headroom_plan::hardware`).

use super::plan_args::PlanArgs;
use anyhow::{Context, Result, bail};
use headroom_plan::hardware::{self, Hardware, HardwareOverrides};
use std::path::Path;

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
