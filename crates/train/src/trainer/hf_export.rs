//! `--hf-out DIR`: the trained model written back as the Hugging Face tools read it, at the
//! run's end. Without LoRA, a model directory (`config.json`, `model.safetensors`) that
//! transformers' `from_pretrained` loads; with LoRA, PEFT's adapter directory
//! (`adapter_config.json`, `adapter_model.safetensors`) over the base the run started from, or
//! with `--hf-merge` the merged model. The weights are the parameters the run computes with
//! (widened to f32), so the exported model's loss is the run's.
//!
//! Not for: headroom's own saves, which resume a run (`save.rs`).

use super::{TrainError, Trainer};
use crate::config::{ConfigError, RunConfig};
use crate::save::widen;
use headroom_nn::Model;
use headroom_nn::checkpoint::{is_gguf, is_hf_dir, write_hf_dir, write_peft_adapter};
use headroom_tensor::TensorError;
use std::path::Path;

/// Refuses `--hf-out` on a model without a Hugging Face layout, or naming a file, before any
/// step runs.
pub(super) fn check_hf_out(config: &RunConfig, model: &dyn Model) -> Result<(), TrainError> {
    match (&config.hf_out, model.hugging_face()) {
        (Some(dir), None) => Err(TrainError::Config(ConfigError::Value {
            key: "hf_out",
            value: dir.display().to_string(),
            reason: format!(
                "'{}' is one of headroom's own models, which has no Hugging Face layout; --hf-out writes Llama-family models (--model DIR with a config.json); use --save-dir to save this run",
                config.model
            ),
        })),
        // Refused before training rather than after it.
        (Some(dir), Some(_)) if dir.exists() && !dir.is_dir() => {
            Err(TrainError::Config(ConfigError::Value {
                key: "hf_out",
                value: dir.display().to_string(),
                reason: "is a file; --hf-out names a directory to write the model into (created when missing)".into(),
            }))
        }
        _ => Ok(()),
    }
}

impl Trainer {
    /// Writes the model into `dir` as a Hugging Face directory. Every rank calls it (ZeRO-3
    /// gathers the parameter shards); rank 0 writes.
    pub fn export_hf(&mut self, dir: &Path) -> Result<(), TrainError> {
        // A dry run holds no values to write (nor gathers them).
        if self.dry {
            return Ok(());
        }
        let Some(whole) = self.whole_parameters()? else {
            return Ok(());
        };
        let engine = |msg: String| TrainError::Engine(TensorError::invalid("--hf-out", msg));
        let trained = self
            .model
            .blocks()
            .iter()
            .map(|b| {
                let t = whole
                    .get(b.name())
                    .ok_or_else(|| engine(format!("block {} was not gathered", b.name())))?;
                Ok(widen(&t.data, t.dtype))
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        let hf = self
            .model
            .hugging_face()
            .ok_or_else(|| engine("the model has no Hugging Face layout".into()))?;
        let source = Path::new(&self.config.model);
        let tokenizer = match crate::pretrained::tokenizer(&self.config.model)? {
            Some(t) => Some(t.bytes()?),
            None => None,
        };
        // The source's config.json keeps what headroom does not model (token ids, dtype); a
        // resized model gets its own.
        let resized = [self.config.layers, self.config.width, self.config.heads]
            .iter()
            .any(Option::is_some);
        let config_json = match (is_hf_dir(source), is_gguf(source), resized) {
            (true, _, false) => std::fs::read_to_string(source.join("config.json"))
                .map_err(|e| engine(format!("{}: {e}", source.display())))?,
            (_, true, false) => match crate::pretrained::checkpoint(&self.config.model)? {
                Some(p) => p.config_json()?,
                None => hf.config_json(),
            },
            _ => hf.config_json(),
        };
        let lora = !self.model.frozen_blocks().is_empty();
        if !lora {
            let tensors = hf.state(&trained)?;
            write_hf_dir(dir, &config_json, &tensors, tokenizer.as_deref())?;
        } else if self.config.hf_merge {
            let merged = self
                .model
                .merged_blocks(&trained)?
                .ok_or_else(|| engine("the adapters could not be merged".into()))?;
            let values: Vec<Vec<f32>> = merged.into_iter().map(|(_, v)| v).collect();
            let tensors = hf.state(&values)?;
            write_hf_dir(dir, &config_json, &tensors, tokenizer.as_deref())?;
        } else {
            let base = std::fs::canonicalize(source)
                .map_or_else(|_| self.config.model.clone(), |p| p.display().to_string());
            let (config, tensors) = hf
                .adapters(&base, &trained)?
                .ok_or_else(|| engine("the model has no adapters".into()))?;
            write_peft_adapter(dir, &config, &tensors, tokenizer.as_deref())?;
        }
        Ok(())
    }
}
