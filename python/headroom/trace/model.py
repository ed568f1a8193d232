"""The model to trace: a Hugging Face causal LM built from its `config.json` with
`AutoModelForCausalLM.from_config` under PyTorch's fake tensors (no weights are read, no memory
is allocated), or whatever a user's factory (`package.module:function`, or a Python callable)
returns, called under the same fake mode.

Not for: running it (`step.py`).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable, Union

import torch

from headroom.trace.errors import TraceError

ModelSource = Union[str, Path, Callable[[], torch.nn.Module]]


def load_config(path: Union[str, Path]) -> Any:
    """The transformers config of a `config.json` (or of the directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise TraceError(
            f"{path}: no such config.json; give a Hugging Face config.json, the directory "
            "holding it, or a model factory as package.module:function"
        )
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise TraceError(f"{p} is not a readable JSON config ({e})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{p} must hold a JSON object (a Hugging Face config)")
    from transformers import CONFIG_MAPPING, __version__

    model_type = data.get("model_type")
    if not isinstance(model_type, str):
        raise TraceError(
            f"{p} has no \"model_type\"; a Hugging Face config.json names its architecture there "
            "(e.g. \"llama\", \"gpt2\")"
        )
    if model_type not in CONFIG_MAPPING:
        known = ", ".join(sorted(CONFIG_MAPPING.keys()))
        raise TraceError(
            f"{p}: unknown model_type {model_type!r}; transformers {__version__} knows: {known}. "
            "Upgrade transformers if the architecture is newer, or fix the name"
        )
    try:
        return CONFIG_MAPPING[model_type].from_dict(data)
    except (TypeError, ValueError, KeyError) as e:
        raise TraceError(f"{p}: transformers cannot read this {model_type} config ({e})") from None


def _factory(spec: str) -> Callable[[], torch.nn.Module]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise TraceError(f"{spec!r} is not package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TraceError(f"cannot import {module_name!r} for the model factory {spec!r} ({e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise TraceError(f"{module_name} has no callable {attr!r} (the model factory {spec!r})")
    return fn


def _is_factory_spec(source: ModelSource) -> bool:
    text = str(source)
    return ":" in text and not Path(text).exists() and not text.endswith(".json")


def build(source: ModelSource) -> torch.nn.Module:
    """Builds the model; call under the fake mode. Returns a module in training mode."""
    if callable(source):
        factory = source
    elif _is_factory_spec(source):
        factory = _factory(str(source))
    else:
        config = load_config(source)
        factory = lambda: _from_config(config)  # noqa: E731
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"the model factory returned {type(model).__name__}, not a torch.nn.Module")
    return model.train()


def _from_config(config: Any) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_config(config)
    except ValueError as e:
        raise TraceError(
            f"transformers has no causal-LM model for model_type {config.model_type!r} ({e}); "
            "pass a model factory that builds it instead"
        ) from None


def to_dtype(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Casts floating parameters and buffers to `dtype` in place, keeping tied weights tied
    (`Module.to` swaps tensors, which fake tensors refuse)."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            if id(p) not in done:
                done[id(p)] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
            module._parameters[name] = done[id(p)]
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_floating_point():
                if id(b) not in done:
                    done[id(b)] = b.to(dtype)
                module._buffers[name] = done[id(b)]
    return model

