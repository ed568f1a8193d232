"""`headroom plan --trace`: every lever setting traced and replayed, ranked as `plan` ranks."""

import json
import subprocess

SAME_SPEED = 0.05


def plan(cli, env, config, *extra, global_batch=2):
    out = subprocess.run(
        [cli, "plan", "--trace", str(config), "--gpu", "H100-80GB", "--seq-len", "16",
         "--global-batch", str(global_batch), "--trace-steps", "1", "--checkpoint", "none",
         "--optimizer-impl", "foreach", "--json", *extra],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_plan_trace_recommends_a_fitting_setting_no_slower_than_five_percent_and_its_max_context(gpt2_config, headroom_cli, cli_env):
    free = plan(headroom_cli, cli_env, gpt2_config)
    # fp32, bf16 autocast, fp16 autocast, pure bf16 × micro-batch 2 × 1 and 1 × 2.
    assert len(free["variants"]) == 8 and all("error" not in v for v in free["variants"])
    assert {(v["precision"], v["micro_batch"], v["accumulation"]) for v in free["variants"]} == {
        (p, m, 2 // m) for p in ("fp32", "bf16-mixed", "fp16-mixed", "bf16") for m in (1, 2)
    }
    # The reserved peak is the allocator's: never below the allocated peak.
    assert all(v["reserved_peak_bytes"] >= v["allocated_peak_bytes"] for v in free["variants"])
    # A budget between the smallest and the largest reserved peaks leaves some settings out.
    reserved = sorted(v["reserved_peak_bytes"] for v in free["variants"])
    budget = (reserved[0] + reserved[-1]) // 2
    assert reserved[0] < budget < reserved[-1]
    report = plan(headroom_cli, cli_env, gpt2_config, "--device-memory", str(budget), "--max-context")
    variants = report["variants"]
    for v in variants:
        assert v["fits"] == (v["reserved_peak_bytes"] <= budget)
    fitting = [v for v in variants if v["fits"]]
    assert fitting and len(fitting) < len(variants)
    best = variants[report["recommended"]]
    assert best["fits"]
    # plan's rule: no fitting setting of the same fidelity tier is more than 5 % faster.
    for v in fitting:
        if v["fidelity_tier"] == best["fidelity_tier"]:
            assert v["step_s"] >= best["step_s"] / (1 + SAME_SPEED) - 1e-12
    assert all(v["fidelity_tier"] >= best["fidelity_tier"] for v in fitting)

    # --max-context: the recommended levers at --seq-len 16 doubled, no further than GPT-2's
    # n_positions (128): 32, 64, 128.
    context = report["max_context"]
    probes = context["probes"]
    assert [p["seq_len"] for p in probes] == [32, 64, 128]
    for p in probes:
        assert p["fits"] == (p["reserved_peak_bytes"] <= budget)
    # Longer sequences never need fewer bytes.
    reserved = [p["reserved_peak_bytes"] for p in probes]
    assert reserved == sorted(reserved)
    fitting = [p["seq_len"] for p in probes if p["fits"]]
    assert context["longest_fitting_seq_len"] == (fitting[-1] if fitting else 16)


def test_plan_trace_traces_eager_attention_when_asked_and_it_costs_more(gpt2_config, headroom_cli, cli_env):
    # The same levers with transformers' eager attention: traced as asked, and timed by the
    # speed model as naive attention, whose scores and probabilities cross memory (slower).
    pins = ("--precision", "fp32", "--micro-batch", "2")
    sdpa = plan(headroom_cli, cli_env, gpt2_config, *pins)
    eager = plan(headroom_cli, cli_env, gpt2_config, *pins, "--attention", "naive")
    assert [v["attention"] for v in sdpa["variants"]] == ["memory-efficient"]
    assert [v["attention"] for v in eager["variants"]] == ["naive"]
    assert eager["configured"]["attention"] == "naive"
    assert eager["variants"][0]["step_s"] > sdpa["variants"][0]["step_s"]


def test_plan_trace_checkpoints_one_block_in_k_when_asked(gpt2_config, headroom_cli, cli_env):
    out = subprocess.run(
        [headroom_cli, "plan", "--trace", str(gpt2_config), "--gpu", "H100-80GB", "--seq-len", "16",
         "--global-batch", "2", "--trace-steps", "1", "--checkpoint", "every:2", "--precision", "fp32",
         "--micro-batch", "2", "--optimizer-impl", "foreach", "--json"],
        capture_output=True, text=True, env=cli_env, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    variants = json.loads(out.stdout)["variants"]
    assert [v["checkpoint"] for v in variants] == ["every:2"] and "error" not in variants[0]


def test_plan_trace_runs_torchtitan_selective_op_checkpointing_between_none_and_all(llama_config, headroom_cli, cli_env):
    # selective-op recomputes three of a Llama block's seven matmuls (and the elementwise ops),
    # full checkpointing the whole block: the speed model puts its step between the two.
    def step(checkpoint):
        out = subprocess.run(
            [headroom_cli, "plan", "--trace", str(llama_config), "--gpu", "H100-80GB", "--seq-len", "16",
             "--global-batch", "2", "--trace-steps", "1", "--checkpoint", checkpoint, "--precision", "bf16",
             "--micro-batch", "2", "--optimizer-impl", "foreach", "--json"],
            capture_output=True, text=True, env=cli_env, timeout=600,
        )
        assert out.returncode == 0, out.stderr
        [variant] = json.loads(out.stdout)["variants"]
        assert variant["checkpoint"] == checkpoint and "error" not in variant
        return variant["step_s"]

    assert step("none") < step("selective-op") < step("all")


def test_plan_trace_on_several_gpus_traces_a_rank_of_fsdp2_and_of_ddp(llama_config, headroom_cli, cli_env):
    # One cuBLAS workspace kept for the run (TORCH_CUBLAS_WORKSPACE_CACHE=1) is the same 32 MiB
    # in every variant; per-call workspaces would put each peak at whichever matmul has the most
    # live, which in a model this small is not where the model states differ.
    cli_env = dict(cli_env, TORCH_CUBLAS_WORKSPACE_CACHE="1")

    def variants(*gpus):
        out = subprocess.run(
            [headroom_cli, "plan", "--trace", str(llama_config), "--gpu", "H100-80GB", "--seq-len", "16",
             "--global-batch", "8", "--trace-steps", "1", "--checkpoint", "none", "--precision", "bf16",
             "--micro-batch", "2", "--optimizer-impl", "foreach", "--json", *gpus],
            capture_output=True, text=True, env=cli_env, timeout=600,
        )
        assert out.returncode == 0, out.stderr
        return {v["zero"]: v for v in json.loads(out.stdout)["variants"]}

    sharded = variants("--gpus-per-node", "4")
    assert sorted(sharded) == [0, 2, 3]
    assert all(v["ranks"] == 4 and "error" not in v and v["accumulation"] == 1 for v in sharded.values())
    # ZeRO-3 frees each block's gathered parameters after its forward, ZeRO-2 keeps them until
    # backward; one GPU holds every state whole (accumulating the batch of 8 in micro-batches
    # of 2, the same micro-batch as each rank), and a DDP rank that and its gradient buckets.
    [single] = variants().values()
    assert single["ranks"] == 1 and single["accumulation"] == 4
    peak = {zero: v["allocated_peak_bytes"] for zero, v in sharded.items()}
    assert peak[3] < peak[2] < single["allocated_peak_bytes"] < peak[0]
