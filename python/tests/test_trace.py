"""The tracer's bytes per category against counts derived by hand from the configs, the event
stream's consistency, the levers' effects, and clear errors for what cannot be traced."""

import json
from collections import defaultdict

import pytest
import torch

import headroom
from conftest import GPT2, LLAMA

F32, BF16, I64 = 4, 2, 8


def gpt2_tensors():
    """GPT-2's parameter tensors' element counts (the LM head is tied to wte)."""
    d, ff, v, pos = GPT2["n_embd"], 4 * GPT2["n_embd"], GPT2["vocab_size"], GPT2["n_positions"]
    block = [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * ff, ff, ff * d, d]  # ln_1, attn, ln_2, mlp
    return [v * d, pos * d] + block * GPT2["n_layer"] + [d, d]


def llama_tensors():
    """Llama's parameter tensors' element counts: no biases, grouped K/V, untied LM head."""
    d, ff, v = LLAMA["hidden_size"], LLAMA["intermediate_size"], LLAMA["vocab_size"]
    kv = d // LLAMA["num_attention_heads"] * LLAMA["num_key_value_heads"]
    block = [d * d, d * kv, d * kv, d * d, d * ff, d * ff, ff * d, d, d]
    return [v * d] + block * LLAMA["num_hidden_layers"] + [d, v * d]


def allocated(events, category, step=None):
    return sum(
        e["size"]
        for e in events
        if e["action"] == "alloc" and e["category"] == category and (step is None or e["step"] == step)
    )


def live_at_end(events):
    live = {}
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            assert e["addr"] not in live, f"event {i} allocates live id {e['addr']}"
            live[e["addr"]] = e
        else:
            assert e["addr"] in live, f"event {i} frees id {e['addr']}, which is not live"
            del live[e["addr"]]
    return list(live.values())


def test_gpt2_fp32_foreach_bytes_per_category(gpt2_config):
    params = sum(gpt2_tensors())
    assert params == 172_288  # 64000 + 8192 + 2 × 49984 + 128
    events = headroom.trace(gpt2_config, micro_batch=2, seq_len=16, steps=2)
    assert allocated(events, "parameter") == params * F32
    for step in (0, 1):
        assert allocated(events, "gradient", step) == params * F32
        assert allocated(events, "input", step) == 2 * 16 * I64
    # exp_avg and exp_avg_sq, created once; the foreach step counts live on the host.
    assert allocated(events, "optimizer_state", 0) == 2 * params * F32
    assert allocated(events, "optimizer_state", 1) == 0
    live = live_at_end(events)
    # set_to_none frees the gradients; what stays is the model and the optimizer, and the
    # cuBLASLt workspace of Conv1D's first biased addmm (1 MiB, PyTorch's default: the trace
    # emulates CUDA's kernels by default; each cuBLAS call's own workspace is freed with it).
    by_category = defaultdict(int)
    for e in live:
        by_category[e["category"]] += e["size"]
    assert dict(by_category) == {
        "parameter": params * F32, "optimizer_state": 2 * params * F32, "other": 1 << 20
    }
    assert {e["phase"] for e in events} == {"model", "forward", "backward", "optimizer", "zero_grad"}
    assert allocated(events, "activation") > 0 and allocated(events, "temporary") > 0


def test_llama_pure_bf16_halves_the_model_states(llama_config):
    params = sum(llama_tensors())
    assert params == 2 * 64_000 + 2 * 46_208 + 64  # embed + LM head, 2 blocks, final norm
    events = headroom.trace(llama_config, micro_batch=1, seq_len=16, steps=1, dtype="bf16")
    assert allocated(events, "parameter") == params * BF16
    assert allocated(events, "gradient") == params * BF16
    assert allocated(events, "optimizer_state") == 2 * params * BF16
    assert all(e["dtype"] == "bfloat16" for e in events if e["action"] == "alloc" and e["category"] == "parameter")


def test_fused_adamw_keeps_its_step_counts_on_the_device(gpt2_config):
    tensors = gpt2_tensors()
    events = headroom.trace(gpt2_config, seq_len=8, steps=1, optimizer_impl="fused")
    # One fp32 step scalar per parameter tensor besides the two moments.
    assert allocated(events, "optimizer_state") == 2 * sum(tensors) * F32 + len(tensors) * F32


