"""The cuBLAS and cuBLASLt workspaces as PyTorch's CUDA matrix multiplies allocate them, for a
trace that runs on the CPU (where no matmul allocates a workspace).

What PyTorch 2.15 does (pytorch/pytorch `aten/src/ATen/cuda/CublasHandlePool.cpp`,
`aten/src/ATen/cuda/CUDABlasHandle.h`, `aten/src/ATen/native/cuda/Blas.cpp`):

- **The cuBLAS workspace.** Its size is `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KIB:COUNT` pairs
  summed) when set, else 32 MiB on Hopper (sm90: `4096 * 8 * 1024`) and `:4096:2:16:8`
  (8 MiB + 128 KiB) on any other GPU (`parseChosenWorkspaceSize`).
  - By default (`TORCH_CUBLAS_WORKSPACE_CACHE` unset or 0 on CUDA,
    `isCUDABlasWorkspaceCachingEnabled`) each ATen matmul takes a handle with an *eager*
    workspace (`getCurrentCUDABlasHandleWithWorkspace`): allocated through the caching
    allocator for that one call, after the call's output, and freed when it returns. It adds
    to the allocated peak only at a matmul; its block stays cached, so the reserved bytes
    carry it.
  - With `TORCH_CUBLAS_WORKSPACE_CACHE=1` the first matmul on a stream allocates it once and
    keeps it for the process's life (`setWorkspaceForHandle`). PyTorch releases whose
    documentation does not name the variable always did that; the trace does the same for
    them.
- **The cuBLASLt workspace.** An `addmm` whose bias is one row of the output's width (what
  `nn.Linear` with a bias and GPT-2's `Conv1D` run), with `beta = 1`, a float, half or
  bfloat16 input and both matrices larger than one row and column runs on cuBLASLt with the
  bias in the epilogue (`isInputCompliesAddmmCudaLt`; `_addmm_activation` also with a 2-D
  bias), unless `DISABLE_ADDMM_CUDA_LT=1`. Its workspace (`CUBLASLT_WORKSPACE_SIZE` KiB,
  1,024 by default, `parseCUDABlasLtWorkspaceSize`) is allocated by the first such call on a
  stream and kept (`getCUDABlasLtWorkspace`); such a call takes no cuBLAS workspace. With
  workspace caching on, the two are unified unless `TORCH_CUBLASLT_UNIFIED_WORKSPACE=0`: the cuBLASLt calls share the cached cuBLAS workspace.

Each is recorded in category `other`, op `cublas_workspace` or `cublaslt_workspace`. `mv`,
`addmv` and `dot` are taken to run on the eager handle like the matrix multiplies (the header
calls it the handle of ATen's operations).

Not for: the other CUDA kernels (`cuda.py`) or recording (`recorder.py`).
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

import torch

from headroom.trace.recorder import StorageRecorder

# `parseChosenWorkspaceSize`: the cuBLAS workspace when CUBLAS_WORKSPACE_CONFIG is unset.
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024  # 32 MiB on Hopper
CUBLAS_WORKSPACE_OTHER = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8": 8 MiB + 128 KiB
# `parseCUDABlasLtWorkspaceSize`: CUBLASLT_WORKSPACE_SIZE in KiB, 1,024 when unset.
CUBLASLT_WORKSPACE_KIB = 1024

# The ops that run on cuBLAS (aten/src/ATen/native/cuda/Blas.cpp).
_CUBLAS_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "_addmm_activation"}
)
_LT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def cublas_workspace_bytes(arch: str, config: Optional[str] = None) -> int:
    """The cuBLAS workspace PyTorch allocates: `config` (CUBLAS_WORKSPACE_CONFIG, `:SIZE:COUNT`
    pairs, SIZE in KiB) when it has one, else the default for `arch`."""
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return CUBLAS_WORKSPACE_SM90 if arch == "sm90" else CUBLAS_WORKSPACE_OTHER


def cublaslt_workspace_bytes(config: Optional[str] = None) -> int:
    """The cuBLASLt workspace: `config` (CUBLASLT_WORKSPACE_SIZE, KiB) when it is a number."""
    try:
        kib = int(config) if config else CUBLASLT_WORKSPACE_KIB
    except ValueError:
        kib = CUBLASLT_WORKSPACE_KIB
    return kib * 1024


def _documents_workspace_cache() -> bool:
    """Whether the installed PyTorch has eager workspaces: it documents the variable that turns
    them off (`torch.backends.cuda.blas_workspace_size`)."""
    doc = getattr(getattr(torch.backends.cuda, "blas_workspace_size", None), "__doc__", None)
    return "TORCH_CUBLAS_WORKSPACE_CACHE" in (doc or "")


def workspace_caching() -> bool:
    """Whether each stream keeps one cuBLAS workspace (`isCUDABlasWorkspaceCachingEnabled`:
    `TORCH_CUBLAS_WORKSPACE_CACHE=1`, or a PyTorch without eager workspaces)."""
    return os.environ.get("TORCH_CUBLAS_WORKSPACE_CACHE") == "1" or not _documents_workspace_cache()


def takes_cublaslt(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether this `addmm` / `_addmm_activation` runs on cuBLASLt (`isInputCompliesAddmmCudaLt`
    for CUDA, with the activation `_addmm_activation` implies)."""
    if name not in ("addmm", "_addmm_activation") or len(args) < 3:
        return False
    bias, mat1, mat2 = args[:3]
    if not all(isinstance(t, torch.Tensor) for t in (bias, mat1, mat2)):
        return False
    if mat1.dim() != 2 or mat2.dim() != 2:
        return False
    beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
    one_row = (
        bias.is_contiguous()
        and (bias.dim() == 1 or bias.squeeze().dim() == 1)
        and bias.size(-1) == mat2.size(1)
    )
    expandable = name == "_addmm_activation" and bias.dim() == 2 and all(
        b in (1, o) for b, o in zip(bias.shape, (mat1.size(0), mat2.size(1)))
    )
    return (
        beta == 1
        and (one_row or expandable)
        and mat1.dtype in _LT_DTYPES
        and min(mat1.size(0), mat1.size(1), mat2.size(0), mat2.size(1)) > 1
    )


