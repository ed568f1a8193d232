"""The model to trace: a Hugging Face model with its language-modelling head built from its
`config.json` under PyTorch's fake tensors (no weights are read, no memory is allocated), or
whatever a user's factory (`package.module:function`, or a Python callable) returns, called under
the same fake mode.

The head follows the config (`head_for`): the class its `architectures` names when that is a
causal-LM, masked-LM or sequence-to-sequence head; else sequence-to-sequence for an
encoder-decoder (T5, BART: `labels` feed the decoder), masked LM for an encoder that has one and
is not configured as a decoder (BERT, RoBERTa), causal LM otherwise (GPT-2, Llama, Mixtral).
Every head takes `input_ids` and `labels` and returns the loss.

Not for: running it (`step.py`).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable, Optional, Union

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


# transformers' `attn_implementation` values the tracer builds a config with.
ATTENTIONS = ("sdpa", "eager")


def build(
    source: ModelSource, dtype: Optional[torch.dtype] = None, attention: Optional[str] = None
) -> torch.nn.Module:
    """Builds the model; call under the fake mode. Returns a module in training mode.

    dtype: the parameters' floating dtype (None keeps the model's own). A config is built in it
    as `from_pretrained(dtype=...)` builds it (buffers the model computes in fp32, such as the
    rotary embedding's `inv_freq`, stay fp32); a factory's model is cast (`to_dtype`).
    attention: a config's `attn_implementation` ("sdpa" or "eager"; None: transformers'
    default). A factory's model has its own, so giving one is an error.
    """
    if callable(source):
        factory = source
    elif _is_factory_spec(source):
        factory = _factory(str(source))
    else:
        config = load_config(source)
        model = _from_config(config, dtype, attention)
        return model.train()
    if attention is not None:
        raise TraceError(
            f"attention={attention!r} applies to a Hugging Face config; a model factory builds "
            "its own attention: choose it in the factory"
        )
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"the model factory returned {type(model).__name__}, not a torch.nn.Module")
    if dtype is not None:
        model = to_dtype(model, dtype)
    return model.train()


HEADS = ("causal-lm", "masked-lm", "seq2seq-lm")

# The class-name endings of each head in transformers.
_HEAD_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForConditionalGeneration", "seq2seq-lm"),
    ("ForSeq2SeqLM", "seq2seq-lm"),
)


def head_for(config: Any) -> str:
    """Which language-modelling head to build for `config` (see the module's doc)."""
    from transformers.models.auto import modeling_auto as auto

    model_type = config.model_type
    causal = model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    seq2seq = model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES
    available = {"causal-lm": causal, "masked-lm": masked, "seq2seq-lm": seq2seq}
    for name in getattr(config, "architectures", None) or []:
        for suffix, head in _HEAD_SUFFIXES:
            if name.endswith(suffix) and available[head]:
                return head
    if seq2seq and getattr(config, "is_encoder_decoder", False):
        return "seq2seq-lm"
    if masked and not getattr(config, "is_decoder", False):
        return "masked-lm"
    if causal:
        return "causal-lm"
    if seq2seq:
        return "seq2seq-lm"
    raise TraceError(
        f"transformers has no causal-LM, masked-LM or sequence-to-sequence head for model_type "
        f"{model_type!r}; pass a model factory (package.module:function) that builds the model "
        "and a loss function (--loss) instead"
    )


def _from_config(config: Any, dtype: Optional[torch.dtype], attention: Optional[str] = None) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    auto_class = {
        "causal-lm": AutoModelForCausalLM,
        "masked-lm": AutoModelForMaskedLM,
        "seq2seq-lm": AutoModelForSeq2SeqLM,
    }[head_for(config)]
    options = {"attn_implementation": attention} if attention is not None else {}
    try:
        return auto_class.from_config(config, dtype=dtype, **options)
    except ValueError as e:
        raise TraceError(
            f"transformers cannot build {auto_class.__name__} for model_type "
            f"{config.model_type!r} ({e}); pass a model factory that builds it instead"
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



def with_lora(
    model: torch.nn.Module, rank: int, alpha: Optional[float], targets: Optional[list[str]]
) -> torch.nn.Module:
    """The model wrapped for a LoRA fine-tune by `peft` (`get_peft_model`): adapters of `rank`
    on `targets` (peft's default modules for the model type when None), the base frozen. Call
    under the fake mode, after checkpointing is enabled (peft keeps the base model's setting).

    peft moves each new module to its base layer's device and dtype with `Module.to`, which
    swaps tensors, and fake tensors refuse the swap; the moves are skipped (a `Module.to` that
    names a dtype casts as `to_dtype` does). Nothing is lost: the trace has one device, and the
    adapters are built in the default dtype (fp32), which is where peft leaves them
    (`autocast_adapter_dtype=True` upcasts 16-bit adapters back to fp32).
    """
    try:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        raise TraceError(
            "a LoRA trace needs peft, which this Python does not have; install it with: "
            "pip install peft"
        ) from None
    config = LoraConfig(r=rank, lora_alpha=alpha if alpha is not None else rank, target_modules=targets)
    move, module_to = BaseTunerLayer._move_adapter_to_device_of_base_layer, torch.nn.Module.to

    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        dtype = torch._C._nn._parse_to(*args, **kwargs)[1]
        return to_dtype(self, dtype) if dtype is not None else self

    BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, *args, **kwargs: None
    torch.nn.Module.to = to
    try:
        return get_peft_model(model, config)
    except ValueError as e:
        raise TraceError(
            f"peft cannot add LoRA adapters to {type(model).__name__} ({e}); name the modules "
            "to adapt (lora_targets, e.g. ['q_proj', 'v_proj'])"
        ) from None
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = move
        torch.nn.Module.to = module_to
