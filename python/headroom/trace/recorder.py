"""The storage recorder: a `TorchDispatchMode` that sees every op's outputs and turns each new
untyped storage into an `alloc` event (bytes, dtype, op, module, phase, step) and its death into
a `free` event, through `weakref.finalize` on the storage object (PyTorch keeps one Python
object per storage for as long as the storage lives, fake storages included).

Categories are decided by identity and lifetime, and may change while a storage lives (its
`alloc` event is updated in place): parameters, gradients and optimizer states are what the
model and the optimizer hold; inputs are the batch; a storage allocated in the forward pass
and still alive when the forward pass ends is an activation (kept for backward: saved tensors,
checkpoint inputs, the loss); anything else is a temporary.

Optionally each `alloc` event carries the Python stack that made it (`frames`, innermost first,
as PyTorch's snapshots record them; see `frames.py`), and reads of tensor values (`.item()`,
`float(t)`, `if t > 0:`) can be answered with ones instead of an error, for tracing a user's
own loop that logs its loss.

Not for: driving the training step (`step.py`, `session.py`) or naming modules (`modules.py`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from headroom.trace.errors import TraceError

# Which category wins when a storage is claimed twice (a parameter saved for backward stays a
# parameter; a gradient AccumulateGrad stole from a backward temporary becomes a gradient).
_RANK = {
    "temporary": 0,
    "activation": 1,
    "input": 2,
    "other": 3,
    "optimizer_state": 4,
    "gradient": 5,
    "parameter": 6,
}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor that owns memory: a DTensor's local shard (FSDP2's parameters, gradients and
    optimizer states), else `t`."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


class StorageRecorder(TorchDispatchMode):
    """Records allocation events while active; `where` gives (phase, step, module) for an op."""

    def __init__(
        self,
        where: Callable[[], tuple[str, int, Optional[str]]],
        *,
        stack: Optional[Callable[[], list[dict[str, Any]]]] = None,
        zero_scalar_reads: bool = False,
        where_free: Optional[Callable[[], tuple[str, int, Optional[str]]]] = None,
    ):
        """`stack` gives the Python frames an allocation records; `zero_scalar_reads` answers
        `.item()` and the like with 1 (fake tensors hold no values; 1 keeps divisions such as
        AdamW's bias correction finite) instead of failing;
        `where_free` gives the (phase, step) of a free when it differs from `where`."""
        super().__init__()
        self.events: list[dict[str, Any]] = []
        self._where = where
        self._where_free = where_free or where
        self._stack = stack
        self._zero_scalar_reads = zero_scalar_reads
        self._next_addr = 1
        # id(storage) -> (addr, alloc event, finalizer); the finalizer removes the entry. addr
        # is None while the storage is resized to nothing (FSDP's unsharded parameters between
        # their all-gathers).
        self._live: dict[int, tuple[Optional[int], dict[str, Any], weakref.finalize]] = {}
        self._host: set[int] = set()
        self._recording = True
        # Called with each op, its args and kwargs after its outputs are recorded (the cuBLAS
        # workspaces, `cublas.py`).
        self.after_op: list[Callable[[Any, tuple, dict], None]] = []

    # -- the dispatch hook -------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._zero_scalar_reads and func is torch.ops.aten._local_scalar_dense.default:
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        try:
            out = func(*args, **(kwargs or {}))
        except (DataDependentOutputException, DynamicOutputShapeException) as e:
            phase, _, module = self._where()
            raise TraceError(
                f"{func} in {module or 'the model'} ({phase}) reads tensor data or has a "
                f"data-dependent shape, which a trace without data cannot know ({type(e).__name__}); "
                "remove .item(), .tolist(), data-dependent indexing or printing of values from the "
                "training step, or compute them outside it"
            ) from None
        except UnsupportedOperatorException as e:
            phase, _, module = self._where()
            raise TraceError(
                f"{func} in {module or 'the model'} ({phase}) has no fake-tensor implementation "
                f"({e}); it cannot be traced without a device"
            ) from None
        op = str(func.overloadpacket.__name__) if hasattr(func, "overloadpacket") else str(func)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.see(t, f"aten::{op}")
        for hook in self.after_op:
            hook(func, args, kwargs or {})
        return out

    # -- storages ----------------------------------------------------------------------------

    def see(self, t: torch.Tensor, op: str, category: str = "temporary") -> Optional[dict]:
        """Registers `t`'s storage if it is new; returns its alloc event (None for 0 bytes)."""
        st = _local(t).untyped_storage()
        entry = self._live.get(id(st))
        if entry is not None:
            return entry[1]
        size = st.nbytes()
        if size == 0:
            return None
        addr, event = self._alloc_event(size, category, _dtype_name(t.dtype), op)
        key = id(st)
        fin = weakref.finalize(st, self._freed, key)
        fin.atexit = False
        self._live[key] = (addr, event, fin)
        return event

    def _alloc_event(self, size: int, category: str, dtype: str, op: str) -> tuple[int, dict[str, Any]]:
        phase, step, module = self._where()
        addr = self._next_addr
        self._next_addr += 1
        event: dict[str, Any] = {
            "action": "alloc",
            "addr": addr,
            "size": size,
            "category": category,
            "dtype": dtype,
            "op": op,
            "phase": phase,
            "step": step,
        }
        if module:
            event["module"] = module
        if self._stack is not None:
            frames = self._stack()
            if frames:
                event["frames"] = frames
        self.events.append(event)
        return addr, event

    def resized(self, storage: Any, size: int, category: str, op: str) -> None:
        """A seen storage resized in place (`UntypedStorage.resize_`, as FSDP frees and
        re-allocates its unsharded parameters): its bytes freed, and allocated again at the new
        size as a new allocation of `category`."""
        key = id(storage)
        entry = self._live.get(key)
        if entry is None or not self._recording:
            return
        addr, event, fin = entry
        if addr is not None:
            phase, step, _ = self._where_free()
            self.events.append({"action": "free", "addr": addr, "phase": phase, "step": step})
        if size == 0:
            self._live[key] = (None, event, fin)
            return
        new_addr, new_event = self._alloc_event(size, category, event["dtype"], op)
        self._live[key] = (new_addr, new_event, fin)

    def allocate_fixed(self, size: int, category: str, op: str) -> None:
        """An allocation no tensor owns, live until the trace ends (a library's workspace)."""
        if self._recording:
            self._alloc_event(size, category, "uint8", op)

    def allocate_scratch(self, size: int, category: str, op: str) -> None:
        """An allocation no tensor owns, made and freed within one op (a per-call workspace)."""
        if not self._recording:
            return
        addr, _ = self._alloc_event(size, category, "uint8", op)
        phase, step, _ = self._where_free()
        self.events.append({"action": "free", "addr": addr, "phase": phase, "step": step})

    def _freed(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is None or entry[0] is None or not self._recording:
            return
        phase, step, _ = self._where_free()
        self.events.append({"action": "free", "addr": entry[0], "phase": phase, "step": step})

    def claim(self, t: torch.Tensor, category: str, op: str = "") -> None:
        """Marks `t`'s storage as `category` unless it already holds a higher-ranked one."""
        event = self.see(t, op or "external", category)
        if event is not None and _RANK[category] > _RANK[event["category"]]:
            event["category"] = category

    def keep_on_host(self, t: torch.Tensor) -> None:
        """`t`'s storage lives in host memory on a real run (AdamW's non-fused step counts):
        its events are left out of the trace."""
        entry = self._live.get(id(_local(t).untyped_storage()))
        if entry is not None and entry[0] is not None:
            self._host.add(entry[0])

    def promote_live(self, phase: str, step: int, frm: str, to: str) -> None:
        """Every live storage allocated in (`phase`, `step`) still in category `frm` becomes
        `to` (the forward pass's survivors become activations)."""
        for addr, event, _ in self._live.values():
            if addr is not None and event["phase"] == phase and event["step"] == step and event["category"] == frm:
                event["category"] = to

    def mark(self, phase: str, step: int) -> None:
        """A phase that may allocate nothing (a `zero_grad` that zeroes in place) as an event."""
        if self._recording:
            self.events.append({"action": "mark", "phase": phase, "step": step})

    def stop(self) -> list[dict[str, Any]]:
        """Stops recording (later frees are not events) and returns the trace's events."""
        self._recording = False
        for _, _, fin in list(self._live.values()):
            fin.detach()
        self._live.clear()
        if not self._host:
            return self.events
        return [e for e in self.events if e.get("addr") not in self._host]
