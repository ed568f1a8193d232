//! `--init-from SAVE`: a run that starts from another run's weights instead of the seed's
//! initialisation — a LoRA fine-tune of a pretrained base, or a plain run continuing from a
//! merged LoRA model. The weights come from the save's `merged` group when it has one (a LoRA
//! run's base with its adapters folded in) and from its `model` group otherwise, block by block
//! under the plain model's names; each is loaded into the block of that name, or under LoRA
//! into the frozen base (QLoRA re-quantises its projections). Only weights are taken: the step,
//! the optimizer state and the data position start afresh (that is `--resume`). The saved
//! model's shape (kind, layers, heads, width, vocabulary) must be this run's: a block of equal
//! size is not enough (the heads split a width without changing a block's size), and a save
//! with blocks this model lacks (more layers) is refused, never cut short.
//!
//! Not for: continuing a run (see `save.rs`).

use super::TrainError;
use crate::config::{ConfigError, RunConfig};
use crate::save::{self, Manifest, SaveError};
use headroom_nn::Model;
use headroom_nn::models::ModelSpec;
use std::path::Path;

fn bad(path: &Path, reason: String) -> TrainError {
    TrainError::Config(ConfigError::Value {
        key: "init_from",
        value: path.display().to_string(),
        reason,
    })
}

/// The model a save's run trained, when its configuration can still be resolved (a model
/// file it names may be gone: the blocks are then checked alone).
fn saved_spec(manifest: &Manifest) -> Option<ModelSpec> {
    let saved: RunConfig = serde_json::from_value(manifest.config.clone()).ok()?;
    let spec = ModelSpec::resolve(&saved.model).ok()?;
    Some(spec.with_overrides(saved.layers, saved.width, saved.heads, saved.seq_len))
}

/// The first shape field where the saved model (`saved`) and this run's (`now`) differ: its
/// flag, the saved value and this run's.
fn shape_mismatch(saved: &ModelSpec, now: &ModelSpec) -> Option<(&'static str, String, String)> {
    let differ = |flag, a: usize, b: usize| (a != b).then(|| (flag, a.to_string(), b.to_string()));
    match (saved, now) {
        (ModelSpec::Gpt(a), ModelSpec::Gpt(b)) => differ("--layers", a.layers, b.layers)
            .or_else(|| differ("--heads", a.heads, b.heads))
            .or_else(|| differ("--width", a.width, b.width))
            .or_else(|| differ("the vocabulary", a.vocab, b.vocab)),
        (ModelSpec::Resmlp(a), ModelSpec::Resmlp(b)) => {
            differ("--layers", a.depth, b.depth).or_else(|| differ("--width", a.width, b.width))
        }
        (ModelSpec::Llama(a), ModelSpec::Llama(b)) => differ("--layers", a.layers, b.layers)
            .or_else(|| differ("--heads", a.heads, b.heads))
            .or_else(|| differ("the key/value heads", a.kv_heads, b.kv_heads))
            .or_else(|| differ("--width", a.width, b.width))
            .or_else(|| differ("the MLP width", a.ffn, b.ffn))
            .or_else(|| differ("the vocabulary", a.vocab, b.vocab)),
        (a, b) => {
            let kind = |s: &ModelSpec| match s {
                ModelSpec::Gpt(_) => "a GPT".to_string(),
                ModelSpec::Resmlp(_) => "a residual MLP".to_string(),
                ModelSpec::Llama(_) => "a Llama-family model".to_string(),
            };
            Some(("--model", kind(a), kind(b)))
        }
    }
}

/// Loads the weights of the save at `path` into `model` (built from `spec`), checking the
/// saved model's shape and every block's size (a dry run's model, `dry`, holds no values: it
/// checks only).
pub(super) fn init_from(
    model: &mut dyn Model,
    spec: &ModelSpec,
    path: &Path,
    dry: bool,
) -> Result<(), TrainError> {
    let (manifest, groups) = save::read(path).map_err(|e| match e {
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
    if let Some((flag, saved, now)) = saved_spec(&manifest).and_then(|s| shape_mismatch(&s, spec)) {
        return Err(bad(
            path,
            format!(
                "the save is of a model with {flag} {saved}, this run's has {now}: give the saved run's model and shape (--model, --layers, --heads, --width) to start from its weights"
            ),
        ));
    }
    let blocks = model.plain_blocks();
    if let Some(extra) = group
        .keys()
        .find(|k| !blocks.iter().any(|(name, _)| name == *k))
    {
        return Err(bad(
            path,
            format!(
                "its {source} weights hold block {extra}, which this model lacks: the save is of a larger model (give its --layers)"
            ),
        ));
    }
    for (name, numel) in blocks {
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
