//! The cost model: for one `Strategy` on one `Problem` (model, hardware, workload), the bytes per
//! `Category` on each device at the step's peak (`memory`), the host and NVMe bytes it needs,
//! and the time of one optimizer step (`time`). Every term names its source in its module.
//!
//! Not for: choosing among strategies (see `search`).

pub mod activation;
mod backward;
pub mod efficiency;
pub mod elementwise;
mod evaluator;
pub mod gather;
pub mod memory;
pub mod sdpa;
mod selective_op;
pub mod time;
mod width;

use crate::hardware::Hardware;
use crate::model::{Architecture, ParamInventory};
use crate::strategy::{Framework, LossImpl, OptimizerImpl, Pins, Strategy, ZeroGrad};
use crate::workload::Workload;
use serde::Serialize;

pub use memory::MemoryPrediction;
pub use time::StepTime;
pub use width::Width;

/// Tunable assumptions of the cost model.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CostModel {
    /// Achievable fraction of the dense peak for the model's matmuls (MFU-like) once a
    /// micro-batch is large enough to fill the GPU and the matmuls wide enough to feed it
    /// (`time::shape_efficiency`), for every GPU and precision (`--efficiency`);
    /// unset, each GPU and precision takes its value fitted to a published run
    /// (`efficiency`), or 0.45.
    pub efficiency: Option<f64>,
    /// Factor on the saturated efficiency: 1 by default, set by `--calibrate` from a measured
    /// step.
    pub efficiency_scale: f64,
    /// Work per micro-batch (tokens × hidden size, per GPU) at which a GPU with the reference
    /// dense peak (`time::SATURATION_REFERENCE_TFLOPS`) reaches half of its saturated
    /// efficiency; a GPU `k` times faster needs `√k` times the work. Fitted to Hugging Face's bert-large V100
    /// measurement of micro-batch 1 × accumulation 4 against micro-batch 4 (`docs/planner.md`).
    pub half_saturation_work: f64,
    /// The matmul arithmetic intensity (FLOPs per byte, `hidden / activation width`) at which a
    /// GPU reaches half its saturated efficiency, in units of its ridge point (dense peak over
    /// memory bandwidth): fitted to nanoGPT's GPT-2 run on 8 A100 (`time`).
    pub half_efficiency_intensity: f64,
    /// Bytes a compiled step's (`torch.compile`) memory-bound kernels move per token, block and
    /// hidden unit, in units of the activation width (`elementwise`, counted).
    pub compiled_elementwise: f64,
    /// The bytes per token, block and hidden unit that fusion saves: an eager step moves
    /// `compiled_elementwise` plus these (`elementwise`, counted).
    pub unfused_elementwise: f64,
    /// Factor on every activation byte the model predicts: 1 by default, set by `--calibrate`
    /// from a measured peak.
    pub activation_scale: f64,
    /// Allocator fragmentation reserve, as a fraction of the allocated bytes (PyTorch caching
    /// allocator rounding and split blocks; ZeRO §6 saw OOM with > 30 % free in extreme cases).
    pub fragmentation: f64,
    /// Safety margin: a plan fits when its peak ≤ capacity × (1 − margin).
    pub margin: f64,
    /// DeepSpeed `reduce_bucket_size` / `allgather_bucket_size` in elements, also written into
    /// the exported ds_config (HF DeepSpeed docs use 2e8 as the memory-friendly value).
    pub bucket_elements: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            efficiency: None,
            efficiency_scale: 1.0,
            half_saturation_work: 105_000.0,
            half_efficiency_intensity: time::HALF_EFFICIENCY_INTENSITY,
            compiled_elementwise: elementwise::COMPILED,
            unfused_elementwise: elementwise::UNFUSED,
            activation_scale: 1.0,
            fragmentation: 0.10,
            margin: 0.05,
            bucket_elements: 200_000_000,
        }
    }
}

/// The numbers of a model the cost model needs, computed once from its inventory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelFacts {
    /// Parameters training updates (with LoRA: the adapters').
    pub params: u64,
    /// Every parameter of the model, the LoRA adapters' included.
    pub total_params: u64,
    /// A LoRA fine-tune's counts: the frozen base and its storage.
    pub lora: Option<crate::model::LoraCounts>,
    /// The most parameters ZeRO-3/FSDP gathers at once: the larger of one block and the largest
    /// single module (an embedding or LM head, gathered per module by DeepSpeed).
    pub gather_unit_params: u64,
    /// Parameters of the largest transformer block (FSDP's wrapped unit).
    pub block_params: u64,
    /// Parameters outside the blocks (embeddings, final norm, untied head): FSDP's root unit.
    pub root_params: u64,
    /// Parameters in tensors of at most `10·hidden` elements (norms, biases), which DeepSpeed
    /// ZeRO-3 keeps whole on every rank under Hugging Face's `"auto"` persistence threshold.
    pub persistent_params: u64,
    pub largest_layer_params: u64,
    pub adafactor_state_elements: u64,
    /// Matmul weights per token (MoE experts scaled by k/E), LM head included.
    pub active_matmul_params: f64,
    /// The part of `active_matmul_params` inside transformer blocks.
    pub active_block_matmul_params: f64,
    /// Attention layers (T5 decoder blocks have two: self and cross).
    pub attention_layers: u64,
}

