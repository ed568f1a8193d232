"""CUDA's autocast policy in a CPU trace (`headroom.trace(device="cuda")`): held op for op to
PyTorch's own CUDA autocast kernels, which run without a GPU on fake CUDA tensors, and the bytes
it moves in GPT-2's MLP derived by hand."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

import headroom
from headroom.trace.autocast import CudaAutocast
from headroom.trace.cuda import cuda_kernels_library


class OpLog(TorchDispatchMode):
    """Every ATen op that returns tensors, with their dtypes and shapes, in order; with
    `every_op` the in-place ones that return nothing too."""

    def __init__(self, every_op: bool = False):
        super().__init__()
        self.ops = []
        self.every_op = every_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else [out]
        tensors = tuple((o.dtype, tuple(o.shape)) for o in outs if isinstance(o, torch.Tensor))
        if tensors or self.every_op:
            self.ops.append((func.overloadpacket.__name__, tensors))
        return out


class Block(torch.nn.Module):
    """A GPT-2 block with what autocast treats differently on the two devices: layer norm, an
    eager attention's softmax, a weight used twice in one region (cast once), the tanh GELU
    written with `pow` (transformers' NewGELUActivation), and a cross-entropy loss."""

    def __init__(self, d=16, heads=2, vocab=50):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.o = torch.nn.Linear(d, d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)
        self.head = torch.nn.Linear(d, vocab)
        self.heads = heads

    def forward(self, x, labels):
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv(self.ln(x)).split(d, -1)
        )
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        probs = F.softmax(scores, dim=-1).type(v.dtype)
        x = x + self.o(self.o(torch.matmul(probs, v).transpose(1, 2).reshape(b, t, d)))
        u = self.up(x)
        g = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u, 3.0))))
        logits = self.head(x + self.down(g))
        return F.cross_entropy(logits.view(b * t, -1), labels)


@contextlib.contextmanager
def cuda_autocast(dtype):
    """`torch.autocast("cuda")` as its __enter__ and __exit__ set it, which the context manager
    itself refuses on a machine without CUDA."""
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", dtype)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", False)


def forward_ops(device, dtype):
    """The ops of Block's forward under autocast, on fake tensors of `device`."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device(device):
            block = Block()
            x = torch.empty(2, 8, 16)
            labels = torch.zeros(16, dtype=torch.long)
        log = OpLog()
        with log:
            with torch.autocast("cpu", dtype=dtype) if device == "cpu" else cuda_autocast(dtype):
                block(x, labels)
    return log.ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_cpu_trace_runs_the_ops_cuda_autocast_runs(dtype):
    reference = forward_ops("cuda", dtype)  # PyTorch's AutocastCUDA kernels, on fake CUDA tensors
    softmax = cuda_kernels_library()
    try:
        with CudaAutocast():
            emulated = forward_ops("cpu", dtype)
    finally:
        softmax._destroy()
    assert emulated == reference
    # Without the emulation the CPU policy runs: GELU's pow in the autocast dtype, no fp32
    # softmax, so the test can tell the two apart.
    cpu = forward_ops("cpu", dtype)
    assert cpu != reference
    assert ("pow", ((torch.float32, (2, 8, 64)),)) in reference
    assert ("pow", ((dtype, (2, 8, 64)),)) in cpu
    # The registrations are gone on exit: CPU autocast is PyTorch's own again.
    assert forward_ops("cpu", dtype) == cpu


def test_gpt2_mlp_under_bf16_autocast_holds_fp32_gelu_tensors_on_cuda(gpt2_config):
    # GPT-2's tanh GELU starts with pow(x, 3) on c_fc's bf16 output (2 x 128 x 256 elements per
    # layer, 2 layers). CUDA autocast runs pow in fp32 (4 bytes an element, 262,144 bytes); CPU
    # autocast leaves it in bf16 (131,072 bytes).
    elements = 2 * 128 * 4 * 64

    def pow_outputs(device):
        events = headroom.trace(gpt2_config, micro_batch=2, seq_len=128, steps=1,
                                dtype="bf16-autocast", device=device)
        return sorted((e["size"], e["dtype"]) for e in events if e["action"] == "alloc"
                      and e["phase"] == "forward" and e.get("op") == "aten::pow")

    assert pow_outputs("cuda") == [(elements * 4, "float32")] * 2
    assert pow_outputs("cpu") == [(elements * 2, "bfloat16")] * 2


def test_binary_cross_entropy_is_refused_as_cuda_autocast_refuses_it():
    with FakeTensorMode():
        p = torch.empty(4)
        with CudaAutocast(), torch.autocast("cpu", dtype=torch.bfloat16):
            with pytest.raises(RuntimeError, match="unsafe to autocast"):
                F.binary_cross_entropy(p, p)
