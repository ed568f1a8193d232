"""CUDA's autocast op policy for a trace that runs on the CPU.

A trace runs `torch.autocast("cpu")`, whose op lists differ from CUDA's (pytorch/pytorch
`aten/src/ATen/autocast_mode.cpp`, `TORCH_LIBRARY_IMPL(aten, AutocastCPU, m)` against the
`AT_FORALL_*` lists of `aten/src/ATen/autocast_mode.h` that CUDA registers). The difference moves
bytes: CUDA runs `pow`, `exp`, `rsqrt`, `layer_norm` and the losses in fp32 and gives `softmax`,
`log_softmax`, `sum` and `cumsum` an fp32 result, so GPT-2's tanh-GELU and an eager attention's
probabilities are fp32 tensors on CUDA where CPU autocast keeps them in the autocast dtype; CPU
autocast casts `cross_entropy_loss`'s input to fp32 as a whole where CUDA leaves the op to its
parts.

While `CudaAutocast` is active, the CPU autocast dispatch key runs CUDA's policy instead:

- lower_precision_fp: floating inputs cast to the autocast dtype, fp32 leaf weights that require
  grad cast once per autocast region and reused (`cached_cast`, cleared with the region as
  `torch.clear_autocast_cache` does);
- fp32: floating inputs cast to fp32;
- fp32_set_opt_dtype: when the first input is eligible and no `dtype` is given, `dtype=float32`;
- fp32_append_dtype: `norm` redispatched to its overload with a `dtype`, float32;
- promote: inputs cast to the widest floating type among them;
- `binary_cross_entropy` refused with CUDA autocast's own message;
- every other op CPU autocast registers falls through, as on CUDA.

Eligible means floating and not double, as `is_eligible`. The registrations live in a
`torch.library.Library` that is destroyed on exit, which restores the CPU kernels.

Not for: the kernels a CUDA op runs (`cuda.py`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Optional

import torch

# pytorch/pytorch aten/src/ATen/autocast_mode.h, as of PyTorch 2.5-2.15 (op, overload).
LOWER_PRECISION_FP = (
    ("_convolution", "deprecated"), ("_convolution", ""), ("conv1d", ""), ("conv2d", ""),
    ("conv3d", ""), ("conv_tbc", ""), ("conv_transpose1d", ""), ("conv_transpose2d", "input"),
    ("conv_transpose3d", "input"), ("convolution", ""), ("prelu", ""), ("addmm", ""),
    ("addmv", ""), ("addr", ""), ("matmul", ""), ("einsum", ""), ("mm", ""), ("mv", ""),
    ("linalg_vecdot", ""), ("linear", ""), ("addbmm", ""), ("baddbmm", ""), ("bmm", ""),
    ("chain_matmul", ""), ("linalg_multi_dot", ""), ("_thnn_fused_lstm_cell", ""),
    ("_thnn_fused_gru_cell", ""), ("lstm_cell", ""), ("gru_cell", ""), ("rnn_tanh_cell", ""),
    ("rnn_relu_cell", ""), ("_scaled_dot_product_flash_attention", ""),
    ("scaled_dot_product_attention", ""),
)
FP32 = (
    ("acos", ""), ("asin", ""), ("cosh", ""), ("erfinv", ""), ("exp", ""), ("expm1", ""),
    ("log", ""), ("log10", ""), ("log2", ""), ("log1p", ""), ("reciprocal", ""), ("rsqrt", ""),
    ("sinh", ""), ("tan", ""), ("pow", "Tensor_Scalar"), ("pow", "Tensor_Tensor"),
    ("pow", "Scalar"), ("softplus", ""), ("layer_norm", ""), ("native_layer_norm", ""),
    ("group_norm", ""), ("frobenius_norm", "dim"), ("nuclear_norm", ""), ("nuclear_norm", "dim"),
    ("cosine_similarity", ""), ("poisson_nll_loss", ""), ("cosine_embedding_loss", ""),
    ("nll_loss", ""), ("nll_loss2d", ""), ("hinge_embedding_loss", ""), ("kl_div", ""),
    ("l1_loss", ""), ("smooth_l1_loss", ""), ("huber_loss", ""), ("mse_loss", ""),
    ("margin_ranking_loss", ""), ("multilabel_margin_loss", ""), ("soft_margin_loss", ""),
    ("triplet_margin_loss", ""), ("multi_margin_loss", ""),
    ("binary_cross_entropy_with_logits", ""), ("dist", ""), ("pdist", ""), ("cdist", ""),
    ("renorm", ""), ("logsumexp", ""), ("upsample_nearest1d", ""),
    ("_upsample_nearest_exact1d", ""), ("upsample_nearest2d", ""),
    ("_upsample_nearest_exact2d", ""), ("upsample_nearest3d", ""),
    ("_upsample_nearest_exact3d", ""), ("upsample_linear1d", ""), ("upsample_bilinear2d", ""),
    ("_upsample_bilinear2d_aa", ""), ("upsample_trilinear3d", ""), ("upsample_bicubic2d", ""),
    ("_upsample_bicubic2d_aa", ""),
)
FP32_SET_OPT_DTYPE = (
    ("prod", ""), ("prod", "dim_int"), ("prod", "dim_Dimname"), ("softmax", "int"),
    ("softmax", "Dimname"), ("log_softmax", "int"), ("log_softmax", "Dimname"), ("cumprod", ""),
    ("cumprod", "dimname"), ("cumsum", ""), ("cumsum", "dimname"), ("linalg_vector_norm", ""),
    ("linalg_matrix_norm", ""), ("linalg_matrix_norm", "str_ord"), ("sum", ""),
    ("sum", "dim_IntList"), ("sum", "dim_DimnameList"),
)
# fp32_append_dtype: the overload registered, and the overload with a dtype it redispatches to.
FP32_APPEND_DTYPE = (
    (("norm", "Scalar"), ("norm", "ScalarOpt_dtype")),
    (("norm", "ScalarOpt_dim"), ("norm", "ScalarOpt_dim_dtype")),
    (("norm", "names_ScalarOpt_dim"), ("norm", "names_ScalarOpt_dim_dtype")),
)
PROMOTE = (
    ("addcdiv", ""), ("addcmul", ""), ("atan2", ""), ("bilinear", ""), ("cross", ""),
    ("dot", ""), ("vdot", ""), ("grid_sampler", ""), ("index_put", ""), ("tensordot", ""),
    ("scatter_add", ""),
)

_KEY = "AutocastCPU"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

# `binary_cross_entropy_banned`, aten/src/ATen/autocast_mode.cpp.
BCE_BANNED = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)


def _name(op: str, overload: str) -> str:
    return f"{op}.{overload}" if overload else op


def _overload(op: str, overload: str) -> Optional[torch._ops.OpOverload]:
    packet = getattr(torch.ops.aten, op, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def _eligible(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64


class CudaAutocast:
    """While active, CPU autocast applies CUDA autocast's op policy (see the module's doc)."""

    def __init__(self) -> None:
        self._library: Optional[torch.library.Library] = None
        self._cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}

    # -- casts ---------------------------------------------------------------------------------

    def _cast(self, dtype: torch.dtype, value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(dtype, v) for v in value)
        if not _eligible(value) or value.dtype == dtype:
            return value
        cacheable = (
            dtype == torch.get_autocast_dtype("cpu")
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
            and torch.is_autocast_cache_enabled()
        )
        if not cacheable:
            return value.to(dtype)
        hit = self._cache.get(id(value))
        if hit is not None and hit[0]() is value:
            return hit[1]
        cast = value.to(dtype)
        self._cache[id(value)] = (weakref.ref(value), cast)
        return cast

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- kernels -------------------------------------------------------------------------------

    def _casting(self, op: torch._ops.OpOverload, dtype_of: Callable[[tuple, dict], torch.dtype]):
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                dtype = dtype_of(args, kwargs)
                # The C++ wrapper's casts are the arguments of one call, which GCC (PyTorch's
                # Linux builds) evaluates last to first: the same order of allocations here.
                kwargs = dict(reversed([(k, self._cast(dtype, v)) for k, v in reversed(kwargs.items())]))
                args = tuple(reversed([self._cast(dtype, a) for a in reversed(args)]))
                return op(*args, **kwargs)

        return kernel

    @staticmethod
    def _set_opt_dtype(op: torch._ops.OpOverload):
        position = next(i for i, a in enumerate(op._schema.arguments) if a.name == "dtype")
        keyword_only = op._schema.arguments[position].kwarg_only

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                if args and _eligible(args[0]):
                    if keyword_only or position >= len(args):
                        if kwargs.get("dtype") is None:
                            kwargs = {**kwargs, "dtype": torch.float32}
                    elif args[position] is None:
                        args = args[:position] + (torch.float32,) + args[position + 1 :]
                return op(*args, **kwargs)

        return kernel

    @staticmethod
    def _append_dtype(target: torch._ops.OpOverload):
        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                out = torch.float32 if _eligible(args[0]) else args[0].dtype
                return target(*args, **kwargs, dtype=out)

        return kernel

    @staticmethod
    def _widest(args: tuple, kwargs: dict) -> torch.dtype:
        """`promote_type`: fp32 when any eligible input is fp32, else the autocast dtype."""
        low = torch.get_autocast_dtype("cpu")
        current = low
        stack = list(args) + list(kwargs.values())
        while stack:
            value = stack.pop()
            if isinstance(value, (list, tuple)):
                stack.extend(value)
            elif _eligible(value):
                if current == torch.float32 or value.dtype == torch.float32:
                    current = torch.float32
                elif not (current == low and value.dtype == low):
                    raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
        return current

    def _kernels(self) -> dict[str, Any]:
        """The AutocastCPU kernel for each op name, CUDA's policy, else a fallthrough."""
        kernels: dict[str, Any] = {}
        low = lambda args, kwargs: torch.get_autocast_dtype("cpu")  # noqa: E731
        fp32 = lambda args, kwargs: torch.float32  # noqa: E731
        for table, dtype_of in ((LOWER_PRECISION_FP, low), (FP32, fp32), (PROMOTE, self._widest)):
            for op, overload in table:
                target = _overload(op, overload)
                if target is not None:
                    kernels[_name(op, overload)] = self._casting(target, dtype_of)
        for op, overload in FP32_SET_OPT_DTYPE:
            target = _overload(op, overload)
            if target is not None:
                kernels[_name(op, overload)] = self._set_opt_dtype(target)
        for (op, overload), (to_op, to_overload) in FP32_APPEND_DTYPE:
            target = _overload(to_op, to_overload)
            if _overload(op, overload) is not None and target is not None:
                kernels[_name(op, overload)] = self._append_dtype(target)

        def banned(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(BCE_BANNED)

        kernels["binary_cross_entropy"] = banned
        for registered in torch._C._dispatch_get_registrations_for_dispatch_key(_KEY):
            namespace, _, name = registered.partition("::")
            if namespace == "aten" and name not in kernels:
                kernels[name] = torch.library.fallthrough_kernel
        return kernels

    # -- the context ---------------------------------------------------------------------------

    def __enter__(self) -> "CudaAutocast":
        library = torch.library.Library("aten", "IMPL")
        try:
            for name, kernel in self._kernels().items():
                library.impl(name, kernel, _KEY)
        except BaseException:
            library._destroy()
            raise
        self._library = library
        # torch.autocast's exit clears the C++ cast cache with `torch.clear_autocast_cache()`
        # when its outermost region ends; this policy's cache is cleared with it.
        self._original_clear = torch.clear_autocast_cache

        def clear() -> None:
            self._original_clear()
            self.clear_cache()

        torch.clear_autocast_cache = clear
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.clear_autocast_cache = self._original_clear
        self.clear_cache()
        if self._library is not None:
            self._library._destroy()
            self._library = None
