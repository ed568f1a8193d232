//! `headroom trace`: the user's own PyTorch training step, traced without a GPU and replayed.
//! The tracing itself is Python (`python -m headroom.trace`, from the `headroom-mem` package:
//! PyTorch's fake tensors need PyTorch); this command runs it with the interpreter in
//! `HEADROOM_PYTHON` (or `python3`), then replays the trace it wrote as `headroom memory replay`
//! does.
//!
//! Not for: the replay and its reports (`commands::memory`), or the tracer's rules (Python).

use super::memory::{ReplayOptions, replay_file};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::Command;

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// A Hugging Face config.json (or the directory holding it), or a model factory
    /// `package.module:function` that returns a torch.nn.Module taking `input_ids` and `labels`
    /// as a Hugging Face causal LM does.
    pub model: String,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u64,
    /// Tokens per sequence.
    #[arg(long)]
    pub seq_len: u64,
    /// Training steps to trace (forward, backward, optimizer step, zero_grad).
    #[arg(long, default_value_t = 2)]
    pub steps: u64,
    /// The precision: fp32, pure bf16 (weights, gradients and states in bf16), bf16 autocast
    /// (fp32 weights, bf16 compute) or fp16 autocast (fp32 weights, fp16 compute, the loss scaled
    /// by torch.amp.GradScaler).
    #[arg(long, value_enum, default_value = "fp32")]
    pub dtype: TraceDtype,
    /// AdamW's implementation (torch.optim.AdamW's foreach and fused flags).
    #[arg(long, value_enum, default_value = "foreach")]
    pub optimizer_impl: OptimizerImpl,
    /// Turn on the model's activation checkpointing (Hugging Face
    /// `gradient_checkpointing_enable`).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// A loss `package.module:function` called as f(model, input_ids) -> scalar tensor, instead
    /// of the model's own loss from `labels=`.
    #[arg(long, value_name = "MODULE:FUNCTION")]
    pub loss: Option<String>,
    /// Vocabulary size of the random token batch when the model has no `config.vocab_size`.
    #[arg(long)]
    pub vocab_size: Option<u64>,
    /// Whose kernels the trace allocates as: cuda rewrites the CPU kernels' allocations into the
    /// CUDA kernels' where they differ (attention's flash and memory-efficient kernels keep the
    /// log-sum-exp, not the probabilities; the cuBLAS workspace at the first matmul); cpu keeps
    /// the trace of the CPU kernels as they ran.
    #[arg(long, value_enum, default_value = "cuda")]
    pub device: TraceDevice,
    /// The GPU generation the cuBLAS workspace is sized for (PyTorch's default): sm90 (Hopper:
    /// H100, H200; 32 MiB) or sm80 (any other: 8 MiB + 128 KiB). CUBLAS_WORKSPACE_CONFIG in the
    /// environment overrides both.
    #[arg(long, value_enum, default_value = "sm90")]
    pub cuda_arch: CudaArch,
    /// Trace rank 0 of a PyTorch FSDP2 run of this many ranks: `fully_shard` on each block and
    /// then the root, under PyTorch's fake process group (no peers, no GPU). Parameters,
    /// gradients and AdamW's states are sharded; each unit's parameters are all-gathered around
    /// its forward and backward.
    #[arg(long, value_name = "RANKS", value_parser = clap::value_parser!(u64).range(1..))]
    pub fsdp: Option<u64>,
    /// With --fsdp: keep each unit gathered from its forward to its backward (fully_shard's
    /// `reshard_after_forward=False`, ZeRO-2's layout).
    #[arg(long, requires = "fsdp")]
    pub no_reshard_after_forward: bool,
    /// Trace one rank of a PyTorch DDP run: beside each gradient, DDP's flat gradient buckets
    /// (one at construction, rebuilt in backward's order at the second step, both live for a
    /// moment). A rank's bytes do not depend on the number of ranks.
    #[arg(long, conflicts_with = "fsdp")]
    pub ddp: bool,
    /// Where to write the trace (headroom's replay JSON).
    #[arg(long, short, default_value = "headroom-trace.json")]
    pub output: PathBuf,
    #[command(flatten)]
    pub replay: ReplayOptions,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceDtype {
    Fp32,
    Bf16,
    Bf16Autocast,
    Fp16Autocast,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceDevice {
    Cuda,
    Cpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaArch {
    Sm90,
    Sm80,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OptimizerImpl {
    Foreach,
    Fused,
    ForLoop,
}

/// The interpreter: `HEADROOM_PYTHON`, else `python3` on the PATH.
fn python() -> String {
    std::env::var("HEADROOM_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_string())
}

/// The interpreter that can import headroom's tracer, or an error naming how to install it.
pub(super) fn tracer_python() -> anyhow::Result<String> {
    let python = python();
    let probe = Command::new(&python)
        .args(["-c", "import headroom.trace"])
        .output()
        .with_context(|| {
            format!(
                "cannot run Python '{python}'; install Python 3.9 or newer, or set HEADROOM_PYTHON to the interpreter that has torch"
            )
        })?;
    if !probe.status.success() {
        bail!(
            "'{python}' cannot import headroom's tracer ({}); install it into that environment with: {python} -m pip install headroom-mem torch transformers (or set HEADROOM_PYTHON to an interpreter that has them)",
            String::from_utf8_lossy(&probe.stderr)
                .lines()
                .last()
                .unwrap_or("no message")
                .trim()
        );
    }
    Ok(python)
}

pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    let python = tracer_python()?;
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "headroom.trace", &args.model])
        .arg("--micro-batch")
        .arg(args.micro_batch.to_string())
        .arg("--seq-len")
        .arg(args.seq_len.to_string())
        .arg("--steps")
        .arg(args.steps.to_string())
        .arg("--dtype")
        .arg(value_name(args.dtype))
        .arg("--optimizer-impl")
        .arg(value_name(args.optimizer_impl))
        .arg("--device")
        .arg(value_name(args.device))
        .arg("--cuda-arch")
        .arg(value_name(args.cuda_arch))
        .arg("--output")
        .arg(&args.output);
    if args.gradient_checkpointing {
        cmd.arg("--gradient-checkpointing");
    }
    if let Some(loss) = &args.loss {
        cmd.args(["--loss", loss]);
    }
    if let Some(v) = args.vocab_size {
        cmd.arg("--vocab-size").arg(v.to_string());
    }
    if let Some(ranks) = args.fsdp {
        cmd.arg("--fsdp").arg(ranks.to_string());
    }
    if args.no_reshard_after_forward {
        cmd.arg("--no-reshard-after-forward");
    }
    if args.ddp {
        cmd.arg("--ddp");
    }
    // The tracer reports on stderr; stdout stays the replay's (for --json).
    let status = cmd
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("cannot run Python '{python}'"))?;
    if !status.success() {
        bail!("the tracer failed (its message is above); no trace was replayed");
    }
    replay_file(&args.output, &args.replay)
}

fn value_name(v: impl ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}
