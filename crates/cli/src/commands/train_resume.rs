//! Continuing a `headroom train` run: the configuration a resumed run continues with (the
//! saved one, changed only where the flags soundly may), and how a stopped run says to resume.
//!
//! Not for: saving and reading saves (`headroom_train::save`).

use crate::signals::name;
use anyhow::Context;
use headroom_train::config::{RunConfig, TrainConfig};
use headroom_train::launch::Stopped;
use headroom_train::save;
use std::path::Path;

/// The configuration a resumed run continues with: the saved one, changed only where `keys`
/// (file and flags) soundly may, each change printed; saves go on into the resumed directory
/// unless a save directory is given.
pub(super) fn resumed_config(dir: &Path, keys: &TrainConfig) -> anyhow::Result<RunConfig> {
    let (manifest, save) = save::read_manifest(dir)?;
    let saved: RunConfig = serde_json::from_value(manifest.config).with_context(|| {
        format!(
            "{}: the saved configuration cannot be read",
            save.join("manifest.json").display()
        )
    })?;
    let (mut config, changes) = saved.resumed_with(keys)?;
    if keys.save_dir.is_none() {
        config.save_dir = Some(save::root_of(&save));
    }
    eprintln!(
        "resume: step {} of {} with the saved strategy ({})",
        manifest.step,
        save.display(),
        config.strategy.describe(true)
    );
    for change in &changes {
        eprintln!("resume: changed {change}");
    }
    Ok(config)
}

/// How a run stopped by `signal` and saved continues.
pub(super) fn print_resume_hint(signal: i32, stopped: &Stopped, steps: u64) {
    eprintln!(
        "{} after step {} of {steps}: saved to {}; continue with: headroom train --resume {}",
        name(signal),
        stopped.step,
        stopped.save.display(),
        stopped.root.display()
    );
}
