//! The run configuration of `headroom train`: a TOML file (`--config FILE`, the same keys that
//! `headroom plan --emit headroom` writes) and command-line flags, where flags override the file,
//! resolved against the embedded defaults into one `RunConfig` that reports and checkpoints
//! record. Values use the planner's vocabulary (`fp32`, `bf16-mixed`, `adamw`, `every:2`, …).
//!
//! Not for: the model's shape (see the nn crate's model presets).

use crate::policy::CheckpointPolicy;
use headroom_memory::size::ByteSize;
use headroom_plan::strategy::{Attention, Precision};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Every key of the TOML file; each is optional and also settable by a flag.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Model preset name or path to a model TOML.
    pub model: Option<String>,
    pub layers: Option<usize>,
    pub width: Option<usize>,
    pub heads: Option<usize>,
    pub seq_len: Option<usize>,
    pub dropout: Option<f32>,
    pub precision: Option<String>,
    pub micro_batch: Option<usize>,
    pub accumulation: Option<usize>,
    pub optimizer: Option<String>,
    pub lr: Option<f32>,
    pub weight_decay: Option<f32>,
    pub grad_clip: Option<f32>,
    pub warmup_steps: Option<u64>,
    pub steps: Option<u64>,
    pub device_memory: Option<ByteSize>,
    pub seed: Option<u64>,
    pub eval_every: Option<u64>,
    pub eval_batches: Option<usize>,
    pub empty_cache_after_eval: Option<bool>,
    pub data: Option<PathBuf>,
    pub checkpoint: Option<String>,
    pub attention: Option<String>,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: Option<u64>,
    /// Retry a step that runs out of memory with half the micro-batch and twice the
    /// accumulation (default true).
    pub oom_recovery: Option<bool>,
    pub zero_stage: Option<u8>,
    pub offload_optimizer: Option<String>,
    pub offload_params: Option<String>,
}

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
}

/// Optimizers the engine runs, named as the planner names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerChoice {
    Sgd,
    SgdMomentum,
    Adamw,
    AdamwBf16,
    Lamb,
}

impl OptimizerChoice {
    const ACCEPTED: &'static str = "sgd, sgd-momentum, adamw, adamw-bf16, lamb";

    /// The name the TOML, the flags and the planner use.
    pub const fn name(self) -> &'static str {
        match self {
            OptimizerChoice::Sgd => "sgd",
            OptimizerChoice::SgdMomentum => "sgd-momentum",
            OptimizerChoice::Adamw => "adamw",
            OptimizerChoice::AdamwBf16 => "adamw-bf16",
            OptimizerChoice::Lamb => "lamb",
        }
    }

    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "sgd" => OptimizerChoice::Sgd,
            "sgd-momentum" => OptimizerChoice::SgdMomentum,
            "adamw" => OptimizerChoice::Adamw,
            "adamw-bf16" => OptimizerChoice::AdamwBf16,
            "lamb" => OptimizerChoice::Lamb,
            "adamw-8bit" | "adafactor" => {
                return Err(ConfigError::Value {
                    key: "optimizer",
                    value: s.into(),
                    reason: format!(
                        "the planner models it, but the engine does not run it yet; use one of {}",
                        Self::ACCEPTED
                    ),
                });
            }
            _ => {
                return Err(ConfigError::Value {
                    key: "optimizer",
                    value: s.into(),
                    reason: format!("accepted: {}", Self::ACCEPTED),
                });
            }
        })
    }
}

/// The resolved configuration of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub model: String,
    pub layers: Option<usize>,
    pub width: Option<usize>,
    pub heads: Option<usize>,
    pub seq_len: Option<usize>,
    pub dropout: Option<f32>,
    pub precision: String,
    pub micro_batch: usize,
    pub accumulation: usize,
    pub optimizer: OptimizerChoice,
    pub lr: f32,
    pub weight_decay: Option<f32>,
    pub grad_clip: Option<f32>,
    pub warmup_steps: u64,
    pub steps: u64,
    pub device_memory: u64,
    pub seed: u64,
    pub eval_every: u64,
    pub eval_batches: usize,
    pub empty_cache_after_eval: bool,
    pub data: Option<PathBuf>,
    pub checkpoint: String,
    pub attention: String,
    pub checkpoint_dir: Option<PathBuf>,
    pub checkpoint_every: u64,
    pub oom_recovery: bool,
}

impl RunConfig {
    pub fn precision(&self) -> Precision {
        self.precision.parse().expect("validated when resolved")
    }
    pub fn checkpoint_policy(&self) -> CheckpointPolicy {
        self.checkpoint.parse().expect("validated when resolved")
    }
    pub fn attention_kind(&self) -> Attention {
        self.attention.parse().expect("validated when resolved")
    }
    /// Sequences per optimizer step.
    pub fn effective_batch(&self) -> usize {
        self.micro_batch * self.accumulation
    }
}