impl ModelFacts {
    pub fn of(spec: &Architecture, inv: &ParamInventory) -> ModelFacts {
        let largest = inv.largest_layer().1;
        ModelFacts {
            params: inv.total(),
            total_params: inv.total(),
            lora: None,
            gather_unit_params: inv.max_block_params().max(largest),
            block_params: inv.max_block_params(),
            root_params: inv.outside_block_params(),
            persistent_params: inv.small_tensor_params(10 * spec.hidden_size),
            largest_layer_params: largest,
            adafactor_state_elements: inv.adafactor_state_elements(),
            active_matmul_params: inv.active_matmul_params(spec),
            active_block_matmul_params: inv.active_block_matmul_params(spec),
            attention_layers: if spec.has_attention() {
                spec.num_layers + 2 * spec.num_decoder_layers
            } else {
                0
            },
        }
    }
}

/// Everything a plan is evaluated against.
#[derive(Clone, Debug)]
pub struct Problem {
    pub spec: Architecture,
    pub facts: ModelFacts,
    pub hardware: Hardware,
    pub workload: Workload,
    pub cost: CostModel,
    /// Whose memory layout the plan predicts (DeepSpeed's by default; see `Framework`).
    pub framework: Framework,
    /// How the optimizer steps the parameters (its temporaries; PyTorch's foreach default).
    pub optimizer_impl: OptimizerImpl,
    /// How the framework's cross-entropy produces the logits' gradient.
    pub loss_impl: LossImpl,
    /// Whether the loop's `zero_grad()` frees the gradients between steps (PyTorch 2.0's
    /// default) or zero-fills them in place (before 2.0), which decides whether a step with one
    /// micro-batch starts its backward without gradients.
    pub zero_grad: ZeroGrad,
    /// Whether the training step runs under `torch.compile` (its element-wise kernels fused;
    /// `elementwise`). PyTorch's default, eager, unless the user says so.
    pub compile: bool,
}

impl Problem {
    pub fn new(
        spec: Architecture,
        hardware: Hardware,
        workload: Workload,
        cost: CostModel,
    ) -> Problem {
        let inv = ParamInventory::of(&spec);
        let mut facts = ModelFacts::of(&spec, &inv);
        if let Some(counts) = workload
            .lora
            .as_ref()
            .and_then(|l| crate::model::LoraCounts::of(&inv, l))
        {
            // Only the adapters have gradients, master weights and optimizer states.
            facts.params = counts.trainable;
            facts.total_params = inv.total() + counts.trainable;
            facts.largest_layer_params = counts.largest_adapter;
            facts.adafactor_state_elements = counts.adafactor_elements;
            facts.lora = Some(counts);
        }
        let mut spec = spec;
        if let (Some(lora), Some(counts)) = (&workload.lora, &facts.lora) {
            spec.lora_saves = Some(crate::model::lora::LoraSaves::of(
                lora,
                counts,
                spec.total_blocks(),
                workload.lora_dropout.unwrap_or(0.0),
            ));
        }
        Problem {
            spec,
            facts,
            hardware,
            workload,
            cost,
            framework: Framework::default(),
            optimizer_impl: OptimizerImpl::default(),
            loss_impl: LossImpl::default(),
            zero_grad: ZeroGrad::default(),
            compile: false,
        }
    }

    /// Bytes per element of a LoRA run's frozen 16-bit or fp32 tensors (not its NF4 weights),
    /// as (stored on the device, gathered for compute under full sharding). The base stays in
    /// the dtype it was loaded in (`Workload::lora_base_dtype`, by default the precision's
    /// parameter dtype), except that DeepSpeed's 16-bit engines cast the whole module to the
    /// compute dtype (`module.half()`/`bfloat16()` when fp16/bf16 is enabled); FSDP's
    /// `MixedPrecision` casts each unit to the compute dtype before its all-gather.
    pub fn lora_base_widths(&self, s: &Strategy) -> (u64, u64) {
        let pb = s.precision.param_bytes();
        let loaded = self.workload.lora_base_dtype.map_or(pb, |d| d.bytes());
        match self.framework {
            Framework::DeepSpeed if pb < 4 => (pb, pb),
            Framework::Fsdp if s.precision.master_weights() => (loaded, pb),
            _ => (loaded, loaded),
        }
    }

