"""One rank of a PyTorch FSDP2 run (`torch.distributed.fsdp.fully_shard`), traced on the CPU
without a GPU or peers.

PyTorch's fake process group (`torch.testing._internal.distributed.fake_pg`: collectives that
return at once and leave their outputs as they are) stands in for the world, so rank 0 of a
world of N runs FSDP2's own code: each block and then the root are `fully_shard`ed on a 1-D
mesh, parameters become DTensors sharded on dim 0 (each rank's shard padded to ⌈dim 0 / N⌉
rows), and every forward and backward all-gathers a unit's parameters into its unsharded
buffers, frees them after (`reshard_after_forward`, the root kept gathered between forward and
backward as FSDP2 does), and reduce-scatters the gradients into sharded fp32 ones. Ranks differ
only by which rows they hold, so rank 0's trace is every rank's.

FSDP2 frees and re-allocates an unsharded parameter by resizing its storage in place
(`alloc_storage` / `free_storage` in `torch/distributed/fsdp/_fully_shard/_fsdp_param.py`), not
through an op; while a trace runs, `UntypedStorage.resize_` reports each resize to the recorder,
which turns it into a free and an allocation of category `parameter`, op `fsdp::all_gather`
(the all-gather's output buffers are claimed as parameters when FSDP creates them).

Not for: the training step (`step.py`) or a real multi-process run.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from headroom.trace.errors import TraceError
from headroom.trace.recorder import StorageRecorder

ALL_GATHER = "fsdp::all_gather"


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[Any]:
    """A fake process group of `world_size` ranks (this process rank 0) and its 1-D CPU
    device mesh, torn down on exit. Made outside the fake mode: the mesh checks real values."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise TraceError(f"fsdp must be a positive number of ranks, got {world_size!r}")
    if dist.is_initialized():
        raise TraceError(
            "a process group is already initialized; headroom.trace(fsdp=N) starts a fake one of "
            "its own: trace outside torch.distributed.init_process_group"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def blocks_of(net: torch.nn.Module) -> list[torch.nn.Module]:
    """The units FSDP wraps one by one: transformers' repeated blocks (its
    `GradientCheckpointingLayer`s), as torchtitan and Accelerate's transformer auto-wrap do."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # pragma: no cover - transformers is a dependency of the tracer
        GradientCheckpointingLayer = ()  # type: ignore[assignment]
    blocks = [m for m in net.modules() if GradientCheckpointingLayer and isinstance(m, GradientCheckpointingLayer)]
    if not blocks:
        raise TraceError(
            f"{type(net).__name__} has no transformers blocks (GradientCheckpointingLayer) to "
            "shard one by one; trace your own program with headroom.tracing instead (its "
            "fully_shard calls included; make the process group and the device mesh before "
            "entering it)"
        )
    return blocks


def shard(net: torch.nn.Module, mesh: Any, reshard_after_forward: bool) -> None:
    """`fully_shard` each block, then the root (its embeddings, final norm and head). The
    root takes FSDP2's default, which keeps it gathered from forward to backward (backward
    starts with it), unless nothing is to be resharded."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks_of(net):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    if reshard_after_forward:
        fully_shard(net, mesh=mesh)
    else:
        fully_shard(net, mesh=mesh, reshard_after_forward=False)


@contextlib.contextmanager
def recording_resizes(recorder: StorageRecorder) -> Iterator[None]:
    """While active, FSDP2's in-place storage resizes and its all-gather buffers reach the
    recorder (see the module's doc). Without FSDP2 in this PyTorch build only the resizes do."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    except ImportError:
        FSDPParam = None

    original_resize = torch.UntypedStorage.resize_
    original_init = FSDPParam.init_all_gather_outputs if FSDPParam is not None else None

    def resize_(storage: Any, size: int) -> Any:
        out = original_resize(storage, size)
        recorder.resized(storage, int(size), "parameter", ALL_GATHER)
        return out

    def init_all_gather_outputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        original_init(self, *args, **kwargs)
        for tensor in self.all_gather_outputs:
            event = recorder.see(tensor, ALL_GATHER, "parameter")
            if event is not None:
                event.update(category="parameter", op=ALL_GATHER)

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    if FSDPParam is not None:
        FSDPParam.init_all_gather_outputs = init_all_gather_outputs  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original_resize  # type: ignore[method-assign]
        if FSDPParam is not None:
            FSDPParam.init_all_gather_outputs = original_init  # type: ignore[method-assign]