def test_autocast_keeps_fp32_weights_and_computes_in_bf16(llama_config):
    params = sum(llama_tensors())
    events = headroom.trace(llama_config, seq_len=16, steps=1, dtype="bf16-autocast")
    assert allocated(events, "parameter") == params * F32
    assert allocated(events, "gradient") == params * F32
    assert any(e["dtype"] == "bfloat16" for e in events if e["action"] == "alloc" and e["phase"] == "forward")


def test_checkpointing_keeps_fewer_activations(llama_config):
    plain = headroom.trace(llama_config, micro_batch=2, seq_len=32, steps=1)
    ckpt = headroom.trace(llama_config, micro_batch=2, seq_len=32, steps=1, gradient_checkpointing=True)
    assert allocated(ckpt, "activation") < allocated(plain, "activation")
    # The recomputation runs in the backward pass, so backward allocates more.
    backward = lambda ev: sum(e["size"] for e in ev if e["action"] == "alloc" and e["phase"] == "backward")  # noqa: E731
    assert backward(ckpt) > backward(plain)


def test_eager_attention_keeps_its_probabilities_and_sdpa_does_not(gpt2_config, llama_config):
    # GPT-2 (as many key/value heads as query heads), fp32, 2 sequences of 32: eager attention
    # saves each layer's softmax output for backward, heads · s² · b · 4 bytes = 4 · 32² · 2 · 4
    # = 32 KiB a layer; the CUDA memory-efficient kernel SDPA takes there (emulated) keeps its
    # output and log-sum-exp only.
    sdpa = headroom.trace(gpt2_config, micro_batch=2, seq_len=32, steps=1, attention="sdpa")
    eager = headroom.trace(gpt2_config, micro_batch=2, seq_len=32, steps=1, attention="eager")
    probabilities = GPT2["n_layer"] * GPT2["n_head"] * 32 * 32 * 2 * F32
    assert allocated(eager, "activation") - allocated(sdpa, "activation") >= probabilities
    # Llama's grouped key/value heads in fp32 send SDPA to CUDA's math kernel, which keeps the
    # probabilities as eager attention does: the same activations either way.
    sdpa = headroom.trace(llama_config, micro_batch=2, seq_len=32, steps=1, attention="sdpa")
    eager = headroom.trace(llama_config, micro_batch=2, seq_len=32, steps=1, attention="eager")
    assert allocated(eager, "activation") == allocated(sdpa, "activation")
    with pytest.raises(headroom.TraceError, match="unknown attention 'flash'"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, steps=1, attention="flash")
    with pytest.raises(headroom.TraceError, match="a model factory builds its own attention"):
        headroom.trace(lambda: torch.nn.Linear(4, 4), micro_batch=1, seq_len=8, steps=1, vocab_size=4, attention="eager")


def test_checkpointing_one_block_in_two_keeps_what_lies_between(llama_config):
    # Two identical blocks: checkpointing block 0 alone keeps less than none and more than both.
    acts = {
        every: allocated(headroom.trace(llama_config, micro_batch=2, seq_len=32, steps=1, gradient_checkpointing=every), "activation")
        for every in (False, 2, True)
    }
    assert acts[True] < acts[2] < acts[False]
    with pytest.raises(headroom.TraceError, match="positive integer K"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, steps=1, gradient_checkpointing=0.5)


def test_backward_allocations_name_their_module(gpt2_config):
    events = headroom.trace(gpt2_config, seq_len=8, steps=1)
    backward = [e for e in events if e["action"] == "alloc" and e["phase"] == "backward"]
    modules = {e.get("module") for e in backward}
    assert "model.lm_head" in modules
    assert "model.transformer.h.1.mlp.c_fc" in modules
    forward_ops = {e["op"] for e in events if e["action"] == "alloc" and e["phase"] == "forward"}
    assert "aten::addmm" in forward_ops  # GPT-2's Conv1D


def test_output_file_is_the_events(gpt2_config, tmp_path):
    out = tmp_path / "sub" / "trace.json"
    events = headroom.trace(gpt2_config, seq_len=8, steps=1, output=out)
    assert json.loads(out.read_text()) == events


def test_unknown_model_type_lists_what_transformers_knows(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "not-a-model", "hidden_size": 8}')
    with pytest.raises(headroom.TraceError) as e:
        headroom.trace(tmp_path, seq_len=8)
    message = str(e.value)
    assert "unknown model_type 'not-a-model'" in message
    assert "llama" in message and "gpt2" in message


class ReadsData(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)

    def forward(self, input_ids, labels):
        h = self.embed(input_ids)
        if h.mean().item() > 0:  # a value the trace cannot know
            h = h * 2
        return {"loss": h.sum()}


