"""The tracer's one error type: a message that names the problem and the fix (the model type
PyTorch's fake tensors or transformers cannot build, the op that reads tensor data, the
optimizer that cannot be traced), raised instead of a traceback from deep inside torch.

`untraceable` turns an exception the traced program raised into that message: what failed
(the phase, the optimizer), the exception's own words, the innermost line of the program's own
code (not PyTorch's) where it was raised, and what to change.
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Optional


class TraceError(Exception):
    """The program cannot be traced as given; the message says why and what to change."""


# What PyTorch says when a program asks a fake tensor (or its storage) for data it does not hold.
_READS_DATA = (
    "not supported for tensor subclasses",  # .numpy()
    "data pointer",  # .data_ptr(), ctypes and C extensions reading memory
    "Cannot access storage",
    "Cannot access data",
    "FakeTensor",
)

_DATA_HINT = (
    "fake tensors hold shapes and dtypes but no data: remove reads of values (.numpy(), "
    ".item(), .tolist(), printing values, data-dependent shapes, extensions that read memory) "
    "from the training step, or compute them outside it"
)


def reads_data(exc: BaseException) -> bool:
    """Whether `exc` is PyTorch refusing to give a fake tensor's data."""
    text = str(exc)
    return any(marker in text for marker in _READS_DATA)


def _torch_dir() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def raised_at(tb: Optional[TracebackType]) -> Optional[str]:
    """The innermost frame of `tb` outside PyTorch and headroom, as `file:line in function`."""
    skipped = tuple(d for d in (_torch_dir(), os.path.dirname(os.path.abspath(__file__)) + os.sep) if d)
    found = None
    for frame in traceback.extract_tb(tb):
        if not os.path.abspath(frame.filename).startswith(skipped):
            found = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return found


def untraceable(exc: BaseException, what: str, fix: Optional[str] = None) -> TraceError:
    """A TraceError for `exc`, raised while `what` ran under the tracer (see the module's doc)."""
    where = raised_at(exc.__traceback__)
    at = f" at {where}" if where else ""
    hint = _DATA_HINT if reads_data(exc) else fix or "the program fails as given; fix it and trace again"
    return TraceError(f"{what} failed under the tracer{at} ({type(exc).__name__}: {exc}); {hint}")
