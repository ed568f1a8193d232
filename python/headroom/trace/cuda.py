"""CUDA-faithful kernels for a trace that runs on the CPU: where a CUDA kernel allocates
differently from the CPU kernel PyTorch would run under the fake mode, the traced program calls
the CUDA kernel's own ATen op instead, whose fake-tensor (meta) implementation gives the outputs
the CUDA kernel allocates, and whose autograd formula saves what the CUDA kernel saves for
backward. The recorder then sees the CUDA kernel's allocations, named by its op.

Emulated:

- Scaled dot-product attention (`torch.nn.functional.scaled_dot_product_attention`). PyTorch's
  CUDA dispatch (pytorch/pytorch `aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`,
  `select_sdp_backend`, priority flash, memory-efficient, math) picks:
  flash (`_scaled_dot_product_flash_attention`) for fp16/bf16 inputs without an `attn_mask`
  and a head size of at most 256 (`use_flash_attention`: `check_for_attn_mask`,
  `check_head_dim_size_flash`; grouped-query heads allowed); else memory-efficient
  (`_scaled_dot_product_efficient_attention`) when query, key and value have the same number
  of heads (`check_batch_size_and_num_heads_dense<false>`); else math
  (`_scaled_dot_product_attention_math`). Flash and memory-efficient save only the output and
  the log-sum-exp (B·H·T fp32; memory-efficient pads T to a multiple of 32: the meta functions
  in `torch/_meta_registrations.py`) where the math path saves the B·H·T·T probabilities (and
  the dropout mask and the dropped probabilities). A boolean `attn_mask` becomes an additive
  bias in the query's dtype first (`convert_boolean_attn_mask`,
  `aten/src/ATen/native/transformers/attention.cpp`), its last dimension padded to a multiple
  of 16 for memory-efficient (`preprocess_mask`, same file). Their random-number seed and
  offset are host scalars outside a CUDA graph capture (`_efficient_attention_forward`,
  `aten/src/ATen/native/transformers/cuda/attention.cu`) and leave the trace. The CPU's own
  flash kernel (no dropout, no mask that needs a gradient: T5's learned position bias sends the
  CPU to the math path) and its math path are what a `cpu` trace keeps. Under autocast the
  inputs are first cast to the autocast dtype, as autocast casts the op's inputs on CUDA and
  the CPU alike (`lower_precision_fp`, `aten/src/ATen/autocast_mode.cpp`), so an fp32 model
  under bf16 autocast runs flash.
  The function is replaced as `torch.nn.functional.scaled_dot_product_attention` (what
  transformers calls, and a checkpoint's recomputation with it) and caught by a torch function
  mode where a program bound the name before the trace.

- The cuBLAS and cuBLASLt workspaces (`cublas.py`): per call by default in PyTorch 2.15, once
  per stream with `TORCH_CUBLAS_WORKSPACE_CACHE=1`; 1 MiB kept for the bias-epilogue `addmm`s
  that run on cuBLASLt. Recorded as `other`.

- `softmax` and `log_softmax` of an fp16 tensor with `dtype=torch.float32` (what autocast asks
  for, and what transformers' eager attention asks for): CUDA runs `_softmax(x, dim,
  half_to_float=True)` on the fp16 input where the CPU first makes an fp32 copy
  (`aten/src/ATen/native/SoftMax.cpp`, `softmax` and `log_softmax`).

- Dropout (`torch.nn.functional.dropout`, `nn.Dropout`, and the dropout inside the math
  attention): CUDA runs the fused `native_dropout` for a probability strictly between 0 and 1
  (`is_fused_kernel_acceptable`, `aten/src/ATen/native/Dropout.cpp`), whose autograd saves a
  one-byte mask; the CPU's `_dropout_impl` multiplies by a noise tensor in the input's dtype,
  which the product saves (2 bytes an element in 16 bits, 4 in fp32). In-place dropout takes
  `_dropout_impl` on both.

- Autocast's op policy: CUDA's lists, not the CPU's (`autocast.py`): under autocast CUDA runs
  `pow`, `exp`, `rsqrt`, `layer_norm` and the losses in fp32 and gives `softmax`, `log_softmax`
  and `sum` an fp32 result.

Not emulated here, and why: cross-entropy outside autocast needs nothing (CUDA's `log_softmax`,
like the CPU's, returns the input's dtype; transformers' `ForCausalLMLoss` upcasts logits to fp32
itself on either device). The CUDA context (driver, kernels' code) lives outside the caching allocator
(`torch.cuda.memory_allocated` and `memory_reserved` never count it), so no allocator event can
hold it; a device's capacity for the replay is what is left after it.

Not for: recording (`recorder.py`) or running the steps (`step.py`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.overrides import TorchFunctionMode

from headroom.trace.autocast import CudaAutocast
from headroom.trace.cublas import CublasWorkspaces
from headroom.trace.recorder import StorageRecorder


# `check_head_dim_size_flash` (sm80 and later): flash takes head sizes up to 256.
FLASH_MAX_HEAD_DIM = 256
# `preprocess_mask`: memory-efficient attention's bias rows are aligned to 16 elements.
EFFICIENT_BIAS_ALIGNMENT = 16

_aten = torch.ops.aten


def cuda_backend(query: torch.Tensor, key: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> str:
    """Which kernel PyTorch's CUDA dispatch runs for these inputs (see the module's doc)."""
    flash_dtype = query.dtype in (torch.float16, torch.bfloat16)
    if attn_mask is None and flash_dtype and query.size(-1) <= FLASH_MAX_HEAD_DIM:
        return "flash"
    if query.dim() == 4 and query.size(-3) == key.size(-3):
        return "efficient"
    return "math"


def _efficient_bias(attn_mask: Optional[torch.Tensor], query: torch.Tensor) -> Optional[torch.Tensor]:
    """The additive bias memory-efficient attention reads: a boolean mask as 0 / -inf in the
    query's dtype, the last dimension padded to a multiple of 16 and sliced back (a view)."""
    if attn_mask is None:
        return None
    bias = attn_mask
    if bias.dtype == torch.bool:
        zero = torch.scalar_tensor(0.0, dtype=query.dtype)
        bias = torch.where(bias.logical_not(), float("-inf"), zero)
    last = bias.size(-1)
    pad = -last % EFFICIENT_BIAS_ALIGNMENT
    if pad:
        bias = torch.nn.functional.pad(bias, (0, pad))[..., :last]
    return bias


