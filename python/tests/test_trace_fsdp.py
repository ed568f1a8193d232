"""Rank 0 of an FSDP2 run traced under PyTorch's fake process group
(`headroom.trace(fsdp=N)`): shards, all-gather buffers and the root kept gathered, each derived
by hand from the tiny Llama config (conftest.LLAMA) with 3 ranks, which divide none of its
widths evenly, so FSDP2's padding shows."""

import pytest

import headroom
from headroom.trace import TraceError

RANKS = 3
F32 = 4
HIDDEN, KV, FFN, VOCAB, LAYERS = 64, 32, 176, 1000, 2


def rows(dim0):
    """FSDP2's shard of dim 0 on one rank: ⌈dim0 / ranks⌉ rows (the last rank's padded)."""
    return -(-dim0 // RANKS)


# Each parameter as (dim 0, the other dimensions' product), as transformers' Llama holds it.
ROOT = [(VOCAB, HIDDEN), (VOCAB, HIDDEN), (HIDDEN, 1)]  # embeddings, lm_head (untied), final norm
BLOCK = [
    (HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),  # q, k, v, o
    (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN),  # gate, up, down
    (HIDDEN, 1), (HIDDEN, 1),  # the two RMSNorms
]
SHARDS = sum(rows(d0) * rest for d0, rest in ROOT + BLOCK * LAYERS) * F32
ROOT_GATHERED = sum(rows(d0) * RANKS * rest for d0, rest in ROOT) * F32
ALL_GATHERED = sum(rows(d0) * RANKS * rest for d0, rest in ROOT + BLOCK * LAYERS) * F32


def trace(llama_config, **options):
    return headroom.trace(llama_config, micro_batch=2, seq_len=16, steps=1, device="cpu",
                          fsdp=RANKS, **options)


def allocated(events, category, before_phase=None):
    """Bytes allocated in `category` (before the first event of `before_phase`, if given)."""
    total = 0
    for e in events:
        if before_phase is not None and e.get("phase") == before_phase:
            break
        if e["action"] == "alloc" and e["category"] == category:
            total += e["size"]
    return total


def live_at_first(events, phase, category):
    live = {}
    for e in events:
        if e.get("phase") == phase:
            break
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free":
            live.pop(e["addr"], None)
    return sum(e["size"] for e in live.values() if e["category"] == category)


def test_parameters_gradients_and_states_are_sharded_over_the_ranks(llama_config):
    events = trace(llama_config)
    # By hand: the root 334·64 + 334·64 + 22 = 42,774; a block 22·64 + 11·64 + 11·64 + 22·64
    # + 59·64 + 59·64 + 22·176 + 22 + 22 = 15,692; 42,774 + 2 · 15,692 = 74,158 fp32 values.
    assert SHARDS == 74_158 * F32
    assert allocated(events, "parameter", before_phase="forward") == SHARDS
    # Gradients are reduce-scattered into fp32 shards, AdamW's two states follow the shards.
    assert allocated(events, "gradient") == SHARDS
    assert allocated(events, "optimizer_state") == 2 * SHARDS


def test_the_root_stays_gathered_into_backward_unless_nothing_reshards(llama_config):
    # FSDP2 frees each block's gathered parameters after its forward and keeps the root's
    # (embeddings, head, final norm: 1,002 padded rows each) for backward, which starts there.
    assert live_at_first(trace(llama_config), "backward", "parameter") == SHARDS + ROOT_GATHERED
    # reshard_after_forward=False keeps every unit gathered until its backward.
    kept = trace(llama_config, reshard_after_forward=False)
    assert live_at_first(kept, "backward", "parameter") == SHARDS + ALL_GATHERED


def test_each_block_is_gathered_again_for_its_backward(llama_config):
    events = trace(llama_config)
    again = sum(e["size"] for e in events if e["action"] == "alloc"
                and e["phase"] == "backward" and e["op"] == "fsdp::all_gather")
    block = sum(rows(d0) * RANKS * rest for d0, rest in BLOCK) * F32
    assert again == LAYERS * block


@pytest.mark.parametrize("ranks", [0, -2, True, 1.5])
def test_a_world_that_is_no_positive_count_is_refused(llama_config, ranks):
    with pytest.raises(TraceError, match="fsdp must be a positive number of ranks"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, fsdp=ranks)


def test_a_users_own_fsdp2_loop_under_headroom_tracing_frees_its_gathers(llama_config):
    # The program makes its fake world and mesh, then builds, shards and trains inside
    # headroom.tracing: FSDP2's storage resizes are frees there too, so after the step only
    # the parameters' padded shards are held, as in headroom.trace(fsdp=3).
    import json as json_module

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoConfig, AutoModelForCausalLM

    config = json_module.loads(llama_config.read_text())
    cfg = AutoConfig.for_model(config.pop("model_type"), **config)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=RANKS)
    try:
        mesh = init_device_mesh("cpu", (RANKS,))
        with headroom.tracing(steps=1) as t:
            model = AutoModelForCausalLM.from_config(cfg)
            for block in model.model.layers:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
            ids = torch.randint(0, VOCAB, (2, 16))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    finally:
        dist.destroy_process_group()
    live = {}
    for e in t.events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free":
            live.pop(e["addr"], None)
    held = {}
    for e in live.values():
        if e["dtype"] == "float32":
            held[e["category"]] = held.get(e["category"], 0) + e["size"]
    assert held["parameter"] == SHARDS
    # Nothing of the fp32 gathers is left: every fp32 byte still held is a shard's, a sharded
    # gradient's, AdamW's or a buffer's (the int64 batch the program made is not counted here).
    assert set(held) <= {"parameter", "gradient", "optimizer_state", "other"}, held
