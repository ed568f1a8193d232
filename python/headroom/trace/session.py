"""`headroom.tracing`: the user's own PyTorch program traced on the CPU, without a GPU.

Inside `with headroom.tracing("trace.json"):` tensors are PyTorch fake tensors (shapes and dtypes,
no data, no memory), and every storage the program allocates and frees is recorded with its
bytes, dtype, category, phase, step and the Python stack that made it (the program's own frames,
innermost first). The program builds its model and runs its own loop; nothing in it changes.

Phases and steps come from PyTorch's own hooks: a module's forward (global forward hooks) is
`forward`, or `evaluation` when gradients are off (`torch.no_grad()`, `inference_mode`) or the
module is in `eval()` mode; work the autograd engine runs is `backward`;
`optimizer.step()` (the global optimizer step hooks) is `optimizer`, and ends a step (in a loop
that steps no optimizer, a forward/backward benchmark, a `zero_grad()` after a backward does);
`Optimizer.zero_grad` and `Module.zero_grad` are `zero_grad` (a `mark` event records it even
when it frees nothing). `Tracing.phase("evaluation")` marks what the hooks cannot tell.

Categories reuse the recorder's rules (`recorder.py`): parameters and buffers are claimed when
their module runs and when the optimizer steps, gradients and optimizer states at the optimizer
step, the root module's tensor arguments made outside any module are inputs, and a tensor autograd
saves for backward (`torch.autograd.graph.saved_tensors_hooks`) is an activation; the rest are
temporaries.

Reading a value (`loss.item()`, `float(t)`, `if t > 0:`) gives 1 (True): fake tensors hold no
values, so a loop whose control flow depends on data follows that branch (1 rather than 0 keeps
divisions such as AdamW's bias correction finite).

Where a CUDA kernel allocates differently from the CPU's (attention, dropout, cuBLAS
workspaces, half-to-float softmax), that kernel's own op runs instead, as `headroom.trace` does
(`cuda.py`); `device="cpu"` keeps PyTorch's CPU kernels.

A program that shards its model with FSDP2 is traced as it runs (under PyTorch's fake process
group, its mesh made before the block): FSDP2's in-place storage resizes are recorded as frees
and allocations (`fsdp.py`).

Not for: the fixed K-step training loop of a Hugging Face config (`headroom.trace`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional, Union

from headroom.trace.errors import TraceError

PHASES = ("forward", "backward", "optimizer", "zero_grad", "evaluation")


class StopTracing(BaseException):
    """Raised by the optimizer step that completes the `steps` asked for; the `with` block that
    started the trace swallows it. A BaseException, so `except Exception` in the loop lets it
    through."""


class Tracing:
    """The context manager `headroom.tracing` returns; `events` holds the trace after exit."""

    def __init__(
        self,
        output: Optional[Union[str, os.PathLike]] = None,
        *,
        steps: Optional[int] = None,
        device: str = "cuda",
        cuda_arch: str = "sm90",
    ):
        from headroom.trace.targets import check_target

        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise TraceError(f"steps must be a positive integer or None, got {steps!r}")
        check_target(device, cuda_arch)
        self.output = output
        self.steps = steps
        self.device = device
        self.cuda_arch = cuda_arch
        self.events: list[dict[str, Any]] = []
        self.optimizer_steps = 0
        self._active = False

    # -- where the program is ----------------------------------------------------------------

    def _advance(self) -> None:
        if self._pending:
            self._pending = False
            self._backward_since_step = False
            self._step += 1

    def _set_phase(self, phase: str) -> None:
        if phase not in ("zero_grad", "optimizer"):
            self._advance()
        if phase == "backward":
            self._backward_since_step = True
        self._phase = phase

    def _where(self) -> tuple[str, int, Optional[str]]:
        import torch

        if self._override is None and not self._in_zero_grad:
            if torch._C._current_autograd_node() is not None:
                self._set_phase("backward")
            elif self._pending:
                # The first allocation after an optimizer step begins the next step.
                self._set_phase("forward")
            elif (
                self._phase == "evaluation"
                and not self._modules
                and torch.is_grad_enabled()
                and self._last_root is not None
                and self._last_root.training
            ):
                # Gradients on and the model back in train(): the evaluation is over (the next
                # batch is being made).
                self._set_phase("forward")
        module = self._modules[-1] if self._modules else None
        return self._phase, self._step, module

    def _where_free(self) -> tuple[str, int, Optional[str]]:
        return self._phase, self._step, None

    # -- hooks -------------------------------------------------------------------------------

    def _forward_pre(self, module: Any, args: Any) -> None:
        import torch

        from headroom.trace.modules import _tensors

        if not self._modules:
            names = self._names.get(id(module))
            if names is None:
                root = type(module).__name__
                names = {id(m): f"{root}.{n}" if n else root for n, m in module.named_modules()}
                self._names[id(module)] = names
            self._root_names = names
            self._last_root = module
            if self._override is not None:
                self._set_phase(self._override)
            elif not torch.is_grad_enabled() or not module.training:
                self._set_phase("evaluation")
            else:
                self._set_phase("forward")
            for t in _tensors(args, []):
                event = self._recorder.see(t, "input")
                if event is not None and event["category"] == "temporary" and "module" not in event:
                    event["category"] = "input"
        self._modules.append(self._root_names.get(id(module), type(module).__name__))
        for p in module.parameters(recurse=False):
            self._recorder.claim(p, "parameter", op="parameter")
        for b in module.buffers(recurse=False):
            self._recorder.claim(b, "other", op="buffer")

    def _forward_post(self, module: Any, args: Any, output: Any) -> None:
        if self._modules:
            self._modules.pop()

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._set_phase("optimizer")
        self._stepping = type(optimizer).__name__
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._recorder.claim(p, "parameter", op="parameter")
                if p.grad is not None:
                    self._recorder.claim(p.grad, "gradient", op="grad")

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        from headroom.trace.step import claim_optimizer_state

        claim_optimizer_state(self._recorder, optimizer)
        self._stepping = None
        self.optimizer_steps += 1
        self._pending = True
        if self.steps is not None and self.optimizer_steps >= self.steps:
            raise StopTracing

    def _pack(self, t: Any) -> Any:
        self._recorder.claim(t, "activation", op="saved")
        return t

    @staticmethod
    def _unpack(t: Any) -> Any:
        return t

    def _zero_grad(self, original: Any):
        tracing = self

        def zero_grad(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if tracing._in_zero_grad:
                return original(obj, *args, **kwargs)
            before = tracing._phase
            tracing._in_zero_grad = True
            tracing._phase = "zero_grad"
            tracing._recorder.mark("zero_grad", tracing._step)
            # A loop that steps no optimizer (a forward/backward benchmark) ends a step here.
            if tracing.optimizer_steps == 0 and tracing._backward_since_step:
                tracing._pending = True
            try:
                return original(obj, *args, **kwargs)
            finally:
                tracing._in_zero_grad = False
                tracing._phase = before

        return zero_grad

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Marks the events inside as phase `name` (`evaluation`, …), whatever the hooks say."""
        if name not in PHASES:
            raise TraceError(f"unknown phase {name!r}; accepted: {', '.join(PHASES)}")
        if not self._active:
            raise TraceError("Tracing.phase() is used inside the `with headroom.tracing(...)` block")
        outer = self._override
        self._override = name
        self._set_phase(name)
        try:
            yield
        finally:
            self._override = outer

    # -- the context -------------------------------------------------------------------------

    def __enter__(self) -> "Tracing":
        try:
            import torch
        except ImportError:
            raise TraceError(
                "the tracer needs PyTorch, which this Python does not have; install it with: "
                "pip install torch (or pip install 'headroom-mem[trace]')"
            ) from None
        import torch.optim.optimizer as optim_hooks
        from torch._subclasses.fake_tensor import FakeTensorMode

        from headroom.trace.frames import user_frames
        from headroom.trace.fsdp import recording_resizes
        from headroom.trace.recorder import StorageRecorder

        if self._active:
            raise TraceError("this tracing context is already active; make a new headroom.tracing(...)")
        self._phase, self._step, self._pending = "model", 0, False
        self._backward_since_step = False
        self._override: Optional[str] = None
        self._in_zero_grad = False
        self._stepping: Optional[str] = None
        self._modules: list[str] = []
        self._names: dict[int, dict[int, str]] = {}
        self._root_names: dict[int, str] = {}
        self._last_root: Any = None
        self.optimizer_steps = 0
        self._recorder = StorageRecorder(
            self._where, stack=user_frames, zero_scalar_reads=True, where_free=self._where_free
        )
        self._exits = contextlib.ExitStack()
        try:
            self._exits.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            self._exits.enter_context(self._recorder)
            # FSDP2 frees and re-gathers parameters by resizing storages in place (`fsdp.py`).
            self._exits.enter_context(recording_resizes(self._recorder))
            self._exits.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack))
            if self.device == "cuda":
                from headroom.trace.cuda import CudaKernels

                self._exits.enter_context(CudaKernels(self._recorder, self.cuda_arch))
            for handle in (
                torch.nn.modules.module.register_module_forward_pre_hook(self._forward_pre),
                torch.nn.modules.module.register_module_forward_hook(self._forward_post, always_call=True),
                optim_hooks.register_optimizer_step_pre_hook(self._optimizer_pre),
                optim_hooks.register_optimizer_step_post_hook(self._optimizer_post),
            ):
                self._exits.callback(handle.remove)
            for cls in (torch.optim.Optimizer, torch.nn.Module):
                original = cls.zero_grad
                cls.zero_grad = self._zero_grad(original)
                self._exits.callback(setattr, cls, "zero_grad", original)
        except BaseException:
            self._exits.close()
            raise
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self._active = False
        self._last_root = None
        try:
            self.events = self._recorder.stop()
        finally:
            self._exits.close()
        stopped = exc_type is not None and issubclass(exc_type, StopTracing)
        if isinstance(exc, Exception) and not isinstance(exc, TraceError):
            self._explain(exc)
        if (exc_type is None or stopped) and self.output is not None:
            from headroom.trace import write_trace

            write_trace(self.events, self.output)
        return stopped


    def _explain(self, exc: Exception) -> None:
        """Raises a TraceError for an optimizer step that failed, or for a read of data fake
        tensors do not hold; other errors are the program's own and pass unchanged."""
        from headroom.trace.errors import reads_data, untraceable

        if self._stepping is not None:
            raise untraceable(
                exc,
                f"{self._stepping}.step()",
                "an optimizer is traced when its step runs PyTorch tensor ops on dense "
                "gradients, as torch.optim.AdamW's does; trace with such an optimizer instead",
            ) from None
        if reads_data(exc):
            raise untraceable(exc, f"the program ({self._phase} phase)") from None


def tracing(
    output: Optional[Union[str, os.PathLike]] = None,
    *,
    steps: Optional[int] = None,
    device: str = "cuda",
    cuda_arch: str = "sm90",
) -> Tracing:
    """Traces the program inside the `with` block under fake tensors (see the module's doc).

    output: where to write the trace (headroom's JSON, what `headroom memory doctor` and
        `headroom memory replay` read), when the block ends without an error.
    steps: stop after this many optimizer steps (the block ends there, quietly); None traces
        the whole block.
    device: "cuda" runs, where a CUDA kernel allocates differently, that kernel's own ATen op
        instead, and records the cuBLAS workspaces (`cuda.py`, as `headroom.trace` does);
        "cpu" records the CPU kernels the fake mode runs.
    cuda_arch: the GPU generation "cuda" emulates: "sm90" (Hopper) or "sm80" (Ampere and the
        rest; it sets the cuBLAS workspace's size).
    """
    return Tracing(output, steps=steps, device=device, cuda_arch=cuda_arch)
