//! One model namespace for every command: a `--model` value names one of headroom's own models
//! (a preset of the nn crate or a model TOML: trained, and planned by dry runs) or a Hugging
//! Face model (a built-in config, a built-in Hub id or a path to a `config.json`: planned
//! analytically). `headroom train`, `plan` and `params` resolve names here, so a name that one
//! command accepts the others read the same way, and an unknown name gets one message listing
//! both namespaces.
//!
//! Not for: building a model (the nn crate) or its cost (the planner).

use crate::config::RunConfig;
use crate::predict::analytical::planner_spec;
use crate::trainer::{TrainError, model_spec};
use headroom_nn::checkpoint::{Pretrained, is_gguf, is_hf_dir};
use headroom_nn::models::llama::Family as LlamaFamily;
use headroom_nn::models::presets::PRESETS;
use headroom_nn::models::{ModelSpec as OwnSpec, ModelSpecError, preset};
use headroom_plan::PlanError;
use headroom_plan::model::{Architecture as PlannerSpec, PRESET_NAMES, load_model, parse_config};
use std::path::Path;

/// A `--model` value that names nothing, or names a model that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ModelNameError {
    #[error("unknown model '{name}' (and no file of that name); accepted: {accepted}")]
    Unknown { name: String, accepted: String },
    #[error(transparent)]
    Own(#[from] ModelSpecError),
    #[error(transparent)]
    Shape(#[from] headroom_tensor::TensorError),
    #[error(transparent)]
    HuggingFace(PlanError),
}

/// The shape of one of headroom's own models, as reports describe it.
#[derive(Clone, Debug, PartialEq)]
pub struct OwnModel {
    /// `headroom-gpt` or `headroom-resmlp`.
    pub model_type: &'static str,
    /// Every parameter, trainable or frozen.
    pub params: usize,
    /// The parameters that train (the adapters only, under LoRA).
    pub trainable_params: usize,
    /// Blocks.
    pub depth: usize,
    pub hidden_size: usize,
    pub vocab_size: usize,
}

impl OwnModel {
    /// The model `config` trains (its preset or file with the overrides applied).
    pub fn of(config: &RunConfig) -> Result<OwnModel, TrainError> {
        let spec = model_spec(config)?;
        let hidden_size = spec.mlp_widths().0;
        let (vocab_size, trainable_params) = (
            spec.vocab(),
            spec.trainable_params().map_err(TrainError::Engine)?,
        );
        Ok(OwnModel {
            model_type: own_model_type(&spec),
            params: spec.num_params(),
            trainable_params,
            depth: spec.depth(),
            hidden_size,
            vocab_size,
        })
    }
}

fn own_model_type(spec: &OwnSpec) -> &'static str {
    match spec {
        OwnSpec::Gpt(_) => "headroom-gpt",
        OwnSpec::Resmlp(_) => "headroom-resmlp",
        OwnSpec::Llama(c) => match c.family {
            LlamaFamily::Llama => "llama",
            LlamaFamily::Mistral => "mistral",
            LlamaFamily::Qwen2 => "qwen2",
        },
    }
}

/// What `--model` accepts, in both namespaces.
pub fn accepted_models() -> String {
    format!(
        "headroom's own models {} or a model TOML (kind = \"gpt\" or \"resmlp\"), the built-in Hugging Face models {}, or a path to a Hugging Face config.json",
        PRESETS.join(", "),
        PRESET_NAMES.join(", ")
    )
}

/// Whether `name` names one of headroom's own models (a preset or a model TOML) rather than a
/// Hugging Face model.
pub fn is_own_model(name: &str) -> bool {
    preset(name).is_some() || name.ends_with(".toml")
}

/// Whether `name` names a model headroom's engine can build: one of its own, or a pretrained
/// model of the Llama family (a Hugging Face directory, a GGUF file), which both namespaces
/// read.
pub fn is_engine_model(name: &str) -> bool {
    is_own_model(name)
        || ((is_hf_dir(Path::new(name)) || is_gguf(Path::new(name)))
            && matches!(OwnSpec::resolve(name), Ok(OwnSpec::Llama(_))))
}

/// The Hugging Face model `name` names (the planner's reading of it; a GGUF file through the
/// `config.json` its metadata gives).
pub fn hugging_face_model(name: &str) -> Result<PlannerSpec, ModelNameError> {
    if is_gguf(Path::new(name)) {
        let config = Pretrained::open(Path::new(name))
            .and_then(|p| p.map(|p| p.config_json()).transpose())
            .map_err(|e| {
                ModelNameError::Own(ModelSpecError::File {
                    path: name.to_string(),
                    message: e.to_string(),
                })
            })?
            .unwrap_or_default();
        return parse_config(name, &config).map_err(ModelNameError::HuggingFace);
    }
    load_model(name).map_err(|e| match e {
        PlanError::UnknownModel { .. } => ModelNameError::Unknown {
            name: name.to_string(),
            accepted: accepted_models(),
        },
        other => ModelNameError::HuggingFace(other),
    })
}

/// The planner's description of the model `name` names, in either namespace, and its
/// `model_type` (`headroom-gpt` and `headroom-resmlp` for headroom's own).
pub fn planner_model(name: &str) -> Result<(PlannerSpec, &'static str), ModelNameError> {
    if !is_own_model(name) {
        let spec = hugging_face_model(name)?;
        let model_type = spec.family.model_type();
        return Ok((spec, model_type));
    }
    let own = OwnSpec::resolve(name)?;
    own.validate()?;
    Ok((planner_spec(name, &own), own_model_type(&own)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_plan::model::ParamInventory;

    #[test]
    fn both_namespaces_resolve_and_an_unknown_name_lists_both() {
        // gpt-small: 4 blocks of width 128 over a 256-token vocabulary, context 128, tied head.
        // Embeddings 256·128 + 128·128; a block holds two norms (2·2·128), the attention's
        // qkv and output projections (128·384 + 384 + 128·128 + 128) and the MLP
        // (128·512 + 512 + 512·128 + 128); the final norm 2·128.
        let block = 2 * 2 * 128
            + (128 * 384 + 384)
            + (128 * 128 + 128)
            + (128 * 512 + 512)
            + (512 * 128 + 128);
        let expected = 256 * 128 + 128 * 128 + 4 * block + 2 * 128;
        let (spec, model_type) = planner_model("gpt-small").unwrap();
        assert_eq!(model_type, "headroom-gpt");
        assert_eq!(ParamInventory::of(&spec).total(), expected);
        let (spec, model_type) = planner_model("gpt2").unwrap();
        assert_eq!((spec.family.model_type(), model_type), ("gpt2", "gpt2"));
        let e = planner_model("gpt-smal").unwrap_err().to_string();
        assert!(
            e.contains("'gpt-smal'") && e.contains("gpt-small") && e.contains("gpt2"),
            "{e}"
        );
    }
}
