//! `--init-from SAVE`: a run that starts from another run's weights instead of the seed's
//! initialisation — a LoRA fine-tune of a pretrained base, or a plain run continuing from a
//! merged LoRA model. The weights come from the save's `merged` group when it has one (a LoRA
//! run's base with its adapters folded in) and from its `model` group otherwise, block by block
//! under the plain model's names; each is loaded into the block of that name, or under LoRA
//! into the frozen base (QLoRA re-quantises its projections). Only weights are taken: the step,
//! the optimizer state and the data position start afresh (that is `--resume`).
//!
//! Not for: continuing a run (see `save.rs`).

use super::TrainError;
use crate::config::ConfigError;
use crate::save::{self, SaveError};
use headroom_nn::Model;
use std::path::Path;

fn bad(path: &Path, reason: String) -> TrainError {
    TrainError::Config(ConfigError::Value {
        key: "init_from",
        value: path.display().to_string(),
        reason,
    })
}

/// Loads the weights of the save at `path` into `model`, checking every block's size (a dry
/// run's model, `dry`, holds no values: it checks only).
pub(super) fn init_from(model: &mut dyn Model, path: &Path, dry: bool) -> Result<(), TrainError> {
    let (_, groups) = save::read(path).map_err(|e| match e {
        SaveError::Missing { reason, .. } => bad(
            path,
            format!(
                "{reason}; give a directory written by --save-dir or one of its step-NNNNNN folders"
            ),
        ),
        other => TrainError::Save(other),
    })?;
    let (group, source) = match groups.get("merged") {
        Some(g) => (g, "merged"),
        None => (
            groups
                .get("model")
                .ok_or_else(|| bad(path, "the save holds no model weights".into()))?,
            "model",
        ),
    };
    for (name, numel) in model.plain_blocks() {
        let t = group.get(&name).ok_or_else(|| {
            bad(
                path,
                format!("its {source} weights have no block {name}: the save is of another model (give the same --model, --layers, --width and --heads)"),
            )
        })?;
        let v = save::widen(&t.data, t.dtype);
        if v.len() != numel {
            return Err(bad(
                path,
                format!(
                    "block {name} has {} elements there and {numel} here: the save is of another model shape",
                    v.len()
                ),
            ));
        }
        if !dry {
            model.load_plain_block(&name, &v)?;
        }
    }
    Ok(())
}
