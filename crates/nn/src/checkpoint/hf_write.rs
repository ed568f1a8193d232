//! Writing a model back as the Hugging Face tools read it: a model directory (`config.json`,
//! `model.safetensors`) that transformers' `from_pretrained` loads, or a LoRA adapter directory
//! (`adapter_config.json`, `adapter_model.safetensors`) that PEFT's `PeftModel.from_pretrained`
//! loads over its base. A `tokenizer.json`, when given, is written beside them. Every file is
//! written to a temporary file and renamed into place, so an interrupted export leaves the old
//! file or the new, never half of one.
//!
//! Not for: choosing the tensors' names and layout (the model's `HuggingFace` side).

use super::CheckpointError;
use super::safetensors_io::write_f32;
use headroom_memory::output::write_output;
use std::path::Path;

/// A tensor in a checkpoint's layout: its name, its shape and its values (row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// Writes a model directory into `dir` (created when missing).
pub fn write_hf_dir(
    dir: &Path,
    config_json: &str,
    tensors: &[NamedTensor],
    tokenizer: Option<&[u8]>,
) -> Result<(), CheckpointError> {
    write_dir(
        dir,
        ("config.json", config_json),
        "model.safetensors",
        tensors,
        tokenizer,
    )
}

/// Writes a PEFT LoRA adapter directory into `dir` (created when missing).
pub fn write_peft_adapter(
    dir: &Path,
    adapter_config: &str,
    tensors: &[NamedTensor],
    tokenizer: Option<&[u8]>,
) -> Result<(), CheckpointError> {
    write_dir(
        dir,
        ("adapter_config.json", adapter_config),
        "adapter_model.safetensors",
        tensors,
        tokenizer,
    )
}

fn write_dir(
    dir: &Path,
    (json_name, json): (&str, &str),
    weights_name: &str,
    tensors: &[NamedTensor],
    tokenizer: Option<&[u8]>,
) -> Result<(), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, e))?;
    write_f32(&dir.join(weights_name), tensors)?;
    let json_path = dir.join(json_name);
    write_output(&json_path, json.as_bytes()).map_err(|e| CheckpointError::io(&json_path, e))?;
    if let Some(bytes) = tokenizer {
        let out = dir.join("tokenizer.json");
        write_output(&out, bytes).map_err(|e| CheckpointError::io(&out, e))?;
    }
    Ok(())
}