def test_a_model_that_reads_data_is_a_clear_error():
    with pytest.raises(headroom.TraceError) as e:
        headroom.trace(ReadsData, seq_len=8, vocab_size=100)
    message = str(e.value)
    assert "aten._local_scalar_dense" in message and "in model " in message
    assert ".item()" in message


@pytest.mark.parametrize(
    "config, head",
    [
        ({"model_type": "gpt2"}, "causal-lm"),
        ({"model_type": "bert"}, "masked-lm"),
        ({"model_type": "bert", "is_decoder": True}, "causal-lm"),
        ({"model_type": "t5"}, "seq2seq-lm"),
        ({"model_type": "bart"}, "seq2seq-lm"),
        ({"model_type": "bert", "architectures": ["BertLMHeadModel"]}, "causal-lm"),
        ({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]}, "masked-lm"),
    ],
)
def test_the_head_follows_the_config(config, head, tmp_path):
    from headroom.trace.model import head_for, load_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert head_for(load_config(path)) == head


def test_t5_trains_as_sequence_to_sequence(tmp_path):
    """T5's labels feed its decoder: the decoder's blocks allocate in forward and backward."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "model_type": "t5", "d_model": 32, "d_kv": 8, "d_ff": 64, "num_heads": 4, "num_layers": 1,
        "vocab_size": 100, "decoder_start_token_id": 0, "pad_token_id": 0,
    }))
    events = headroom.trace(path, seq_len=8, steps=1, device="cpu")
    modules = {e.get("module", "") for e in events if e["action"] == "alloc" and e["phase"] == "backward"}
    assert any(m.startswith("model.decoder.block.0") for m in modules)
    assert any(m.startswith("model.encoder.block.0") for m in modules)


class CallsNumpy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)

    def forward(self, input_ids, labels):
        h = self.embed(input_ids)
        h.detach().numpy()  # data the trace does not have
        return {"loss": h.sum()}


class IndexesByValue(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)

    def forward(self, input_ids, labels):
        h = self.embed(input_ids)
        return {"loss": h[h > 0].sum()}  # a shape that depends on the values


def test_a_model_that_calls_numpy_names_its_line():
    with pytest.raises(headroom.TraceError) as e:
        headroom.trace(CallsNumpy, seq_len=8, vocab_size=100, steps=1)
    message = str(e.value)
    assert "the forward pass of CallsNumpy" in message and "in forward" in message
    assert f"{__file__}:" in message  # the model's own line, not torch's
    assert ".numpy() is not supported" in message and "fake tensors hold shapes" in message
    assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_model_with_a_data_dependent_shape_is_a_clear_error():
    with pytest.raises(headroom.TraceError) as e:
        headroom.trace(IndexesByValue, seq_len=8, vocab_size=100, steps=1)
    message = str(e.value)
    assert "aten.index.Tensor" in message and "data-dependent shape" in message


def test_an_unknown_optimizer_implementation_lists_the_known_ones(gpt2_config):
    with pytest.raises(headroom.TraceError) as e:
        headroom.trace(gpt2_config, seq_len=8, steps=1, optimizer_impl="apex")
    assert "unknown optimizer implementation 'apex'" in str(e.value)
    assert "foreach, fused, for-loop" in str(e.value)


class ReadsGradients(torch.optim.Optimizer):
    """An optimizer that hands the gradients to NumPy (as one built on a C library might)."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad.numpy()


def _one_step(optimizer_class):
    with headroom.tracing(steps=1):
        model = torch.nn.Linear(4, 4)
        optimizer = optimizer_class(model.parameters())
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()


def test_an_optimizer_that_reads_data_is_a_clear_error():
    with pytest.raises(headroom.TraceError) as e:
        _one_step(ReadsGradients)
    message = str(e.value)
    assert message.startswith("ReadsGradients.step() failed under the tracer at ")
    assert "in step" in message and "fake tensors hold shapes" in message


def test_an_optimizer_that_cannot_run_names_itself():
    with pytest.raises(headroom.TraceError) as e:
        _one_step(torch.optim.SparseAdam)
    message = str(e.value)
    assert message.startswith("SparseAdam.step() failed under the tracer")
    assert "does not support dense gradients" in message and "torch.optim.AdamW" in message


def test_the_programs_own_errors_pass_unchanged():
    with pytest.raises(ZeroDivisionError):
        with headroom.tracing(steps=1):
            1 / 0
