//! What a `--model` naming a Hugging Face model directory brings besides its shape: the
//! pretrained weights the run starts from, and the tokenizer its text is read with.
//!
//! Not for: the model's shape (`headroom_nn::models::ModelSpec::resolve`) or reading the files
//! (`headroom_nn::checkpoint`).

use headroom_nn::checkpoint::{CheckpointError, HfCheckpoint, is_hf_dir};
use std::path::{Path, PathBuf};

/// The checkpoint `model` names, when it names a directory that holds weights.
pub fn checkpoint(model: &str) -> Result<Option<HfCheckpoint>, CheckpointError> {
    let path = Path::new(model);
    if !is_hf_dir(path) {
        return Ok(None);
    }
    let checkpoint = HfCheckpoint::open(path)?;
    Ok(checkpoint.has_weights().then_some(checkpoint))
}

/// The `tokenizer.json` of the model directory `model` names, if it has one.
pub fn tokenizer(model: &str) -> Option<PathBuf> {
    let path = Path::new(model);
    is_hf_dir(path)
        .then(|| path.join("tokenizer.json"))
        .filter(|p| p.is_file())
}
