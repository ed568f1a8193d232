"""PyTorch DDP's gradient buckets on one rank, for a trace that runs without peers.

`DistributedDataParallel` (default options: `gradient_as_bucket_view=False`,
`find_unused_parameters=False`, `bucket_cap_mb=25`, no `lazy_bucket_allocation`) keeps, beside
each parameter's own gradient, flat bucket buffers in the gradients' dtype that backward copies
each gradient into and all-reduces in place (`torch/csrc/distributed/c10d/reducer.cpp`). What
they hold, as `torch/nn/parallel/distributed.py` (`_ddp_init_helper`,
`BucketCapacityConfig.compute_bucket_size_limits`) and the reducer build them:

- at construction, one bucket per dtype holding every trainable parameter (without
  `find_unused_parameters` the first assignment's limit is `sys.maxsize`: the parameters' order
  is not yet the backward's);
- after the first backward, at the start of the second forward (`_rebuild_buckets` in
  `_pre_forward`), buckets rebuilt in the order the gradients became ready, the first closed at
  `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB) and the others at `bucket_cap_mb`; the new
  buckets are allocated before the old ones are released, so for that moment both are live.

The assignment is PyTorch's own (`torch.distributed._compute_bucket_assignment_by_size`), which
reads only the tensors' sizes and dtypes. Each bucket is recorded as category `gradient`, op
`ddp::bucket`. The all-reduce itself allocates nothing on the caching allocator (NCCL works in
place on the bucket), and a rank's bytes do not depend on the number of ranks.

Not for: FSDP (`fsdp.py`) or the training step (`step.py`).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch

from headroom.trace.recorder import StorageRecorder

BUCKET = "ddp::bucket"
# `bucket_cap_mb`'s default, 25 MiB (DistributedDataParallel's `_MB_TO_BYTES` is 1024 · 1024).
BUCKET_CAP_BYTES = 25 * 1024 * 1024


class DdpBuckets:
    """DDP's buckets for `params` (the trainable ones, in the model's order), allocated while
    the recorder runs; `before_forward(step)` rebuilds them at the second step's forward."""

    def __init__(self, recorder: StorageRecorder, params: list[torch.Tensor]):
        self._recorder = recorder
        self._params = [p for p in params if p.requires_grad]
        self._ready: list[torch.Tensor] = []
        self._seen: set[int] = set()
        self._hooks = [p.register_post_accumulate_grad_hook(self._became_ready) for p in self._params]
        self.buckets = self._allocate(self._params, [sys.maxsize], reverse=True)
        self._rebuilt = False

    def _became_ready(self, p: torch.Tensor) -> None:
        if id(p) not in self._seen:
            self._seen.add(id(p))
            self._ready.append(p)

    def _allocate(self, params: list[torch.Tensor], limits: list[int], reverse: bool) -> list[torch.Tensor]:
        import torch.distributed as dist

        if not params:
            return []
        indices, _ = dist._compute_bucket_assignment_by_size(params, limits, [False] * len(params))
        if reverse:
            # `_ddp_init_helper` hands the reducer the buckets reversed (backward's order).
            indices = list(reversed(indices))
        buckets = []
        for bucket in indices:
            numel = sum(params[i].numel() for i in bucket)
            t = torch.empty(numel, dtype=params[bucket[0]].dtype)
            event = self._recorder.see(t, BUCKET, "gradient")
            if event is not None:
                event.update(category="gradient", op=BUCKET)
            buckets.append(t)
        return buckets

    def before_forward(self, step: int) -> None:
        """At the second step's forward: the rebuild in backward's order (new buckets first,
        then the old ones released)."""
        if step < 1 or self._rebuilt:
            return
        for h in self._hooks:
            h.remove()
        self._rebuilt = True
        import torch.distributed as dist

        order = self._ready + [p for p in self._params if id(p) not in self._seen]
        rebuilt = self._allocate(order, [dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES], reverse=False)
        self.buckets = rebuilt

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def buckets_for(recorder: StorageRecorder, model: torch.nn.Module) -> Optional[DdpBuckets]:
    """The buckets DDP would keep for `model`'s trainable parameters (None if it has none)."""
    params: list[Any] = [p for p in model.parameters() if p.requires_grad]
    return DdpBuckets(recorder, params) if params else None
