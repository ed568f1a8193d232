"""The traced training loop: K steps of forward (with the loss), backward, optimizer step and
zero_grad, run under the fake mode with the recorder active, each phase named for the events
and the categories settled at the phase boundaries (the forward pass's survivors are
activations, `p.grad` is a gradient, `optimizer.state` is optimizer state).

Not for: building the model (`model.py`) or recording storages (`recorder.py`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from headroom.trace.errors import TraceError, untraceable
from headroom.trace.recorder import StorageRecorder

DTYPES = ("fp32", "bf16", "bf16-autocast", "fp16-autocast")

# The autocast dtype of each autocast precision.
AUTOCAST = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}


class TracedGradScaler(torch.amp.GradScaler):
    """PyTorch's GradScaler, whose step runs the optimizer without reading `found_inf`: its
    `.item()` has no value under fake tensors, and a trace follows the step that found no
    infinity (every step but the rare overflow). Its tensors (the scale, the growth tracker,
    `found_inf`, the inverse scale) and its in-place unscaling are PyTorch's own."""

    def _maybe_opt_step(self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

OPTIMIZER_IMPLS = ("foreach", "fused", "for-loop")


@dataclass
class Clock:
    """Where the loop is: the phase and the step the next events belong to."""

    phase: str = "model"
    step: int = 0


def make_optimizer(params: list, impl: str, lr: float = 1e-4) -> torch.optim.Optimizer:
    if impl not in OPTIMIZER_IMPLS:
        raise TraceError(f"unknown optimizer implementation {impl!r}; accepted: {', '.join(OPTIMIZER_IMPLS)}")
    return torch.optim.AdamW(params, lr=lr, foreach=impl == "foreach", fused=True if impl == "fused" else None)


def claim_model(recorder: StorageRecorder, model: torch.nn.Module) -> None:
    """Parameters and buffers, live before the first step."""
    for name, p in model.named_parameters():
        recorder.claim(p, "parameter", op="parameter")
    for name, b in model.named_buffers():
        recorder.claim(b, "other", op="buffer")


def claim_optimizer_state(recorder: StorageRecorder, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state tensors are optimizer state, except the step counts torch.optim
    keeps on the host (those of a non-fused, non-capturable optimizer), which leave the trace."""
    for group in optimizer.param_groups:
        on_device_step = bool(group.get("fused") or group.get("capturable"))
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key == "step" and not on_device_step:
                    recorder.keep_on_host(value)
                else:
                    recorder.claim(value, "optimizer_state", op="optimizer_state")


def run_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    recorder: StorageRecorder,
    clock: Clock,
    *,
    batch: tuple[int, int],
    vocab_size: int,
    steps: int,
    autocast: Optional[torch.dtype],
    loss_fn: Optional[Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]],
    on_forward: Optional[Callable[[int], None]] = None,
) -> None:
    """`on_forward(step)` runs as each step's forward begins (DDP's bucket rebuild)."""
    micro_batch, seq_len = batch
    params = [p for p in model.parameters() if p.requires_grad]
    # fp16 autocast needs loss scaling (torch.amp.GradScaler); bf16's range does not.
    scaler = TracedGradScaler("cpu") if autocast == torch.float16 else None
    for step in range(steps):
        clock.step = step
        clock.phase = "forward"
        if on_forward is not None:
            on_forward(step)
        input_ids = torch.randint(0, vocab_size, (micro_batch, seq_len))
        recorder.claim(input_ids, "input", op="input")
        cast = torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        try:
            with cast:
                loss = _loss(model, input_ids, loss_fn)
        except TraceError:
            raise
        except Exception as e:
            raise untraceable(e, f"the forward pass of {type(model).__name__} (with its loss)") from None
        recorder.promote_live("forward", step, "temporary", "activation")

        clock.phase = "backward"
        try:
            (scaler.scale(loss) if scaler is not None else loss).backward()
        except TraceError:
            raise
        except Exception as e:
            raise untraceable(e, "the backward pass") from None
        del loss
        for p in params:
            if p.grad is not None:
                recorder.claim(p.grad, "gradient", op="grad")

        clock.phase = "optimizer"
        try:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        except TraceError:
            raise
        except Exception as e:
            raise untraceable(
                e,
                f"{type(optimizer).__name__}.step()",
                "try another --optimizer-impl (foreach, fused, for-loop)",
            ) from None
        claim_optimizer_state(recorder, optimizer)

        clock.phase = "zero_grad"
        optimizer.zero_grad(set_to_none=True)
        del input_ids


def _loss(model: torch.nn.Module, input_ids: torch.Tensor, loss_fn: Optional[Callable]) -> torch.Tensor:
    if loss_fn is not None:
        loss = loss_fn(model, input_ids)
    else:
        out: Any = model(input_ids=input_ids, labels=input_ids)
        loss = getattr(out, "loss", None)
        if loss is None and isinstance(out, dict):
            loss = out.get("loss")
        if loss is None:
            raise TraceError(
                f"{type(model).__name__}(input_ids=..., labels=...) returned no loss; give a loss "
                "function f(model, input_ids) -> scalar tensor (--loss package.module:function)"
            )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise TraceError("the loss must be a scalar tensor")
    return loss
