"""torchtitan's per-operator selective checkpointing as a traced lever
(`headroom.trace(gradient_checkpointing="selective-op")`): the matmuls it keeps are not run
again in backward, the ones it drops are, counted per projection by hand."""

import collections

import pytest

import headroom
from headroom.trace import TraceError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def backward_matmuls(llama_config, checkpointing):
    """Per projection of block 0: the matmul outputs allocated in backward."""
    events = headroom.trace(llama_config, micro_batch=2, seq_len=128, steps=1, dtype="bf16",
                            gradient_checkpointing=checkpointing)
    counts = collections.Counter()
    for e in events:
        if e["action"] == "alloc" and e["phase"] == "backward" and e.get("op") == "aten::mm":
            module = e.get("module") or ""
            if ".layers.0." in module:
                counts[module.rsplit(".", 1)[-1]] += 1
    return {p: counts[p] for p in PROJECTIONS}


def test_selective_op_reruns_only_every_second_matmul_of_a_block(llama_config):
    # Every block checkpointed: each projection's matmul runs again in backward, then its two
    # gradient matmuls (input and weight): 3 each. Except down_proj: its output feeds only the
    # residual add, which saves nothing, and the recomputation stops once it has rebuilt every
    # tensor backward needs (torch.utils.checkpoint's early stop, on by default): 2.
    assert backward_matmuls(llama_config, True) == {**{p: 3 for p in PROJECTIONS}, "down_proj": 2}
    # torchtitan's policy keeps the 1st, 3rd, 5th and 7th matmul of the block's forward (q, v,
    # gate, down: 2 in backward, their gradients only) and recomputes the 2nd, 4th and 6th (k,
    # o, up: 3).
    assert backward_matmuls(llama_config, "selective-op") == {
        "q_proj": 2, "k_proj": 3, "v_proj": 2, "o_proj": 3,
        "gate_proj": 2, "up_proj": 3, "down_proj": 2,
    }


def test_an_unknown_checkpointing_policy_names_the_accepted_ones(llama_config):
    with pytest.raises(TraceError, match="selective-op"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, gradient_checkpointing="selective")
