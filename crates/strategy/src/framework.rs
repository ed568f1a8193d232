//! The training framework a plan is for: how it lays out model states under mixed precision and
//! sharding, and how it gathers sharded parameters. Two families differ enough to change a
//! plan's bytes:
//!
//! - **DeepSpeed** (ZeRO, Rajbhandari et al. 2020): the model itself is cast to 16 bits; the
//!   engine keeps an fp32 master copy and fp32 optimizer states (K = 12 bytes per parameter),
//!   16-bit gradients; ZeRO-3 gathers parameters module by module within
//!   `stage3_prefetch_bucket_size` and `stage3_max_live_parameters`, and keeps parameters of at
//!   most `stage3_param_persistence_threshold` elements on every rank.
//! - **FSDP** (PyTorch's own stack: DDP with `torch.autocast`, FSDP's `MixedPrecision`, which is
//!   what Accelerate's FSDP plugin, torchtune and torchtitan run): the parameters stay fp32 and
//!   *are* the master copy (no separate one); gradients are fp32; FSDP gathers a whole wrapped
//!   unit (a transformer block) in the compute dtype, two at a time, and the root unit (embedding,
//!   head) for the whole step; `torch.autocast` without FSDP keeps a 16-bit cast of each weight
//!   for backward and computes softmax and norms in fp32 (the "fp32 islands").
//!
//! Not for: the bytes themselves (the planner's cost model).

use crate::named::named_enum;

named_enum!(
    #[derive(Default)]
    /// The framework whose memory layout a plan predicts.
    Framework, "--framework", {
        /// DeepSpeed's ZeRO engine (16-bit model, fp32 master and states, per-module gathering).
        #[default]
        DeepSpeed = "deepspeed",
        /// PyTorch's DDP/FSDP with autocast or FSDP mixed precision (fp32 parameters as master).
        Fsdp = "fsdp",
    }
);