/// The embedded defaults: a small GPT on the bundled corpus, a few hundred steps, 512 MiB of
/// device memory.
pub const DEFAULT_MODEL: &str = "gpt-small";
pub const DEFAULT_DEVICE_MEMORY: u64 = 512 << 20;
/// Sequences per optimizer step beyond which a configuration is surely a mistake (the token
/// batches alone would fill host memory).
pub const MAX_EFFECTIVE_BATCH: usize = 1 << 20;

impl TrainConfig {
    /// Reads a TOML file; unknown keys and bad values name the key and the line.
    pub fn from_file(path: &Path) -> Result<TrainConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: describe_toml_error(&text, &e),
        })
    }

    /// `self` with every key that `over` sets replaced (flags over file).
    pub fn overridden_by(self, over: TrainConfig) -> TrainConfig {
        macro_rules! pick {
            ($($f:ident),*) => { TrainConfig { $($f: over.$f.or(self.$f)),* } };
        }
        pick!(
            model,
            layers,
            width,
            heads,
            seq_len,
            dropout,
            precision,
            micro_batch,
            accumulation,
            optimizer,
            lr,
            weight_decay,
            grad_clip,
            warmup_steps,
            steps,
            device_memory,
            seed,
            eval_every,
            eval_batches,
            empty_cache_after_eval,
            data,
            checkpoint,
            attention,
            checkpoint_dir,
            checkpoint_every,
            oom_recovery,
            zero_stage,
            offload_optimizer,
            offload_params
        )
    }

    /// Fills defaults and checks every value.
    pub fn resolve(self) -> Result<RunConfig, ConfigError> {
        let value =
            |key: &'static str, v: &dyn std::fmt::Display, reason: &str| ConfigError::Value {
                key,
                value: v.to_string(),
                reason: reason.to_string(),
            };
        let precision = self.precision.unwrap_or_else(|| "fp32".into());
        precision.parse::<Precision>().map_err(|_| {
            value(
                "precision",
                &precision,
                "accepted: fp32, bf16-mixed, fp16-mixed, bf16",
            )
        })?;
        let checkpoint = self.checkpoint.unwrap_or_else(|| "none".into());
        checkpoint
            .parse::<CheckpointPolicy>()
            .map_err(|e| value("checkpoint", &checkpoint, &e))?;
        let attention = self.attention.unwrap_or_else(|| "naive".into());
        attention
            .parse::<Attention>()
            .map_err(|_| value("attention", &attention, "accepted: naive, memory-efficient"))?;
        let optimizer = OptimizerChoice::parse(self.optimizer.as_deref().unwrap_or("adamw"))?;
        if let Some(stage) = self.zero_stage.filter(|&s| s != 0) {
            return Err(value(
                "zero_stage",
                &stage,
                "the single-device engine runs ZeRO stage 0; sharding needs the distributed engine",
            ));
        }
        for (key, v) in [
            ("offload_optimizer", &self.offload_optimizer),
            ("offload_params", &self.offload_params),
        ] {
            if let Some(v) = v.as_ref().filter(|v| v.as_str() != "none") {
                return Err(value(
                    key,
                    v,
                    "offload is not available in the single-device engine yet; use none",
                ));
            }
        }
        let positive =
            |key: &'static str, v: Option<usize>, default: usize| -> Result<usize, ConfigError> {
                match v.unwrap_or(default) {
                    0 => Err(value(key, &0, "must be at least 1")),
                    n => Ok(n),
                }
            };
        let micro_batch = positive("micro_batch", self.micro_batch, 16)?;
        let accumulation = positive("accumulation", self.accumulation, 1)?;
        if micro_batch
            .checked_mul(accumulation)
            .is_none_or(|b| b > MAX_EFFECTIVE_BATCH)
        {
            return Err(value(
                "micro_batch",
                &format!("{micro_batch} × accumulation {accumulation}"),
                "is above 1,048,576 sequences per optimizer step; lower --micro-batch or --accumulation",
            ));
        }
        let eval_batches = positive("eval_batches", self.eval_batches, 4)?;
        for (key, v) in [
            ("layers", self.layers),
            ("width", self.width),
            ("heads", self.heads),
            ("seq_len", self.seq_len),
        ] {
            if v == Some(0) {
                return Err(value(key, &0, "must be at least 1"));
            }
        }
        let lr = self.lr.unwrap_or(match optimizer {
            OptimizerChoice::Sgd | OptimizerChoice::SgdMomentum => 0.1,
            OptimizerChoice::Lamb => 1e-2,
            _ => 3e-3,
        });
        if !(lr.is_finite() && lr > 0.0) {
            return Err(value("lr", &lr, "must be a positive number"));
        }
        if let Some(d) = self.dropout.filter(|d| !(0.0..1.0).contains(d)) {
            return Err(value("dropout", &d, "must be in [0, 1)"));
        }
        let device_memory = self.device_memory.map_or(DEFAULT_DEVICE_MEMORY, |b| b.0);
        if device_memory < (1 << 20) {
            return Err(value(
                "device_memory",
                &device_memory,
                "is below 1 MiB; give a size such as 512MiB or 2GiB",
            ));
        }
        Ok(RunConfig {
            model: self.model.unwrap_or_else(|| DEFAULT_MODEL.into()),
            layers: self.layers,
            width: self.width,
            heads: self.heads,
            seq_len: self.seq_len,
            dropout: self.dropout,
            precision,
            micro_batch,
            accumulation,
            optimizer,
            lr,
            weight_decay: self.weight_decay,
            // Clip to global norm 1.0 unless set; 0 (or less) turns clipping off.
            grad_clip: match self.grad_clip {
                None => Some(1.0),
                Some(c) if c > 0.0 => Some(c),
                Some(_) => None,
            },
            warmup_steps: self.warmup_steps.unwrap_or(20),
            steps: self.steps.unwrap_or(200),
            device_memory,
            seed: self.seed.unwrap_or(1337),
            eval_every: self.eval_every.unwrap_or(50),
            eval_batches,
            empty_cache_after_eval: self.empty_cache_after_eval.unwrap_or(false),
            data: self.data,
            checkpoint,
            attention,
            checkpoint_dir: self.checkpoint_dir,
            checkpoint_every: self.checkpoint_every.unwrap_or(0),
            oom_recovery: self.oom_recovery.unwrap_or(true),
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn flags_override_the_file_and_defaults_fill_the_rest() {
        let (_d, path) =
            file("precision = \"bf16-mixed\"\nmicro_batch = 4\ndevice_memory = \"256MiB\"\n");
        let from_file = TrainConfig::from_file(&path).unwrap();
        let flags = TrainConfig {
            micro_batch: Some(8),
            ..Default::default()
        };
        let run = from_file.overridden_by(flags).resolve().unwrap();
        assert_eq!(run.precision, "bf16-mixed");
        assert_eq!(run.micro_batch, 8);
        assert_eq!(run.device_memory, 256 << 20);
        assert_eq!(run.accumulation, 1);
        assert_eq!(run.model, DEFAULT_MODEL);
        assert_eq!(run.effective_batch(), 8);
    }

    #[test]
    fn the_planners_export_is_accepted() {
        let text = "precision = \"fp32\"\nmicro_batch = 2\naccumulation = 4\ncheckpoint = \"none\"\nattention = \"naive\"\noptimizer = \"adamw\"\nzero_stage = 0\noffload_optimizer = \"none\"\noffload_params = \"none\"\ndevice_memory = 85899345920\n";
        let (_d, path) = file(text);
        let run = TrainConfig::from_file(&path).unwrap().resolve().unwrap();
        assert_eq!(run.effective_batch(), 8);
        assert_eq!(run.device_memory, 80 << 30);
    }

    #[test]
    fn malformed_files_name_the_key_and_line() {
        let (_d, path) = file("steps = 10\nmicro_bach = 4\n");
        let e = TrainConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("micro_bach"), "{e}");
        let (_d, path) = file("steps = \"ten\"\n");
        let e = TrainConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("steps"), "{e}");
        let (_d, path) = file("device_memory = \"lots\"\n");
        let e = TrainConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("GiB = 2^30"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_the_accepted_values() {
        let cases = [
            (
                TrainConfig {
                    precision: Some("fp8".into()),
                    ..Default::default()
                },
                "bf16-mixed",
            ),
            (
                TrainConfig {
                    optimizer: Some("adagrad".into()),
                    ..Default::default()
                },
                "sgd-momentum",
            ),
            (
                TrainConfig {
                    optimizer: Some("adafactor".into()),
                    ..Default::default()
                },
                "does not run it yet",
            ),
            (
                TrainConfig {
                    micro_batch: Some(0),
                    ..Default::default()
                },
                "micro_batch",
            ),
            (
                TrainConfig {
                    micro_batch: Some(1 << 40),
                    accumulation: Some(1 << 30),
                    ..Default::default()
                },
                "1,048,576 sequences",
            ),
            (
                TrainConfig {
                    zero_stage: Some(2),
                    ..Default::default()
                },
                "zero_stage",
            ),
            (
                TrainConfig {
                    checkpoint: Some("every:0".into()),
                    ..Default::default()
                },
                "checkpoint",
            ),
        ];
        for (config, needle) in cases {
            let e = config.resolve().unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }
}
