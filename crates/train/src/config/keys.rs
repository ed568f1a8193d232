//! The keys of a run as the TOML file and the flags give them (`TrainConfig`: each optional,
//! flags over file). clap derives `headroom train`'s flags from this struct, so a key is
//! written once.
//!
//! Not for: reading and layering the keys (see `read`), their resolution (see `resolve`) or the
//! resolved configuration (see `run`).

use crate::data::SamplerKind;
use headroom_memory::AllocatorKind;
use headroom_memory::size::ByteSize;
use headroom_strategy::{
    Attention, BaseWeights, Checkpoint, LoraTargets, Loss, Offload, Optimizer, Precision,
    ZeroStage, parse_flag,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Every key of the TOML file and every run flag of `headroom train`; each is optional, and
/// flags override the file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, clap::Args)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// Model preset (gpt-small, gpt-tiny, gpt-medium, resmlp), a model TOML, or a Hugging Face
    /// model directory of the Llama family (llama, mistral, qwen2: config.json, the weights in
    /// model.safetensors or shards, tokenizer.json): its weights are the starting point and its
    /// tokenizer reads the text.
    #[arg(long)]
    pub model: Option<String>,
    /// Override the preset's number of layers (blocks).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Override the preset's width (the MLP is 4 × width).
    #[arg(long)]
    pub width: Option<usize>,
    /// Override the number of attention heads.
    #[arg(long)]
    pub heads: Option<usize>,
    /// Sequence length in tokens (default: the model's context).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Dropout probability.
    #[arg(long)]
    pub dropout: Option<f32>,
    /// fp32 | bf16-mixed | fp16-mixed | bf16.
    #[arg(long, value_parser = parse_flag::<Precision>)]
    pub precision: Option<Precision>,
    /// Sequences per forward/backward pass.
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Micro-batches per optimizer step (effective batch = micro-batch × accumulation).
    #[arg(long)]
    pub accumulation: Option<usize>,
    /// sgd, sgd-momentum, adamw, adamw-bf16, adamw-8bit, paged-adamw-8bit, adafactor, lamb.
    #[arg(long, value_parser = parse_flag::<Optimizer>)]
    pub optimizer: Option<Optimizer>,
    /// Peak learning rate (after warm-up; cosine decay to a tenth).
    #[arg(long)]
    pub lr: Option<f32>,
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// Clip gradients to this global norm (0 turns clipping off; default 1.0).
    #[arg(long)]
    pub grad_clip: Option<f32>,
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Optimizer steps to run.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Device memory budget, e.g. 512MiB or 2GiB (GB = 10^9, GiB = 2^30); default 512MiB, or
    /// 8GiB for a pretrained model (a model directory or a GGUF file).
    #[arg(long)]
    pub device_memory: Option<ByteSize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Validate every N optimizer steps (and at the end); 0: only at the end.
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Validation batches per evaluation.
    #[arg(long)]
    pub eval_batches: Option<usize>,
    /// Empty the allocator's cache after each validation and report reserved bytes around it.
    #[arg(
        long,
        num_args = 0,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub empty_cache_after_eval: Option<bool>,
    /// Device allocator: caching (PyTorch's default), expandable (expandable segments), or
    /// planned (every training step and evaluation served from one arena whose offsets a dry run
    /// planned from the allocations' lifetimes; reserved close to the peak of live bytes;
    /// requests off the plan fall back to the caching pools, counted in the report).
    #[arg(long, value_parser = clap::value_parser!(AllocatorKind))]
    pub allocator: Option<AllocatorKind>,
    /// Train on this text file instead of the bundled corpus.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Activation checkpointing: none, all, every:K, sqrt, budget:SIZE (least recomputation whose
    /// activation peak fits SIZE), selective.
    #[arg(long, value_parser = parse_flag::<Checkpoint>)]
    pub checkpoint: Option<Checkpoint>,
    /// Attention implementation: naive (the scores and probabilities as tensors) or
    /// memory-efficient (a fused kernel; for a Hugging Face model, SDPA, planned as the kernel
    /// PyTorch's CUDA dispatch runs: in fp32 a grouped-query model gets its math path, which
    /// keeps the probabilities as naive attention does).
    #[arg(long, value_parser = parse_flag::<Attention>)]
    pub attention: Option<Attention>,
    /// Loss computation: plain (the logits of the whole micro-batch at once) or chunked:K (the
    /// output projection and cross-entropy in K chunks of tokens, each recomputed in backward,
    /// so the batch × sequence × vocabulary logits never exist at once).
    #[arg(long, value_parser = parse_flag::<Loss>)]
    pub loss: Option<Loss>,
    /// Run each block's optimizer update in backward as soon as its gradient is complete and
    /// give the gradient's bytes back (torchtune's optimizer_in_bwd): about one block's
    /// gradient at a time instead of the model's. Needs --accumulation 1 and one process, and
    /// turns the default global-norm clipping off (clipping needs every gradient first).
    /// `--optimizer-in-backward false` pins it off.
    #[arg(
        long,
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub optimizer_in_backward: Option<bool>,
    /// Fine-tune with LoRA adapters of this rank (Hu et al. 2021): the base weights are
    /// frozen (no gradient, no optimizer state) and each targeted projection gains a trainable
    /// update (alpha/rank)·x·A·B with A of in × rank and B of rank × out elements.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// The LoRA scale's numerator: updates are multiplied by alpha/rank (default: the rank, a
    /// scale of 1, as PEFT's defaults r = 8, lora_alpha = 8).
    #[arg(long, value_name = "ALPHA")]
    pub lora_alpha: Option<f32>,
    /// The projections LoRA adapts: comma-separated q, k, v, qkv (the fused projection), o
    /// (attention output), up, down (the MLP), or all-linear (default: q,v, PEFT's default
    /// for Llama).
    #[arg(long, value_parser = parse_flag::<LoraTargets>, value_name = "LIST")]
    pub lora_targets: Option<LoraTargets>,
    /// How LoRA's frozen base is stored: plain (the parameter dtype) or nf4 (QLoRA: each
    /// layer's four projections in 4-bit NormalFloat with double-quantised block scales,
    /// dequantised per GEMM; norms, biases, embeddings and the head stay in the parameter dtype).
    #[arg(long, value_parser = parse_flag::<BaseWeights>, value_name = "FORMAT")]
    pub lora_base: Option<BaseWeights>,
    /// Start from the weights of a save (a --save-dir directory or one of its step-NNNNNN
    /// folders) instead of the seed's initialisation: its merged model when it is a LoRA run's,
    /// else its model. With --lora-rank they become the frozen base. The step, optimizer state
    /// and data start afresh (--resume continues a run instead).
    #[arg(long, value_name = "SAVE")]
    pub init_from: Option<PathBuf>,
    /// Save the run (weights, optimizer state, data position) under this directory.
    #[arg(long, value_name = "DIR", visible_alias = "checkpoint-dir")]
    #[serde(alias = "checkpoint_dir")]
    pub save_dir: Option<PathBuf>,
    /// At the end, write the model as a Hugging Face directory here: with --lora-rank its
    /// adapters as PEFT's adapter_model.safetensors and adapter_config.json (PeftModel loads
    /// them over the base), else config.json and model.safetensors (from_pretrained loads
    /// them); tokenizer.json is copied beside. Llama-family models only.
    #[arg(long, value_name = "DIR")]
    pub hf_out: Option<PathBuf>,
    /// With --hf-out and --lora-rank: write the merged model (the adapters folded into the
    /// base, W + (α/r)·A·B) instead of the adapters.
    #[arg(
        long,
        num_args = 0,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub hf_merge: Option<bool>,
    /// Save every N steps (and at the end) when --save-dir is set.
    #[arg(long, value_name = "N", visible_alias = "checkpoint-every")]
    #[serde(alias = "checkpoint_every")]
    pub save_every: Option<u64>,
    /// Retry a step that runs out of memory with half the micro-batch and twice the
    /// accumulation (default true; the flag --no-oom-recovery turns it off).
    #[arg(
        long = "no-oom-recovery",
        num_args = 0,
        default_missing_value = "false",
        value_name = "BOOL",
        help = "Stop at the first out-of-memory error instead of retrying the step with half the \
                micro-batch and twice the accumulation"
    )]
    pub oom_recovery: Option<bool>,
    /// Sum each fp32 micro-batch's gradient whole into an f32 buffer in micro-batch order (one
    /// more f32 gradient buffer while accumulating; 16-bit gradients are always summed so): the
    /// order a data-parallel group sums in, so `--data-parallel N` with accumulation 1 is
    /// bitwise this run with accumulation N.
    #[arg(
        long,
        num_args = 0,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    pub deterministic: Option<bool>,
    /// Train on N ranks (threads of this process, each with its own device of
    /// --device-memory), each on its share of every global batch, gradients summed over ranks
    /// in rank order (DDP). The global batch is N × micro-batch × accumulation.
    #[arg(long, value_name = "N")]
    pub data_parallel: Option<usize>,
    /// Split headroom's GPT over N ranks (threads of this process, or the ranks of an `mpirun`
    /// job of N): each holds 1/N of every layer's heads and MLP features (Megatron-LM's tensor
    /// parallelism), all ranks read the same batches. With --deterministic the sums are cut
    /// into 8 chunks added as one tree, so 1, 2, 4 and 8 ranks give bitwise the same run.
    #[arg(long, value_name = "N")]
    pub tensor_parallel: Option<usize>,
    /// ZeRO stage with --data-parallel: 0 replicates everything (DDP); 1 shards optimizer
    /// states and master weights over the ranks; 2 also gradients (reduce-scatter); 3 also
    /// parameters, gathered per block before it computes and freed after.
    #[arg(long = "zero", value_name = "STAGE", value_parser = parse_flag::<ZeroStage>)]
    pub zero_stage: Option<ZeroStage>,
    /// ZeRO-3: blocks gathered ahead of the one computing (default 1). More blocks resident,
    /// gathers issued earlier.
    #[arg(long, value_name = "BLOCKS")]
    pub zero_prefetch: Option<usize>,
    /// Seconds a collective may wait for the other ranks before the run ends with an error
    /// naming the stuck rank and collective (default 600; at most 604,800, a week).
    #[arg(long, value_name = "SECONDS")]
    pub collective_timeout: Option<f64>,
    /// Order of training windows: shuffled (a permutation per epoch from the seed, the
    /// default) or sequential (file order).
    #[arg(long)]
    pub sampler: Option<SamplerKind>,
    /// Data-loader worker threads that collate batches ahead of the trainer (default 0: each
    /// batch is collated when the step asks for it). The batches are the same for any number.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Most batches the workers queue ahead of the trainer (default 2, at most 64); it shrinks
    /// to fit --host-memory.
    #[arg(long, value_name = "K")]
    pub prefetch: Option<usize>,
    /// Host memory the data loader may take for staging buffers and workers, e.g. 64MiB
    /// (default: no limit beyond the machine's).
    #[arg(long, value_name = "SIZE")]
    pub host_memory: Option<ByteSize>,
    /// Page-lock (mlock) the loader's staging buffers when the OS permits (default true).
    #[arg(
        long = "no-pin-memory",
        num_args = 0,
        default_missing_value = "false",
        value_name = "BOOL",
        help = "Leave the data loader's staging buffers pageable instead of page-locking them"
    )]
    pub pin_memory: Option<bool>,
    /// Where optimizer states and fp32 master weights live: none (the device), cpu (host
    /// memory, the update runs there: ZeRO-Offload) or nvme (files under --offload-dir, read
    /// and written around each block's update: ZeRO-Infinity). Needs --zero 1, 2 or 3.
    #[arg(long, value_name = "TIER", value_parser = parse_flag::<Offload>)]
    pub offload_optimizer: Option<Offload>,
    /// Where ZeRO-3's parameter shards live between uses: none, cpu or nvme. Needs --zero 3
    /// and --offload-optimizer.
    #[arg(long, value_name = "TIER", value_parser = parse_flag::<Offload>)]
    pub offload_params: Option<Offload>,
    /// Where the inputs kept by checkpointed blocks live between forward and backward: none
    /// (the device) or cpu (copied to host memory in forward, fetched back when backward
    /// recomputes the block; DeepSpeed's cpu_checkpointing). Needs a --checkpoint policy that
    /// checkpoints blocks (all, every:K, sqrt, budget:SIZE).
    #[arg(long, value_name = "TIER", value_parser = parse_flag::<Offload>)]
    pub offload_activations: Option<Offload>,
    /// Directory for the nvme tier's files (default: the system's temporary directory). Put
    /// it on the fastest local disk; the files are scratch, removed when the run ends.
    #[arg(long, value_name = "DIR")]
    pub offload_dir: Option<PathBuf>,
}
