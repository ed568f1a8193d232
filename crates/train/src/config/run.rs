//! The resolved configuration of a run (`RunConfig`): every key filled, the strategy typed and
//! checked, as reports and saved runs record it; and the embedded defaults.
//!
//! Not for: reading files and flags (see `keys`, `read`).

use crate::data::SamplerKind;
use headroom_strategy::Strategy;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The resolved configuration of a run. The strategy's keys sit flat beside the others in
/// reports and saved runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub model: String,
    /// LoRA adapters on a frozen base; `None` trains every weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<headroom_strategy::Lora>,
    /// The save whose weights the run starts from, if not the seed's initialisation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<PathBuf>,
    pub layers: Option<usize>,
    pub width: Option<usize>,
    pub heads: Option<usize>,
    pub seq_len: Option<usize>,
    pub dropout: Option<f32>,
    #[serde(flatten)]
    pub strategy: Strategy,
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
    /// The device allocator.
    #[serde(default)]
    pub allocator: headroom_memory::AllocatorKind,
    pub data: Option<PathBuf>,
    #[serde(alias = "checkpoint_dir")]
    pub save_dir: Option<PathBuf>,
    #[serde(alias = "checkpoint_every")]
    pub save_every: u64,
    /// Where the run's end writes the model as a Hugging Face directory (PEFT's adapters
    /// under LoRA unless `hf_merge`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_out: Option<PathBuf>,
    #[serde(default)]
    pub hf_merge: bool,
    pub oom_recovery: bool,
    /// fp32 too sums each micro-batch's gradient whole into an f32 buffer, in order (16-bit
    /// gradients always do).
    #[serde(default)]
    pub deterministic: bool,
    /// Ranks of the data-parallel group (DDP over the in-process communicator); 1 without.
    #[serde(default = "one")]
    pub data_parallel: usize,
    /// Ranks the GPT's layers are split over (tensor parallelism); `None` runs them whole.
    /// `Some(1)` is the unsplit run laid out as a split one (its sums chunked the same way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_parallel: Option<usize>,
    /// ZeRO-3: blocks gathered ahead of the one computing.
    #[serde(default = "one")]
    pub zero_prefetch: usize,
    /// Seconds a collective waits for the other ranks before the run fails.
    #[serde(default = "ten_minutes")]
    pub collective_timeout_s: f64,
    /// Order of training windows.
    #[serde(default)]
    pub sampler: SamplerKind,
    /// Data-loader worker threads (0: batches collated on the trainer's thread).
    #[serde(default)]
    pub workers: usize,
    /// Most batches queued ahead of the trainer.
    #[serde(default = "two")]
    pub prefetch: usize,
    /// Host bytes the data loader may take.
    #[serde(default)]
    pub host_memory: Option<u64>,
    /// Page-lock the loader's staging buffers when permitted.
    #[serde(default = "yes")]
    pub pin_memory: bool,
    /// Directory of the nvme tier's scratch files (default: the system's temporary directory).
    #[serde(default)]
    pub offload_dir: Option<PathBuf>,
    /// This configuration continues a saved run ([`RunConfig::resumed_with`] sets it): its save
    /// directory may hold that run's saves, which `Trainer::resume` checks against the step it
    /// resumes from; a new run's must hold none (`prepare` checks). Never saved.
    #[serde(skip)]
    pub resumed: bool,
}

fn one() -> usize {
    1
}

fn ten_minutes() -> f64 {
    600.0
}

fn two() -> usize {
    2
}

fn yes() -> bool {
    true
}

impl RunConfig {
    /// Sequences per forward/backward pass.
    pub fn micro_batch(&self) -> usize {
        self.strategy.micro_batch as usize
    }
    /// Micro-batches per optimizer step.
    pub fn accumulation(&self) -> usize {
        self.strategy.accumulation as usize
    }
    /// Sequences each rank trains on per optimizer step.
    pub fn batch_per_rank(&self) -> usize {
        self.micro_batch() * self.accumulation()
    }
    /// Sequences per optimizer step, over every rank.
    pub fn effective_batch(&self) -> usize {
        self.batch_per_rank() * self.data_parallel
    }
    /// Tokens per sequence: the `seq_len` key, else the context of `spec`, the model this
    /// configuration builds. The one place the default is decided.
    pub fn seq_len_of(&self, spec: &headroom_nn::models::ModelSpec) -> usize {
        self.seq_len.unwrap_or_else(|| spec.default_seq_len())
    }
    /// `self` running `strategy` instead of its own.
    pub fn with_strategy(&self, strategy: Strategy) -> RunConfig {
        RunConfig {
            strategy,
            ..self.clone()
        }
    }
    /// `self` with another micro-batch × accumulation split.
    pub fn with_split(&self, micro_batch: usize, accumulation: usize) -> RunConfig {
        self.with_strategy(Strategy {
            micro_batch: micro_batch as u64,
            accumulation: accumulation as u64,
            ..self.strategy
        })
    }
}

/// The embedded defaults: a small GPT on the bundled corpus, a few hundred steps, 512 MiB of
/// device memory.
pub const DEFAULT_MODEL: &str = "gpt-small";
pub const DEFAULT_DEVICE_MEMORY: u64 = 512 << 20;
/// The default budget of a run of a pretrained model (a Hugging Face directory with weights, a
/// GGUF file): its weights alone outgrow 512 MiB from about 130 M parameters in f32
/// (SmolLM2-135M: 540 MB), and 8 GiB holds a full fine-tune of such a model with AdamW.
pub const DEFAULT_PRETRAINED_DEVICE_MEMORY: u64 = 8 << 30;
/// Sequences per optimizer step beyond which a configuration is surely a mistake (the token
/// batches alone would fill host memory).
pub const MAX_EFFECTIVE_BATCH: usize = 1 << 20;
