"""torchtitan's per-operator selective activation checkpointing, as a `context_fn` for
`torch.utils.checkpoint.checkpoint` (non-reentrant).

torchtitan v0.2.2 (`activation_checkpoint.mode = "selective"`, `selective_ac_option = "op"`;
`torchtitan/distributed/activation_checkpoint.py`, `_apply_op_sac`, and the save list
`_op_sac_save_list` of `torchtitan/models/llama3/infra/parallelize.py`) wraps each block in a
checkpoint whose policy (`torch.utils.checkpoint.create_selective_checkpoint_contexts`) keeps
the outputs of the listed compute ops and recomputes everything else in backward, except that of
the matrix multiplies (`aten.mm`) it keeps only the 1st, 3rd, 5th … of each block's run and
recomputes the others: q, v, gate and down of a Llama block are kept, k, o and up recomputed.
The counts start afresh at every checkpointed call, one for the forward and one for the
recomputation. A device-to-host copy is kept too (MoE's routing metadata).

The planner's `--checkpoint selective-op` charges the same (docs/planner.md).

Not for: which blocks are checkpointed (`headroom.trace`'s `gradient_checkpointing`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten


def _save_list() -> set:
    """`_op_sac_save_list` of torchtitan v0.2.2, less the ops this PyTorch build lacks."""
    ops = {
        _aten.mm.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        _aten._scaled_dot_product_attention_math.default,
        _aten._scaled_dot_product_fused_attention_overrideable.default,
        _aten.max.default,
    }
    functional = getattr(torch.ops, "_c10d_functional", None)
    if functional is not None and hasattr(functional, "reduce_scatter_tensor"):
        ops.add(functional.reduce_scatter_tensor.default)
    return ops


SAVE = _save_list()


def _policy(counts: dict[str, int]):
    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if (
            func == _aten._to_copy.default
            and args
            and isinstance(args[0], torch.Tensor)
            and args[0].device.type == "cuda"
            and str(kwargs.get("device")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == _aten.mm.default:
            counts[mode] += 1
            if counts[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in SAVE else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_op_context():
    """A fresh pair of contexts per checkpointed call, with its own matmul counts."""
    return create_selective_checkpoint_contexts(_policy({"forward": 0, "recompute": 0}))
