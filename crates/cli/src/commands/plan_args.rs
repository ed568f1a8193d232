//! The arguments of `headroom plan` (`PlanArgs`): the model or the traced program, the budget,
//! the hardware, the batch, LoRA, the pinned levers and mesh axes, and the exports.
//!
//! Not for: what is done with them (`plan`, `plan_own`, `plan_trace`).

use super::plan_mesh::MeshArgs;
use anyhow::Result;
use clap::Args;
use headroom_memory::ByteSize;
use headroom_plan::hardware::HardwareOverrides;
use headroom_plan::strategy::{
    BaseDtype, BaseWeights, Framework, Lora, LoraTargets, LossImpl, OptimizerImpl, ZeroGrad,
    parse_flag,
};
use headroom_train::config::Levers;
use std::path::PathBuf;

/// Predict memory and time of a training run and choose the fastest plan that fits.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A built-in model (see `headroom params --help`), a Hugging Face config.json, or one of
    /// headroom's own models (gpt-small, gpt-tiny, gpt-medium, resmlp, or a model TOML), which
    /// are planned by dry runs on the real allocator within --device-memory. With --trace: the
    /// Hugging Face config.json the speed model reads when the traced model is a factory.
    #[arg(long, required_unless_present = "trace")]
    pub model: Option<String>,
    /// Plan the user's own PyTorch program by tracing it under every lever setting (precision,
    /// checkpointing, micro-batch, the optimizer's implementation, LoRA with --lora-rank) and
    /// replaying each trace through the caching allocator: a Hugging Face config.json (or its
    /// directory), or a model factory `package.module:function` (then --model names its
    /// config.json for the speed model). Needs Python with torch and transformers
    /// (HEADROOM_PYTHON), as `headroom trace` does.
    #[arg(long, value_name = "MODEL")]
    pub trace: Option<String>,
    /// With --trace: training steps traced per setting (the second step runs with the
    /// optimizer states already allocated, the steady state).
    #[arg(long, value_name = "K", default_value_t = 2, requires = "trace")]
    pub trace_steps: u64,
    /// With --trace: also trace the recommended setting at twice, four times, … 64 times
    /// --seq-len (no further than the model's position limit) and report the longest
    /// sequence that fits.
    #[arg(long, requires = "trace")]
    pub max_context: bool,
    /// Device budget for headroom's own models (e.g. 64MiB, 2GiB); a --gpu preset's memory less
    /// its CUDA context otherwise. With --trace: the bytes the caching allocator may reserve.
    #[arg(long, value_name = "SIZE")]
    pub device_memory: Option<ByteSize>,
    /// GPU preset: V100-16GB, V100-32GB, A100-40GB, A100-80GB, H100-80GB, H200-141GB, L4, A10G,
    /// RTX-4090, RTX-3090, RTX-A6000, L40S, H100-PCIe, H100-NVL, B200, MI300X (case, spaces
    /// and hyphens do not matter: `"rtx 4090"`; a leading part such as `h200` names the one
    /// preset it starts).
    #[arg(long)]
    pub gpu: Option<String>,
    /// TOML file with hardware fields (same names as the flags, e.g. `gpu_memory = "80GiB"`).
    #[arg(long, value_name = "FILE")]
    pub hardware: Option<PathBuf>,
    /// Hardware fields given as flags (the same names as the `--hardware` TOML).
    #[command(flatten)]
    pub hw: HardwareOverrides,
    /// Sequence length in tokens (a Hugging Face model's pre-training length where its config
    /// records one, `rope_scaling.original_max_position_embeddings`: 8192 for Llama 3.1; required
    /// otherwise; a headroom model's context by default).
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Global batch per optimizer step, in samples (default for a Hugging Face model: one
    /// sequence per GPU).
    #[arg(long, conflicts_with = "global_batch_tokens")]
    pub global_batch: Option<u64>,
    /// Global batch per optimizer step, in tokens (a multiple of --seq-len).
    #[arg(long)]
    pub global_batch_tokens: Option<u64>,
    /// Count each rank's data loader in host memory: N worker threads (and --prefetch batches
    /// queued in staging buffers), as headroom's loader states them.
    #[arg(long, value_name = "N")]
    pub workers: Option<u64>,
    /// Batches each rank's loader queues ahead (with --workers).
    #[arg(long, value_name = "K", default_value_t = 2, requires = "workers")]
    pub prefetch: u64,
    /// Plan a LoRA fine-tune with adapters of this rank: the base is frozen (parameters only)
    /// and only the adapters have gradients, master weights and optimizer states.
    #[arg(long, value_name = "R")]
    pub lora_rank: Option<usize>,
    /// The LoRA scale's numerator (updates × alpha/rank; default: the rank).
    #[arg(long, value_name = "ALPHA", requires = "lora_rank")]
    pub lora_alpha: Option<f32>,
    /// The projections LoRA adapts: comma-separated q, k, v, qkv, o, gate, up, down, or
    /// all-linear (default q,v). A fused projection (GPT-2's c_attn, Phi-3's qkv_proj) gets one
    /// adapter when any of q, k, v is named.
    #[arg(long, value_parser = parse_flag::<LoraTargets>, value_name = "LIST", requires = "lora_rank")]
    pub lora_targets: Option<LoraTargets>,
    /// How the frozen base is stored: plain (the parameter dtype) or nf4 (QLoRA: every block
    /// projection in 4-bit NormalFloat with double-quantised scales, 4.127 bits per weight).
    #[arg(long, value_parser = parse_flag::<BaseWeights>, value_name = "FORMAT", requires = "lora_rank")]
    pub lora_base: Option<BaseWeights>,
    /// The dtype the frozen base is loaded in (`torch_dtype`): fp32, bf16 or fp16 (default: the
    /// parameter dtype of --precision, 16-bit under mixed precision). PEFT's FSDP example loads
    /// it in fp32; DeepSpeed's 16-bit engines cast it to the compute dtype whatever it was.
    #[arg(long, value_parser = parse_flag::<BaseDtype>, value_name = "DTYPE", requires = "lora_rank")]
    pub lora_base_dtype: Option<BaseDtype>,
    /// PEFT's `lora_dropout`: the probability of the dropout on each adapter's input (default 0,
    /// none). Above 0 each adapted projection keeps a dropped copy of its input and a one-byte
    /// mask for backward (PEFT's guides run 0.1, Axolotl's examples 0.05).
    #[arg(long, value_name = "P", requires = "lora_rank")]
    pub lora_dropout: Option<f32>,
    /// headroom's own models: plan one rank of N data-parallel ranks (as `headroom train
    /// --data-parallel N` runs them), the ZeRO stage searched unless --zero pins it; the
    /// budget is per rank and --global-batch is split over the ranks.
    #[arg(long, value_name = "N")]
    pub data_parallel: Option<usize>,
    /// The strategy levers, pinned: the flags of `headroom train`, unset ones searched.
    #[command(flatten)]
    pub levers: Levers,
    /// The mesh axes (tensor, pipeline, sequence parallelism), pinned; searched on several GPUs.
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// Whose memory layout to predict: deepspeed (a 16-bit model, fp32 master weights and
    /// states, ZeRO-3 gathering module by module) or fsdp (PyTorch's DDP/FSDP with autocast or
    /// FSDP mixed precision: fp32 parameters that are the master copy, fp32 gradients, whole
    /// blocks gathered; offload only of everything to the CPU). Default: the framework of the
    /// exports asked for (`--emit deepspeed` → deepspeed; accelerate, torchtune or torchtitan
    /// without it → fsdp), deepspeed otherwise.
    #[arg(long, value_parser = parse_flag::<Framework>)]
    pub framework: Option<Framework>,
    /// How the optimizer steps the parameters, which sets its temporaries: foreach (PyTorch's
    /// default on CUDA: about one copy of the parameters updated), fused (`fused=True`: none),
    /// per-tensor (a loop such as Hugging Face's `adamw_hf` or `foreach=False`: one tensor's).
    /// Default foreach; with --trace, unset, all three are traced.
    #[arg(long, value_parser = parse_flag::<OptimizerImpl>)]
    pub optimizer_impl: Option<OptimizerImpl>,
    /// How the cross-entropy holds the vocabulary-sized tensors: hugging-face (a Hugging Face
    /// model's causal-LM loss: the model's 16-bit logits kept, upcast to fp32, fp32
    /// log-probabilities and two fp32 gradients in backward), separate (PyTorch's
    /// F.cross_entropy on fp32 logits released before backward, as torchtune and torchtitan
    /// run it: the gradient beside the saved log-probabilities) or in-place (Megatron-LM's
    /// vocab_parallel_cross_entropy: written into the saved softmax, so the fp32 logits exist
    /// once).
    #[arg(long, value_parser = parse_flag::<LossImpl>, default_value = "hugging-face")]
    pub loss_impl: LossImpl,
    /// What the loop's zero_grad() does between steps: set-to-none (PyTorch 2.0 and later, the
    /// default: with one micro-batch a step, backward starts with no gradient and makes each as
    /// it goes) or zero-fill (set_to_none=False, PyTorch's default before 2.0: every gradient
    /// held through the whole step). It matters under --framework fsdp (PyTorch's own data
    /// parallelism) with one micro-batch a step; DeepSpeed keeps its gradient partitions
    /// between steps either way, and accumulation holds them through the step.
    #[arg(long, value_parser = parse_flag::<ZeroGrad>, default_value = "set-to-none")]
    pub zero_grad: ZeroGrad,
    /// Whether the training loop keeps the model's output through backward and into the next
    /// step (`outputs = model(**batch); outputs.loss.backward()`, as Hugging Face's
    /// *_no_trainer.py examples and most hand-written loops do): its logits stay allocated
    /// through backward and until the next forward returns, beside that forward's. Default
    /// false: the Trainer keeps the loss alone. `--loss-impl sum` keeps it by construction.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub loop_keeps_outputs: bool,
    /// Whether the training step runs under `torch.compile` (torchtitan's `compile`, the Hugging
    /// Face Trainer's `torch_compile`, torchtune's `compile`): its element-wise kernels fused, so
    /// it moves fewer bytes per token (docs/planner.md, "Matmul shape and element-wise kernels").
    /// Default: eager.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set)]
    pub compile: bool,
    /// Achievable fraction of the dense peak once micro-batches are large enough to fill the GPU
    /// and matmuls wide enough to feed it, for every precision (default: each GPU's value fitted
    /// to a published run, 0.45 where none is; see docs/planner.md); smaller micro-batches and
    /// narrower models reach less of it.
    #[arg(long)]
    pub efficiency: Option<f64>,
    /// Fragmentation reserve as a fraction of allocated bytes (default 0.10).
    #[arg(long)]
    pub fragmentation: Option<f64>,
    /// Safety margin below capacity (default 0.05).
    #[arg(long)]
    pub margin: Option<f64>,
    /// Rescale the speed model (and, given a peak, the activation bytes) to one measured step of
    /// this model on this hardware, from any framework: a JSON file with the measured run's
    /// `strategy`, `tokens_per_s` and optionally `peak_allocated_bytes`, `seq_len`, `source`
    /// (format in docs/planner.md).
    #[arg(long, value_name = "FILE")]
    pub calibrate: Option<PathBuf>,
    /// How many plans to show.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    /// Print one JSON object on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Write a config for the recommended plan: `--emit deepspeed ds.json`, `--emit accelerate
    /// acc.yaml`, `--emit headroom train.toml`, `--emit torchtune overrides.yaml` (a
    /// single-device recipe's keys), and with --lora-rank `--emit peft
    /// adapter_config.json` (PEFT's LoraConfig) and `--emit bitsandbytes quant.json` (QLoRA's
    /// BitsAndBytesConfig); for a mesh or plain data parallelism, `--emit torchtitan job.toml`
    /// (a torchtitan job config) and `--emit megatron args.txt` (Megatron-LM's arguments)
    /// (repeatable).
    #[arg(long, num_args = 2, value_names = ["KIND", "FILE"], action = clap::ArgAction::Append)]
    pub emit: Vec<String>,
    /// Directory on each node's NVMe for offloaded states, written into the exports
    /// (ds_config `nvme_path`, Accelerate `offload_*_nvme_path`).
    #[arg(long, value_name = "DIR", default_value = "/local_nvme")]
    pub nvme_path: String,
    /// Address of the machine of rank 0 for a multi-node Accelerate export (`main_process_ip`).
    #[arg(long, value_name = "HOST")]
    pub main_process_ip: Option<String>,
    /// Port on the machine of rank 0 for a multi-node Accelerate export (`main_process_port`;
    /// 29500 is torchrun's default).
    #[arg(long, value_name = "PORT", default_value_t = 29500)]
    pub main_process_port: u16,
}

impl PlanArgs {
    /// The `--model` given (clap requires it unless --trace is given, which is planned apart).
    pub fn model_name(&self) -> &str {
        self.model.as_deref().unwrap_or_default()
    }

    /// The pinned micro-batch and accumulation, if given.
    pub fn split(&self) -> (Option<u64>, Option<u64>) {
        let keys = &self.levers.keys;
        (
            keys.micro_batch.map(|m| m as u64),
            keys.accumulation.map(|a| a as u64),
        )
    }

    /// The LoRA fine-tune the `--lora-*` flags describe, if `--lora-rank` is given.
    pub fn lora(&self) -> Result<Option<Lora>> {
        let Some(rank) = self.lora_rank else {
            return Ok(None);
        };
        Ok(Some(Lora::new(
            rank,
            self.lora_alpha.unwrap_or(rank as f32),
            self.lora_targets.clone().unwrap_or_default(),
            self.lora_base.unwrap_or_default(),
        )?))
    }
}