class CublasWorkspaces:
    """Records the workspaces each cuBLAS op takes (see the module's doc) after the op's
    outputs, as the kernel allocates them after `resize_output`."""

    def __init__(self, recorder: StorageRecorder, arch: str = "sm90"):
        env = os.environ
        self._recorder = recorder
        self._cublas = cublas_workspace_bytes(arch, env.get("CUBLAS_WORKSPACE_CONFIG"))
        self._lt = cublaslt_workspace_bytes(env.get("CUBLASLT_WORKSPACE_SIZE"))
        self._cached = workspace_caching()
        # `check_env`: "0" is false, "1" true, anything else unset; unset means unified.
        self._unified = self._cached and env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE") != "0"
        self._lt_enabled = env.get("DISABLE_ADDMM_CUDA_LT") != "1"
        self._cublas_kept = False
        self._lt_kept = False
        recorder.after_op.append(self._after)

    def _after(self, func: Any, args: tuple, kwargs: dict) -> None:
        packet = getattr(func, "overloadpacket", None)
        name = getattr(packet, "__name__", "")
        if name not in _CUBLAS_OPS:
            return
        if self._lt_enabled and takes_cublaslt(name, args, kwargs):
            if self._unified:
                self._keep_cublas()
            elif not self._lt_kept:
                self._lt_kept = True
                self._recorder.allocate_fixed(self._lt, "other", "cublaslt_workspace")
        elif self._cached:
            self._keep_cublas()
        else:
            self._recorder.allocate_scratch(self._cublas, "other", "cublas_workspace")

    def _keep_cublas(self) -> None:
        if not self._cublas_kept:
            self._cublas_kept = True
            # A unified workspace is the cuBLAS size whichever call makes it: cuBLASLt's request
            # is capped at it (`getCUDABlasLtWorkspaceSize`) and allocated as at least it.
            self._recorder.allocate_fixed(self._cublas, "other", "cublas_workspace")
