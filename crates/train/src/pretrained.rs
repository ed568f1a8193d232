//! What a `--model` naming a pretrained model brings besides its shape (a Hugging Face model
//! directory, or a GGUF file): the weights the run starts from, and the tokenizer its text is
//! read with.
//!
//! Not for: the model's shape (`headroom_nn::models::ModelSpec::resolve`) or reading the files
//! (`headroom_nn::checkpoint`).

use headroom_nn::checkpoint::{CheckpointError, Pretrained, TokenizerSource, is_gguf, is_hf_dir};
use std::path::Path;

/// The pretrained weights `model` names, if it names a directory that holds weights or a GGUF
/// file.
pub fn checkpoint(model: &str) -> Result<Option<Pretrained>, CheckpointError> {
    Pretrained::open(Path::new(model))
}

/// The tokenizer of the model `model` names: a directory's `tokenizer.json` (also beside a
/// `config.json` alone), or the one in a GGUF file's metadata.
pub fn tokenizer(model: &str) -> Result<Option<TokenizerSource>, CheckpointError> {
    let path = Path::new(model);
    if is_hf_dir(path) {
        let file = path.join("tokenizer.json");
        return Ok(file.is_file().then_some(TokenizerSource::File(file)));
    }
    if is_gguf(path) {
        return Ok(checkpoint(model)?
            .map(|p| p.tokenizer())
            .transpose()?
            .flatten());
    }
    Ok(None)
}
