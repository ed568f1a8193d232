"""One rank of a PyTorch DDP run (`headroom.trace(ddp=True)`): DDP's gradient buckets, derived
by hand for the tiny Llama config (conftest.LLAMA) with a vocabulary of 8,192, whose 2 MiB
head fills DDP's first bucket on its own."""

import pytest

import headroom
from conftest import LLAMA, write_config
from headroom.trace import TraceError

F32 = 4
VOCAB = 8192
# Trainable parameters: embeddings and the untied head 8,192·64 each, the final norm 64, and
# per block q 64·64, k and v 32·64, o 64·64, gate, up and down 176·64, two norms 64: 46,208.
HEAD = VOCAB * 64
PARAMS = 2 * HEAD + 64 + 2 * 46_208  # 1,141,056


@pytest.fixture
def llama_8k(tmp_path):
    return write_config(tmp_path, "llama-8k", {**LLAMA, "vocab_size": VOCAB})


def buckets(events):
    return [(e["size"], e["phase"], e["step"]) for e in events
            if e["action"] == "alloc" and e.get("op") == "ddp::bucket"]


def most_live(events, op):
    live, most = {}, 0
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free":
            live.pop(e["addr"], None)
        most = max(most, sum(x["size"] for x in live.values() if x.get("op") == op))
    return most


def test_ddp_holds_one_bucket_then_rebuilds_it_in_backward_order(llama_8k):
    events = headroom.trace(llama_8k, micro_batch=2, seq_len=16, steps=2, device="cpu", ddp=True)
    # At construction one bucket of every trainable parameter. At the second forward the
    # rebuild in the order gradients became ready: the head's first (2 MiB ≥ DDP's 1 MiB first
    # bucket, which it closes alone), then everything else under the 25 MiB cap.
    assert buckets(events) == [
        (PARAMS * F32, "model", 0),
        (HEAD * F32, "forward", 1),
        ((PARAMS - HEAD) * F32, "forward", 1),
    ]
    # The new buckets are allocated before the old one is released.
    assert most_live(events, "ddp::bucket") == 2 * PARAMS * F32


def test_fsdp_and_ddp_together_are_refused(llama_config):
    with pytest.raises(TraceError, match="give one of them"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, fsdp=2, ddp=True)


def test_the_data_parallel_switches_must_be_bools(llama_config):
    # A truthy string or 0 would otherwise switch DDP or resharding silently.
    with pytest.raises(TraceError, match="ddp must be True or False, got 'yes'"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, ddp="yes")
    with pytest.raises(TraceError, match="reshard_after_forward must be True or False, got 0"):
        headroom.trace(llama_config, micro_batch=1, seq_len=8, fsdp=2, reshard_after_forward=0)
