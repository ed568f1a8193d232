"""`headroom.trace`: a PyTorch training step traced without a GPU. The model is built under
`FakeTensorMode` (tensors with shapes and dtypes but no data; no weights read, no memory
taken), K training steps run on it, and every storage allocation and free is recorded with its
bytes, dtype, category, module path, op, phase and step, as headroom's replay trace (the JSON
`headroom memory replay` reads).

torch and transformers are imported when `trace` is called, not when `headroom` is imported.
Run as `python -m headroom.trace` for the command line `headroom trace` calls.

The trace runs PyTorch's CPU kernels; by default (`device="cuda"`) the kernels whose CUDA
implementation allocates differently run as their CUDA op instead (`cuda.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Union

from headroom.trace.errors import TraceError, untraceable
from headroom.trace.session import StopTracing, Tracing, tracing
from headroom.trace.targets import check_target

# torchtitan's per-operator selective activation checkpointing (`selective.py`).
SELECTIVE_OP = "selective-op"

__all__ = ["StopTracing", "TraceError", "Tracing", "trace", "tracing", "write_trace"]


def trace(
    model: Union[str, os.PathLike, Callable[[], Any]],
    *,
    micro_batch: int = 1,
    seq_len: int,
    steps: int = 2,
    dtype: str = "fp32",
    optimizer_impl: str = "foreach",
    gradient_checkpointing: Union[bool, int, str] = False,
    attention: Optional[str] = None,
    lora_rank: Optional[int] = None,
    lora_alpha: Optional[float] = None,
    lora_targets: Optional[list[str]] = None,
    loss: Optional[Callable[[Any, Any], Any]] = None,
    vocab_size: Optional[int] = None,
    output: Optional[Union[str, os.PathLike]] = None,
    snapshot: Optional[Union[str, os.PathLike]] = None,
    device: str = "cuda",
    cuda_arch: str = "sm90",
    fsdp: Optional[int] = None,
    reshard_after_forward: bool = True,
    ddp: bool = False,
) -> list[dict]:
    """Traces `steps` training steps and returns the events (written to `output` too if given).

    model: a Hugging Face config.json (or its directory), `package.module:function`, or a
        callable returning a torch.nn.Module (called under the fake mode).
    micro_batch, seq_len: the batch of random token ids, shape (micro_batch, seq_len).
    dtype: "fp32", "bf16" (pure: weights, gradients and states in bf16), "bf16-autocast", or
        "fp16-autocast" (with torch.amp.GradScaler's loss scaling; the step that finds no
        infinity is traced).
    optimizer_impl: AdamW's "foreach", "fused" or "for-loop".
    gradient_checkpointing: the model's `gradient_checkpointing_enable()` (non-reentrant):
        True for every block; an integer K for one block in K (blocks 0, K, 2K, … of the
        model's `GradientCheckpointingLayer`s, transformers' per-layer switch), 1 being every
        block; "selective-op" for torchtitan's per-operator selective checkpointing of every
        block (`selective.py`: the outputs of every other matmul and of the attention kernel
        kept, the rest recomputed).
    attention: a config's attention implementation in transformers (`attn_implementation`):
        "sdpa" (PyTorch's scaled_dot_product_attention, whose CUDA flash and memory-efficient
        kernels `device="cuda"` emulates) or "eager" (the scores and probabilities as tensors);
        None keeps transformers' default (SDPA where the model supports it). A factory builds
        its own attention: giving it one is an error.
    lora_rank: a LoRA fine-tune through `peft` (`get_peft_model` with a `LoraConfig` of this
        rank): the base frozen, only the adapters trained. lora_alpha defaults to the rank;
        lora_targets (module names) to peft's default for the model type (Llama's q_proj and
        v_proj, GPT-2's c_attn).
    loss: f(model, input_ids) -> scalar tensor; default the model's own `labels=` loss.
    vocab_size: the token range when the model has no `config.vocab_size`.
    fsdp: trace rank 0 of an FSDP2 run of this many ranks (`fully_shard` on each block, then
        the root, under PyTorch's fake process group; `fsdp.py`): parameters, gradients and
        optimizer states sharded, each unit's parameters all-gathered around its forward and
        backward. reshard_after_forward: FSDP2's option of that name (False keeps every unit
        gathered from its forward to its backward, ZeRO-2's layout).
    ddp: trace one rank of a PyTorch DDP run (default options): beside the gradients, DDP's
        flat gradient buckets, one at construction and rebuilt in backward's order at the
        second step (`ddp.py`). A rank's bytes do not depend on the number of ranks.
    device: "cuda" (the default) rewrites what the CPU kernels allocate into what the CUDA
        kernels allocate where the two differ (`cuda.py`: attention's flash and
        memory-efficient kernels, the cuBLAS workspaces, `cublas.py`); "cpu" keeps the CPU kernels' trace
        as it ran.
    cuda_arch: the GPU generation the cuBLAS workspace is sized for: "sm90" (Hopper: H100,
        H200; 32 MiB) or "sm80" (any other: 8 MiB + 128 KiB); CUBLAS_WORKSPACE_CONFIG in the
        environment overrides both, as it does PyTorch's. Each matmul takes it for its own
        call unless TORCH_CUBLAS_WORKSPACE_CACHE=1 keeps one for the run, as in PyTorch.
    snapshot: also replay the trace through headroom's caching allocator and write the result
        as a PyTorch memory snapshot pickle (`torch.cuda.memory._snapshot()`'s segments and
        device_traces; pytorch.org/memory_viz opens it), as `headroom trace --snapshot` does.
    """
    try:
        import torch
    except ImportError:
        raise TraceError(
            "the tracer needs PyTorch, which this Python does not have; install it with: "
            "pip install torch transformers (or pip install 'headroom-mem[trace]')"
        ) from None
    from torch._subclasses.fake_tensor import FakeTensorMode

    from headroom.trace import model as model_mod
    from headroom.trace.modules import ModulePaths
    from headroom.trace.recorder import StorageRecorder
    from headroom.trace.cuda import CudaKernels
    from headroom.trace.step import AUTOCAST, DTYPES, Clock, claim_model, make_optimizer, run_steps

    check_target(device, cuda_arch)
    if dtype not in DTYPES:
        raise TraceError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if attention is not None and attention not in model_mod.ATTENTIONS:
        raise TraceError(f"unknown attention {attention!r}; accepted: {', '.join(model_mod.ATTENTIONS)}")
    if lora_rank is not None and (not isinstance(lora_rank, int) or lora_rank < 1):
        raise TraceError(f"lora_rank must be a positive integer, got {lora_rank!r}")
    every = _checkpoint_every(gradient_checkpointing)
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len), ("steps", steps)):
        if not isinstance(value, int) or value < 1:
            raise TraceError(f"{name} must be a positive integer, got {value!r}")

    from headroom.trace.ddp import buckets_for
    from headroom.trace.fsdp import fake_world, recording_resizes, shard

    for name, value in (("ddp", ddp), ("reshard_after_forward", reshard_after_forward)):
        if not isinstance(value, bool):
            raise TraceError(f"{name} must be True or False, got {value!r}")
    if fsdp is not None and ddp:
        raise TraceError("fsdp and ddp are two ways to run data parallelism; give one of them")

    world = fake_world(fsdp) if fsdp is not None else contextlib.nullcontext()
    with world as mesh, FakeTensorMode(allow_non_fake_inputs=True):
        try:
            net = model_mod.build(model, torch.bfloat16 if dtype == "bf16" else None, attention)
        except TraceError:
            raise
        except Exception as e:
            raise untraceable(e, "building the model") from None
        if every:
            _enable_checkpointing(net, every, selective_op=gradient_checkpointing == SELECTIVE_OP)
        if lora_rank is not None:
            net = model_mod.with_lora(net, lora_rank, lora_alpha, lora_targets)
        if fsdp is not None:
            try:
                shard(net, mesh, reshard_after_forward)
            except TraceError:
                raise
            except Exception as e:
                raise untraceable(e, "sharding the model with fully_shard") from None
        vocab = vocab_size or getattr(getattr(net, "config", None), "vocab_size", None)
        if not vocab:
            raise TraceError("the model has no config.vocab_size; give vocab_size (--vocab-size)")
        params = [p for p in net.parameters() if p.requires_grad]
        if not params:
            raise TraceError("the model has no trainable parameters")
        optimizer = make_optimizer(params, optimizer_impl)
        clock = Clock()
        paths = ModulePaths(net)
        recorder = StorageRecorder(lambda: (clock.phase, clock.step, paths.current()))
        try:
            kernels = CudaKernels(recorder, cuda_arch) if device == "cuda" else contextlib.nullcontext()
            resizes = recording_resizes(recorder) if fsdp is not None else contextlib.nullcontext()
            with recorder, kernels, resizes:
                claim_model(recorder, net)
                buckets = buckets_for(recorder, net) if ddp else None
                run_steps(
                    net,
                    optimizer,
                    recorder,
                    clock,
                    batch=(micro_batch, seq_len),
                    vocab_size=int(vocab),
                    steps=steps,
                    autocast=AUTOCAST.get(dtype),
                    loss_fn=loss,
                    on_forward=buckets.before_forward if buckets is not None else None,
                )
                if buckets is not None:
                    buckets.close()
        finally:
            events = recorder.stop()
            paths.remove()
    if output is not None:
        write_trace(events, output)
    if snapshot is not None:
        from headroom._commands import replay

        replay(events, snapshot=os.fspath(snapshot))
    return events


def _checkpoint_every(setting: Union[bool, int, str]) -> int:
    """0 for no checkpointing, else K: one block in K checkpointed (1: every block, and
    selective-op's blocks)."""
    if isinstance(setting, bool):
        return 1 if setting else 0
    if isinstance(setting, int) and setting >= 1:
        return setting
    if setting == SELECTIVE_OP:
        return 1
    raise TraceError(
        "gradient_checkpointing must be True, False, a positive integer K (one block in K) or "
        f"{SELECTIVE_OP!r}, got {setting!r}"
    )


def _enable_checkpointing(net: Any, every: int = 1, selective_op: bool = False) -> None:
    """Hugging Face activation checkpointing, non-reentrant (transformers 5 renamed
    `gradient_checkpointing_enable` to `activation_checkpointing_enable`), of every block, or of
    one block in `every`: transformers checkpoints each `GradientCheckpointingLayer` whose own
    `gradient_checkpointing` flag is set, so the others' flags are cleared. With `selective_op`
    each checkpoint runs under torchtitan's per-operator policy (transformers passes the
    keyword arguments on to `torch.utils.checkpoint.checkpoint`, `context_fn` among them)."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if selective_op:
        from headroom.trace.selective import selective_op_context

        kwargs["context_fn"] = selective_op_context
    if hasattr(net, "activation_checkpointing_enable"):
        net.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(net, "gradient_checkpointing_enable"):
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise TraceError(
            f"{type(net).__name__} has no activation_checkpointing_enable() or "
            "gradient_checkpointing_enable(); wrap its blocks in torch.utils.checkpoint in the "
            "factory instead"
        )
    if every == 1:
        return
    from transformers.modeling_layers import GradientCheckpointingLayer

    blocks = [m for m in net.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not blocks:
        raise TraceError(
            f"{type(net).__name__} has no GradientCheckpointingLayer blocks to checkpoint one in "
            f"{every}; checkpoint every block (gradient_checkpointing=True) instead"
        )
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i % every == 0


def write_trace(events: list[dict], path: Union[str, os.PathLike]) -> None:
    """Writes the events as headroom's replay JSON, atomically (a temporary file renamed)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(events, f, separators=(",", ":"))
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
