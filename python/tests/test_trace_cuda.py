"""CUDA-faithful kernels (`headroom.trace(device="cuda")`, the default): attention traced as the
CUDA kernel PyTorch would pick, against the CPU kernels' trace (`device="cpu"`), with the
difference in the peak derived by hand."""

import torch

import headroom

B, H, T, D, V = 2, 4, 128, 16, 64
F32 = 4
A = B * H * T * D * F32  # one (B, H, T, D) fp32 tensor: 65,536 bytes
P = B * H * T * T * F32  # the (B, H, T, T) fp32 attention probabilities: 524,288 bytes
LSE = B * H * (-(-T // 32) * 32) * F32  # memory-efficient's log-sum-exp, T padded to 32: 4,096


class SelfAttention(torch.nn.Module):
    """One causal self-attention over an embedding (query = key = value), its output summed as
    the loss: the attention is the only thing the two traces differ in."""

    def __init__(self, dropout: float, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.embed = torch.nn.Embedding(V, H * D, dtype=dtype)
        self.dropout = dropout

    def forward(self, input_ids, labels=None):
        x = self.embed(input_ids).view(B, T, H, D).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(
            x, x, x, dropout_p=self.dropout, is_causal=True
        )
        return {"loss": y.float().sum()}


def peak(events):
    """The most bytes live at once, as the trace's events say (no allocator rounding)."""
    live, now, most = {}, 0, 0
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            now += e["size"]
            most = max(most, now)
        elif e["action"] == "free":
            now -= live.pop(e["addr"])
    return most


def traced(device, dropout, dtype=torch.float32):
    return headroom.trace(
        lambda: SelfAttention(dropout, dtype), micro_batch=B, seq_len=T, steps=1,
        vocab_size=V, device=device,
    )


def test_sdpa_with_dropout_keeps_the_log_sum_exp_not_the_probabilities():
    # With dropout the CPU runs the math path (its flash kernel takes no dropout); CUDA runs
    # memory-efficient attention (fp32 rules out flash). W = the embedding's 64·64·4 bytes,
    # I = the 2·128 int64 tokens; the loss and its gradient are 4 bytes each.
    # CPU, at its peak (the backward of probabilities @ value): saved for backward are the
    # scaled query and key (2 A), the probabilities, the dropout mask and the dropped
    # probabilities (3 P) and value made contiguous (A); the backward has made grad value (A)
    # and grad of the dropped probabilities (P): W + I + 4 A + 4 P + 8.
    # CUDA, at its peak (the attention's backward): the input x saved as query, key and value
    # (A), the output (A) and the log-sum-exp (LSE) saved, grad query, key, value made (3 A):
    # W + I + 5 A + LSE + 8.
    # The difference: 4 P - A - LSE = 2,097,152 - 65,536 - 4,096 = 2,027,520 bytes.
    cpu, cuda = traced("cpu", 0.1), traced("cuda", 0.1)
    assert peak(cpu) - peak(cuda) == 4 * P - A - LSE == 2_027_520
    ops = {e["op"] for e in cuda if e["action"] == "alloc"}
    assert "aten::_scaled_dot_product_efficient_attention" in ops
    assert not any(e["action"] == "alloc" and e["size"] >= P for e in cuda)
    assert any(e["action"] == "alloc" and e["size"] == P and e["category"] == "activation" for e in cpu)


def traced_program(device):
    """The same attention run by the program's own loop under `headroom.tracing`."""
    with headroom.tracing(device=device, cuda_arch="sm80") as t:
        model = SelfAttention(0.1)
        ids = torch.randint(0, V, (B, T))
        model(ids)["loss"].backward()
    return t.events


def test_a_traced_program_runs_the_cuda_kernels_when_asked():
    # `headroom.tracing(device="cuda")` swaps in the kernels `headroom.trace` does: the same
    # difference as above between the CPU's math path and CUDA's memory-efficient attention,
    # 4 P - A - LSE bytes.
    cpu, cuda = traced_program("cpu"), traced_program("cuda")
    assert peak(cpu) - peak(cuda) == 4 * P - A - LSE == 2_027_520
    ops = {e["op"] for e in cuda if e["action"] == "alloc"}
    assert "aten::_scaled_dot_product_efficient_attention" in ops


def test_a_traced_program_names_an_unknown_device_or_generation():
    for options, named in (({"device": "tpu"}, "'tpu'"), ({"cuda_arch": "sm75"}, "'sm75'")):
        try:
            headroom.tracing(**options)
        except headroom.TraceError as e:
            assert named in str(e) and "accepted" in str(e)
        else:
            raise AssertionError(f"{options} accepted")


def test_sdpa_without_dropout_costs_the_same_on_both():
    # Without dropout the CPU runs its own flash kernel, which saves the output and a (B, H, T)
    # fp32 log-sum-exp as CUDA's memory-efficient kernel does (T = 128 is a multiple of 32, so
    # no padding): the peaks are equal, the kernels differ.
    cpu, cuda = traced("cpu", 0.0), traced("cuda", 0.0)
    assert peak(cpu) == peak(cuda)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in {e.get("op") for e in cpu}
    assert "aten::_scaled_dot_product_efficient_attention" in {e.get("op") for e in cuda}


def test_bf16_sdpa_runs_cuda_flash_attention():
    # bf16 without a mask is flash's on CUDA: the output (A / 2 in bf16) and a fp32 (B, H, T)
    # log-sum-exp saved; with dropout the CPU would run math and save 3 bf16 (B, H, T, T).
    cuda = traced("cuda", 0.1, torch.bfloat16)
    flash = [e for e in cuda if e["action"] == "alloc"
             and e.get("op") == "aten::_scaled_dot_product_flash_attention"]
    assert sorted((e["size"], e["dtype"]) for e in flash) == [
        (B * H * T * F32, "float32"), (A // 2, "bfloat16")
    ]


class AutocastAttention(SelfAttention):
    """The fp32 embedding attended under bf16 autocast, as an fp32 model's SDPA runs."""

    def forward(self, input_ids, labels=None):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return super().forward(input_ids, labels)


def test_autocast_casts_sdpa_inputs_before_cuda_picks_flash():
    # Autocast runs scaled_dot_product_attention in bf16 on CUDA as on the CPU (its
    # lower-precision list), so CUDA sees bf16 without a mask and runs flash, even with
    # dropout: x is cast once (A / 2 bytes, bf16), flash saves its bf16 output (A / 2) and
    # the fp32 (B, H, T) log-sum-exp, and no (B, H, T, T) probabilities exist anywhere.
    cuda = headroom.trace(
        lambda: AutocastAttention(0.1), micro_batch=B, seq_len=T, steps=1, vocab_size=V,
        device="cuda",
    )
    flash = [e for e in cuda if e["action"] == "alloc"
             and e.get("op") == "aten::_scaled_dot_product_flash_attention"]
    assert sorted((e["size"], e["dtype"]) for e in flash) == [
        (B * H * T * F32, "float32"), (A // 2, "bfloat16")
    ]
    assert not any(e["action"] == "alloc" and e["size"] >= P // 2 for e in cuda)


def test_gpt2_config_traced_for_cuda_holds_no_attention_probabilities(gpt2_config):
    # GPT-2's attention dropout (0.1) sends the CPU to the math path: one (2, 4, 128, 128) fp32
    # probability tensor and more per layer. For CUDA none is made.
    cpu = headroom.trace(gpt2_config, micro_batch=2, seq_len=128, steps=1, device="cpu")
    cuda = headroom.trace(gpt2_config, micro_batch=2, seq_len=128, steps=1)
    size = 2 * 4 * 128 * 128 * F32
    assert any(e["action"] == "alloc" and e["size"] == size for e in cpu)
    assert not any(e["action"] == "alloc" and e["size"] == size for e in cuda)
    # Conv1D's four addmms a block run with their bias in cuBLASLt's epilogue: one 1 MiB
    # cuBLASLt workspace, kept. Every other matmul takes a 32 MiB cuBLAS workspace for its call:
    # the tied LM head's mm, then in backward two mms per Conv1D (2 blocks x 4) and two for the
    # head: 1 + 16 + 2 = 19, each freed as soon as it is made.
    assert workspaces(cuda, "cublaslt_workspace") == [(1 << 20, "other")]
    assert workspaces(cuda, "cublas_workspace") == [(32 << 20, "other")] * 19
    assert peak(cuda) - (32 << 20) < peak(cpu)


class Linear(torch.nn.Module):
    """One matrix multiply: an embedding through a bias-free linear layer, summed."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, 64)
        self.proj = torch.nn.Linear(64, 64, bias=False)

    def forward(self, input_ids, labels=None):
        return {"loss": self.proj(self.embed(input_ids)).sum()}


def traced_linear(device, **options):
    return headroom.trace(Linear, micro_batch=B, seq_len=T, steps=1, vocab_size=V, device=device,
                          **options)


def live_at_end(events):
    live = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free":
            del live[e["addr"]]
    return list(live.values())


def workspaces(events, op):
    return [(e["size"], e["category"]) for e in events if e["action"] == "alloc" and e["op"] == op]


def freed_at_once(events, op):
    """Whether each `op` allocation is freed by the very next event (within its call)."""
    for i, e in enumerate(events):
        if e["action"] == "alloc" and e["op"] == op:
            after = events[i + 1]
            if (after["action"], after["addr"]) != ("free", e["addr"]):
                return False
    return True


# Linear's mm in forward, then in backward the gradients of its input (the embedding's) and of
# its weight: three cuBLAS calls a step.
MATMULS_PER_STEP = 3


def test_each_matmul_takes_a_cublas_workspace_for_its_call(monkeypatch):
    # PyTorch 2.15's default (TORCH_CUBLAS_WORKSPACE_CACHE unset, CublasHandlePool.cpp): each
    # ATen matmul allocates its workspace after its output and frees it on return. 4096 KiB x 8
    # = 32 MiB on Hopper, ":4096:2:16:8" = 4096 KiB x 2 + 16 KiB x 8 = 8,519,680 bytes
    # elsewhere, and the deterministic setting PyTorch documents, ":16:8", 131,072.
    for var in ("CUBLAS_WORKSPACE_CONFIG", "TORCH_CUBLAS_WORKSPACE_CACHE"):
        monkeypatch.delenv(var, raising=False)
    for options, size in (({}, 33_554_432), ({"cuda_arch": "sm80"}, 8_519_680)):
        events = traced_linear("cuda", **options)
        assert workspaces(events, "cublas_workspace") == [(size, "other")] * MATMULS_PER_STEP
        assert freed_at_once(events, "cublas_workspace")
        assert not any(e["op"] == "cublas_workspace" for e in live_at_end(events))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    events = traced_linear("cuda")
    assert workspaces(events, "cublas_workspace") == [(131_072, "other")] * MATMULS_PER_STEP
    # The forward's comes after the mm's output, in the projection.
    mm = next(i for i, e in enumerate(events) if e["action"] == "alloc" and e["op"] == "aten::mm")
    first = next(i for i, e in enumerate(events) if e["action"] == "alloc" and e["op"] == "cublas_workspace")
    assert first == mm + 1
    assert events[first]["phase"] == "forward" and events[first]["module"] == "model.proj"


def test_a_cached_cublas_workspace_is_made_once_and_kept(monkeypatch):
    # TORCH_CUBLAS_WORKSPACE_CACHE=1: the first matmul on the stream allocates the workspace
    # and every later call reuses it, so every later peak carries it: the peaks differ by
    # exactly its size.
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("TORCH_CUBLAS_WORKSPACE_CACHE", "1")
    cpu = peak(traced_linear("cpu"))
    events = traced_linear("cuda")
    assert workspaces(events, "cublas_workspace") == [(33_554_432, "other")]
    assert peak(events) - cpu == 33_554_432
    assert peak(traced_linear("cuda", cuda_arch="sm80")) - cpu == 8_519_680


class BiasedLinear(torch.nn.Module):
    """An embedding through a linear layer with a bias, summed: `addmm` with a 1-D bias."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, 64)
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, input_ids, labels=None):
        return {"loss": self.proj(self.embed(input_ids)).sum()}


def traced_biased(**options):
    return headroom.trace(BiasedLinear, micro_batch=B, seq_len=T, steps=2, vocab_size=V, **options)


def test_a_biased_linear_runs_on_cublaslt_with_its_own_workspace(monkeypatch):
    # The forward's addmm has a 1-D bias of the output's width, beta 1, fp32: cuBLASLt with
    # the bias in its epilogue (isInputCompliesAddmmCudaLt). Its 1 MiB workspace
    # (CUBLASLT_WORKSPACE_SIZE's default, 1,024 KiB) is made once and kept; the two backward
    # mms of each of the 2 steps take cuBLAS workspaces for their calls.
    for var in ("CUBLAS_WORKSPACE_CONFIG", "TORCH_CUBLAS_WORKSPACE_CACHE", "CUBLASLT_WORKSPACE_SIZE",
                "DISABLE_ADDMM_CUDA_LT", "TORCH_CUBLASLT_UNIFIED_WORKSPACE"):
        monkeypatch.delenv(var, raising=False)
    events = traced_biased()
    assert workspaces(events, "cublaslt_workspace") == [(1_048_576, "other")]
    assert workspaces(events, "cublas_workspace") == [(33_554_432, "other")] * 4
    assert any(e["op"] == "cublaslt_workspace" for e in live_at_end(events))
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "256")
    assert workspaces(traced_biased(), "cublaslt_workspace") == [(262_144, "other")]
    # DISABLE_ADDMM_CUDA_LT=1 sends the addmm to cuBLAS: six per-call workspaces, no cuBLASLt.
    monkeypatch.setenv("DISABLE_ADDMM_CUDA_LT", "1")
    events = traced_biased()
    assert workspaces(events, "cublaslt_workspace") == []
    assert workspaces(events, "cublas_workspace") == [(33_554_432, "other")] * 6


def test_cached_workspaces_are_unified_unless_asked_apart(monkeypatch):
    # With caching on, cuBLASLt shares the stream's cuBLAS workspace (unified by default on
    # CUDA builds): one 32 MiB allocation for the run. TORCH_CUBLASLT_UNIFIED_WORKSPACE=0
    # keeps them apart: 32 MiB and 1 MiB, both kept.
    for var in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "DISABLE_ADDMM_CUDA_LT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TORCH_CUBLAS_WORKSPACE_CACHE", "1")
    monkeypatch.delenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", raising=False)
    events = traced_biased()
    assert workspaces(events, "cublas_workspace") == [(33_554_432, "other")]
    assert workspaces(events, "cublaslt_workspace") == []
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "0")
    events = traced_biased()
    assert workspaces(events, "cublaslt_workspace") == [(1_048_576, "other")]
    assert workspaces(events, "cublas_workspace") == [(33_554_432, "other")]


def adamw_ops(device, impl):
    """Every op two AdamW steps run (outputs' dtypes and shapes), on fake tensors of `device`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from test_trace_autocast import OpLog

    with FakeTensorMode(allow_non_fake_inputs=True):
        with torch.device(device):
            params = [torch.nn.Parameter(torch.empty(64, 32)), torch.nn.Parameter(torch.empty(32))]
        for p in params:
            p.grad = torch.empty_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, foreach=impl == "foreach",
                                fused=True if impl == "fused" else None)
        log = OpLog(every_op=True)
        with log:
            opt.step()
            opt.step()
    return log.ops


def test_adamw_steps_allocate_on_the_cpu_what_they_allocate_on_cuda():
    # PyTorch's own optimizer code on fake CUDA tensors (which need no GPU) runs the same ops
    # with the same outputs as on the CPU, so the trace needs no emulation there: foreach's
    # intermediate lists and fused's in-place kernel (its on-device step counts included).
    for impl in ("foreach", "fused"):
        cpu, cuda = adamw_ops("cpu", impl), adamw_ops("cuda", impl)
        assert cpu == cuda and len(cpu) > 10, impl


def dropout_allocations(device, inplace=False, p=0.1):
    """The allocations of one fp16 dropout over 1,024 × 1,024 elements and its backward."""
    with headroom.tracing(device=device) as t:
        x = torch.ones(1024, 1024, dtype=torch.float16, requires_grad=True)
        y = torch.nn.functional.dropout(x * 1, p, True, inplace=inplace)
        y.sum().backward()
    return [e for e in t.events if e["action"] == "alloc" and e["size"] >= 2**20]


def test_dropout_keeps_a_one_byte_mask_on_cuda_and_a_16_bit_noise_on_the_cpu():
    # N = 1,048,576 elements. CUDA's fused native_dropout saves a bool mask, N bytes; the CPU's
    # composite multiplies by a noise tensor in the input's dtype, 2 N bytes, which the
    # product saves. Both make the 2 N-byte output.
    n = 1024 * 1024
    cuda = {(e["op"], e["dtype"], e["size"], e["category"]) for e in dropout_allocations("cuda")}
    cpu = {(e["op"], e["dtype"], e["size"], e["category"]) for e in dropout_allocations("cpu")}
    assert ("aten::native_dropout", "bool", n, "activation") in cuda
    assert not any(dtype == "bool" for _, dtype, _, _ in cpu)
    assert ("aten::empty_like", "float16", 2 * n, "activation") in cpu


def test_in_place_or_zero_probability_dropout_is_the_composite_on_cuda_too():
    # `dropout_` takes `_dropout_impl` on CUDA as well, and p = 0 returns the input.
    in_place = dropout_allocations("cuda", inplace=True)
    assert any(e["op"] == "aten::empty_like" and e["dtype"] == "float16" for e in in_place)
    assert not any(e["op"].startswith("aten::native_dropout") for e in dropout_allocations("cuda", p=0.0))
