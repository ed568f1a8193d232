//! Typed errors of the planner. Every message names the offending field or input and the values
//! that would have been accepted, so the CLI can print it as is.
//!
//! Not for: I/O context such as which command was running (the binary adds that with `anyhow`).

use std::path::PathBuf;

/// Everything that can go wrong while reading a model, hardware or workload, or exporting a plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// config.json is not valid JSON.
    #[error("config.json is not valid JSON: {0}")]
    ConfigSyntax(String),

    /// config.json has a `model_type` the planner does not know.
    #[error(
        "unsupported model_type '{0}' in config.json; accepted: llama, mistral, mixtral, qwen2, qwen2_moe, gemma, gemma2, phi3, gpt2, gpt_neox, bert, t5"
    )]
    UnsupportedModelType(String),

    /// A field of config.json is missing or has a value that cannot be used.
    #[error("config.json field '{field}' {problem}; expected {expected}")]
    ConfigField {
        field: String,
        problem: String,
        expected: String,
    },

    /// A model name that is neither a preset nor a readable file.
    #[error(
        "unknown model preset '{name}' (and no file of that name); accepted presets: {accepted}, or a path to a Hugging Face config.json"
    )]
    UnknownModel { name: String, accepted: String },

    /// A Hugging Face Hub id (`org/name`) that is not built in and no file of that name.
    #[error(
        "'{id}' is a Hugging Face Hub id that is not built in (and no file of that name); download its config.json (huggingface-cli download {id} config.json --local-dir DIR, or https://huggingface.co/{id}/resolve/main/config.json) and pass its path; built-in Hub ids: {accepted}"
    )]
    UnknownHubModel { id: String, accepted: String },

    /// A GPU preset name that is not known.
    #[error("unknown GPU preset '{name}' (nearest: {nearest}); accepted: {accepted}")]
    UnknownGpu {
        name: String,
        nearest: String,
        accepted: String,
    },

    /// A GPU name that starts several presets.
    #[error("GPU '{name}' matches several presets: {candidates}; name one of them")]
    AmbiguousGpu { name: String, candidates: String },

    /// A hardware or cost-model value that is out of range.
    #[error("hardware field '{field}' {problem}; expected {expected}")]
    Hardware {
        field: String,
        problem: String,
        expected: String,
    },

    /// The hardware TOML could not be parsed.
    #[error("hardware file is not valid: {0}")]
    HardwareToml(String),

    /// The batch cannot be split over the devices as asked.
    #[error("impossible batch: {0}")]
    Batch(String),

    /// A strategy value (precision, optimizer, …) that is not known.
    #[error(transparent)]
    Strategy(#[from] headroom_strategy::StrategyError),

    /// Pinned strategy parts that cannot be combined.
    #[error("incompatible strategy: {0}")]
    Incompatible(String),

    /// A mesh pin (`--tp`, `--pp`, `--pp-schedule`, `--microbatches`, `--sequence-parallel`) the
    /// model, batch or cluster cannot take, with the constraint it breaks.
    #[error("mesh: {0}")]
    Mesh(String),

    /// A `--calibrate` file that cannot be read as a measurement of this run.
    #[error("calibration file: {0}")]
    Calibration(String),

    /// A plan cannot be expressed in an export format.
    #[error("cannot export to {format}: {reason}")]
    Export { format: String, reason: String },

    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Result alias of the planner.
pub type Result<T> = std::result::Result<T, PlanError>;
