"""The Python stack of an allocation, as PyTorch's memory snapshots record it: a list of
`{"filename", "line", "name"}` frames, innermost first, with PyTorch's own frames, headroom's and
the standard library's left out (they say how an op runs, not which line of the program asked
for the memory) and at most `MAX_FRAMES` kept.

Not for: attributing the frames to a call site (the doctor does that, reading the user's code).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Any

import torch

import headroom

MAX_FRAMES = 16


def _dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path)) + os.sep


# Folders whose frames are internals: torch, headroom, the standard library.
_SKIPPED = tuple(
    {
        _dir(torch.__file__),
        _dir(headroom.__file__),
        os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
    }
)


_internal_files: dict[str, bool] = {}


def _internal(filename: str) -> bool:
    hit = _internal_files.get(filename)
    if hit is None:
        hit = filename.startswith("<") or os.path.abspath(filename).startswith(_SKIPPED)
        _internal_files[filename] = hit
    return hit


def user_frames(limit: int = MAX_FRAMES) -> list[dict[str, Any]]:
    """The calling program's frames, innermost first."""
    out: list[dict[str, Any]] = []
    frame = sys._getframe(1)
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not _internal(code.co_filename):
            out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out