    /// The same problem with another optimizer implementation.
    pub fn with_optimizer_impl(self, optimizer_impl: OptimizerImpl) -> Problem {
        Problem {
            optimizer_impl,
            ..self
        }
    }

    /// The same problem with another cross-entropy implementation: Megatron-LM's in-place loss
    /// allocates no gradient of its own (`Architecture::upcasting_loss` is cleared), and only
    /// Hugging Face's runs use transformers' modules (`Architecture::transformers_modules`);
    /// a `logits.sum()` loss runs no cross-entropy (`Architecture::sum_loss`).
    pub fn with_loss_impl(self, loss_impl: LossImpl) -> Problem {
        let mut spec = self.spec;
        spec.upcasting_loss &= matches!(loss_impl, LossImpl::HuggingFace | LossImpl::Separate);
        spec.sum_loss = loss_impl == LossImpl::Sum;
        spec.transformers_modules &= loss_impl == LossImpl::HuggingFace;
        Problem {
            spec,
            loss_impl,
            ..self
        }
    }

    /// The same problem with the loop's `zero_grad()` behaviour (see `ZeroGrad`).
    pub fn with_zero_grad(self, zero_grad: ZeroGrad) -> Problem {
        Problem { zero_grad, ..self }
    }

    /// The same problem for a loop that keeps the model's output through backward and into its
    /// next step (`Architecture::outputs_kept`) or keeps the loss alone.
    pub fn with_outputs_kept(self, kept: bool) -> Problem {
        let mut spec = self.spec;
        spec.outputs_kept = kept;
        Problem { spec, ..self }
    }

    /// The same problem compiled (`torch.compile`) or eager.
    pub fn with_compile(self, compile: bool) -> Problem {
        Problem { compile, ..self }
    }

    /// The same problem for another framework's memory layout.
    pub fn with_framework(self, framework: Framework) -> Problem {
        Problem { framework, ..self }
    }

    /// The strategy a plain training script runs with these pins: PyTorch's defaults (fp32,
    /// AdamW, nothing sharded or offloaded, no checkpointing, naive attention, plain loss) and
    /// the whole per-device batch in one micro-batch unless the workload splits it. The search
    /// prefers it among plans predicted equally fast, so that a tie does not change a lever for
    /// nothing.
    pub fn configured(&self, pins: &Pins) -> Strategy {
        let (micro_batch, accumulation) = self
            .workload
            .splits(self.hardware.world_size())
            .first()
            .copied()
            .unwrap_or((1, 1));
        pins.configure(Strategy {
            micro_batch,
            accumulation,
            ..Strategy::default()
        })
    }

    /// Device bytes a plan may use: capacity × (1 − margin).
    pub fn usable_device_bytes(&self) -> u64 {
        (self.hardware.gpu.memory_bytes as f64 * (1.0 - self.cost.margin)) as u64
    }
}

/// A strategy with its predicted memory and time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub strategy: Strategy,
    /// Peak ≤ usable device memory, and host RAM and NVMe needs within their capacities.
    pub fits: bool,
    pub memory: MemoryPrediction,
    pub time: StepTime,
    /// How far the plan departs from mixed-precision AdamW semantics (0 = not at all); plans
    /// rank by tier first, then by throughput.
    pub fidelity_tier: u8,
}

/// Predicts memory and time of `strategy`.
pub fn evaluate(problem: &Problem, strategy: &Strategy) -> Plan {
    // The bytes and time of the kernels that run: SDPA's math path where its dispatch leaves
    // the fused kernels (`sdpa`).
    let (on, run) = sdpa::as_run(problem, strategy);
    let memory = memory::predict(&on, &run);
    let time = time::predict(&on, &run);
    let hw = &problem.hardware;
    let keep = 1.0 - problem.cost.margin;
    let fits = memory.per_device_peak_bytes <= problem.usable_device_bytes()
        && memory.host_bytes_per_node as f64 <= hw.host_memory_bytes as f64 * keep
        && memory.nvme_bytes_per_node <= hw.nvme_bytes;
    Plan {
        strategy: *strategy,
        fits,
        memory,
        time,
        fidelity_tier: strategy.fidelity_tier(),
    }
}
