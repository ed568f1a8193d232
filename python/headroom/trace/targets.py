"""The devices and GPU generations a trace can emulate, and their check: importable without
torch, so that `headroom.tracing(...)` names a bad value before torch is needed.

Not for: what each emulates (`cuda.py`, `cublas.py`).
"""

from __future__ import annotations

from headroom.trace.errors import TraceError

# "cuda": the CUDA kernels' allocations (`cuda.py`); "cpu": the CPU kernels as they ran.
DEVICES = ("cuda", "cpu")
# Hopper, and Ampere with everything else (they differ in the cuBLAS workspace, `cublas.py`).
CUDA_ARCHS = ("sm90", "sm80")


def check_target(device: str, cuda_arch: str) -> None:
    """Raises a TraceError naming an unknown device or GPU generation and the accepted ones."""
    if device not in DEVICES:
        raise TraceError(f"unknown device {device!r}; accepted: {', '.join(DEVICES)}")
    if cuda_arch not in CUDA_ARCHS:
        raise TraceError(f"unknown cuda_arch {cuda_arch!r}; accepted: {', '.join(CUDA_ARCHS)}")
