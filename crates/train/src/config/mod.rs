//! The run configuration of `headroom train`: a TOML file (`--config FILE`, the same keys that
//! `headroom plan --emit headroom` writes) and command-line flags — both read into one
//! `TrainConfig`, whose fields are the flags (clap derives them from it) and the TOML keys —
//! where flags override the file, resolved against the embedded defaults into one `RunConfig`
//! that reports and saved runs record. Strategy values are the vocabulary's types (`fp32`,
//! `bf16-mixed`, `adamw`, `every:2`, …), parsed once, with one message per bad value.
//!
//! Not for: the model's shape (see the nn crate's model presets).

mod keys;
mod levers;
mod mesh;
mod read;
mod resolve;
mod resume;
mod run;
#[cfg(test)]
mod tests;

pub use keys::TrainConfig;
pub use levers::Levers;
pub use mesh::DETERMINISTIC_CHUNKS;
pub use resolve::MAX_COLLECTIVE_TIMEOUT_S;
pub use run::{DEFAULT_DEVICE_MEMORY, DEFAULT_MODEL, MAX_EFFECTIVE_BATCH, RunConfig};

use std::path::PathBuf;

/// A configuration that cannot run; names the key (and the line, for files) and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{key} = {value:?}: {reason}")]
    Value {
        key: &'static str,
        value: String,
        reason: String,
    },
    #[error(transparent)]
    Strategy(#[from] headroom_strategy::StrategyError),
}

/// toml's message plus the offending line, so a user sees the key in context.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().to_string();
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let content = text.lines().nth(line - 1).unwrap_or("").trim();
            format!("line {line}: {message} (in `{content}`)")
        }
        None => message,
    }
}
