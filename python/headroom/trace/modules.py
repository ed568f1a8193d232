"""Module paths for the recorder: which module (`model.layers.1.mlp.up_proj`) an op runs in.

In the forward pass (and a checkpoint's recomputation) a stack kept by forward pre- and post-
hooks names the innermost running module. In the backward pass no module hook runs per op, so
each module's forward post-hook stamps the autograd nodes it created (walking back from its
outputs' `grad_fn` to nodes already stamped, so a node keeps its innermost module; a pre-hook
first stamps what the parent computed before calling it with the parent's name) and the
backward pass reads the stamp of the node the autograd engine is running
(`torch._C._current_autograd_node()`).

Not for: phases (the training loop knows them) or categories (`recorder.py`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

_STAMP = "headroom_module"


def _tensors(value: Any, out: list) -> list:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    return out


def _stamp(node: Any, name: str) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None:
            continue
        meta = n.metadata
        if _STAMP in meta:
            continue
        meta[_STAMP] = name
        stack.extend(next_fn for next_fn, _ in n.next_functions)


class ModulePaths:
    """Tracks the running module of `model` (names as `model.named_modules()` gives them,
    prefixed with `prefix`)."""

    def __init__(self, model: torch.nn.Module, prefix: str = "model"):
        self._stack: list[str] = []
        self._handles = []
        for name, module in model.named_modules():
            path = f"{prefix}.{name}" if name else prefix
            self._handles.append(
                module.register_forward_pre_hook(self._enter(path), with_kwargs=True)
            )
            self._handles.append(module.register_forward_hook(self._leave(path), always_call=True))

    def _enter(self, path: str):
        def hook(_module, args, kwargs):
            if self._stack and torch.is_grad_enabled():
                for t in _tensors((args, kwargs), []):
                    if t.grad_fn is not None:
                        _stamp(t.grad_fn, self._stack[-1])
            self._stack.append(path)

        return hook

    def _leave(self, path: str):
        def hook(_module, _args, output):
            if self._stack and self._stack[-1] == path:
                self._stack.pop()
            if torch.is_grad_enabled():
                for t in _tensors(output, []):
                    if t.grad_fn is not None:
                        _stamp(t.grad_fn, path)

        return hook

    def current(self) -> Optional[str]:
        """The innermost running module: the forward stack's top, else the stamp of the
        autograd node being run by the backward pass."""
        if self._stack:
            return self._stack[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            return node.metadata.get(_STAMP)
        return None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