def _autocast_inputs(*tensors: Optional[torch.Tensor]) -> tuple[Optional[torch.Tensor], ...]:
    """Autocast's cast of `scaled_dot_product_attention`'s inputs: the op is in the
    lower-precision list of CUDA autocast as of CPU autocast (`lower_precision_fp`,
    aten/src/ATen/autocast_mode.cpp), so under autocast its floating inputs run in the autocast
    dtype. The cast is done here, before the backend is chosen, because this function stands in
    for the op ahead of the autocast dispatch (a trace runs CPU autocast for CUDA's)."""
    if not torch.is_autocast_enabled("cpu"):
        return tensors
    low = torch.get_autocast_dtype("cpu")
    return tuple(
        t.to(low) if t is not None and t.is_floating_point() and t.dtype != low else t for t in tensors
    )


def _half_to_float(op: Any, fused: Any) -> Any:
    """`softmax.int` / `log_softmax.int` as CUDA runs them: fp16 to fp32 in the kernel itself,
    anything else as PyTorch's own composite."""

    def kernel(x: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        if x.dtype == torch.float16 and dtype == torch.float32:
            return fused(x, dim, True)
        return op.decompose(x, dim, dtype)

    return kernel


def _fused_dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    """`dropout` as CUDA runs it: `native_dropout` (its mask one byte an element) where
    `is_fused_kernel_acceptable` holds, else PyTorch's own composite."""
    if train and 0.0 < p < 1.0 and x.numel() > 0:
        return _aten.native_dropout(x, p, train)[0]
    return _aten.dropout.default.decompose(x, p, train)


def cuda_kernels_library() -> torch.library.Library:
    """The CUDA kernels that replace a composite, registered for the CPU's autograd key: the
    fp16-to-fp32 softmax (where the composite would copy to fp32 first) and the fused dropout;
    destroy the library to restore PyTorch's."""
    library = torch.library.Library("aten", "IMPL")
    library.impl("softmax.int", _half_to_float(_aten.softmax.int, _aten._softmax), "AutogradCPU")
    library.impl("log_softmax.int", _half_to_float(_aten.log_softmax.int, _aten._log_softmax), "AutogradCPU")
    library.impl("dropout", _fused_dropout, "AutogradCPU")
    return library


class CudaKernels(TorchFunctionMode):
    """While active, the functions with a CUDA kernel of their own run that kernel's ATen op,
    the cuBLAS ops take their workspaces (`cublas.py`), and autocast follows CUDA's op policy
    (`autocast.py`)."""

    def __init__(self, recorder: StorageRecorder, arch: str = "sm90"):
        super().__init__()
        self._recorder = recorder
        self._workspaces = CublasWorkspaces(recorder, arch)
        self._autocast = CudaAutocast()

    def __enter__(self) -> "CudaKernels":
        # The module attribute is what transformers and most code call at run time (a
        # checkpoint's recomputation included); the mode catches names bound before the trace.
        self._original_sdpa = torch.nn.functional.scaled_dot_product_attention
        self._library = cuda_kernels_library()
        self._autocast.__enter__()
        torch.nn.functional.scaled_dot_product_attention = self._sdpa
        try:
            return super().__enter__()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        torch.nn.functional.scaled_dot_product_attention = self._original_sdpa
        self._autocast.__exit__(None, None, None)
        self._library._destroy()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None):
        kwargs = kwargs or {}
        if func is self._original_sdpa:
            return self._sdpa(*args, **kwargs)
        return func(*args, **kwargs)

    def _sdpa(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Optional[float] = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        query, key, value, attn_mask = _autocast_inputs(query, key, value, attn_mask)
        backend = cuda_backend(query, key, attn_mask)
        if backend == "flash":
            out, _lse, _, _, _, _, seed, offset, _ = _aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )
        elif backend == "efficient":
            bias = _efficient_bias(attn_mask, query)
            # `should_compute_logsumexp`: the log-sum-exp is kept only for a backward pass.
            needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
            out, _lse, seed, offset = _aten._scaled_dot_product_efficient_attention(
                query, key, value, bias, needs_lse, dropout_p, is_causal, scale=scale
            )
        else:
            out, _ = _aten._scaled_dot_product_attention_math(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )
            return out
        self._recorder.keep_on_host(seed)
        self._recorder.keep_on_host(offset)
        return out
