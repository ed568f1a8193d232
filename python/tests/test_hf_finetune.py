"""A Hugging Face checkpoint fine-tuned by `headroom train --model DIR`, read back by the
reference tools: PEFT loads the adapters `--hf-out` writes (and transformers the merged model
`--hf-merge` writes) over the same checkpoint and reproduces the validation loss headroom
reported, on the validation windows headroom reads.

The checkpoint is made here, offline: a tiny random LlamaForCausalLM (transformers, fp32) and a
byte-level BPE tokenizer trained on the repository's corpus (tokenizers)."""

import json
import math
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = Path(__file__).resolve().parents[2] / "crates" / "train" / "data" / "paradise_lost.txt"
# headroom's validation split: the last 10 % of the tokens (VALIDATION_FRACTION).
VALIDATION_FRACTION = 0.1
SEQ_LEN, MICRO_BATCH, STEPS = 32, 4, 12
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def corpus_text():
    # A slice keeps tokenizer training and the run short; whole lines, as a file would be.
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(lines[:2500])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    text = corpus_text()
    (root / "corpus.txt").write_text(text, encoding="utf-8")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=384,
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
    )
    tok.train_from_iterator(text.splitlines(), trainer=trainer)
    model_dir = root / "tiny-llama"
    model_dir.mkdir()
    tok.save(str(model_dir / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True)
    return root, model_dir, tok


def validation_windows(tok, text, eval_batches):
    """The validation batches headroom reads: windows of SEQ_LEN + 1 tokens stepping by SEQ_LEN
    through the held-out tail, MICRO_BATCH to a batch, at most `eval_batches` full batches."""
    ids = tok.encode(text, add_special_tokens=False).ids
    n = len(ids)
    start = n - int(n * VALIDATION_FRACTION)
    windows = [ids[s : s + SEQ_LEN + 1] for s in range(start, n - SEQ_LEN, SEQ_LEN)]
    full = min(len(windows) // MICRO_BATCH, eval_batches)
    return [torch.tensor(windows[b * MICRO_BATCH : (b + 1) * MICRO_BATCH]) for b in range(full)]


def mean_loss(model, batches):
    """The mean over batches of each batch's mean cross-entropy, as headroom's validation."""
    model.eval()
    with torch.no_grad():
        losses = []
        for w in batches:
            logits = model(input_ids=w[:, :-1]).logits.float()
            losses.append(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1)
            ).item())
    return sum(losses) / len(losses)


def train(cli, model_dir, root, out, *extra):
    report = root / f"{out.name}.json"
    args = [
        cli, "train", "--model", str(model_dir), "--data", str(root / "corpus.txt"),
        "--seq-len", str(SEQ_LEN), "--micro-batch", str(MICRO_BATCH), "--steps", str(STEPS),
        "--eval-every", "0", "--lr", "0.01", "--lora-rank", "8", "--lora-alpha", "16",
        "--lora-targets", TARGETS, "--hf-out", str(out), "--json-report", str(report), *extra,
    ]
    run = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(report.read_text())


def base_model(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )


def test_peft_loads_the_adapters_and_reproduces_the_validation_loss(checkpoint, headroom_cli):
    root, model_dir, tok = checkpoint
    out = root / "adapter"
    report = train(headroom_cli, model_dir, root, out)
    val = report["val_losses"]
    # Validated before the first step (the pretrained start) and at the end.
    assert [v["step"] for v in val] == [0, STEPS]
    batches = validation_windows(tok, corpus_text(), report["config"]["eval_batches"])
    assert batches, "no validation batch"

    base = base_model(model_dir)
    before = mean_loss(base, batches)
    assert abs(before - val[0]["loss"]) < 1e-3, (before, val[0]["loss"])
    # A random model's loss is near ln(vocab); the run trained the adapters below it.
    assert abs(before - math.log(tok.get_vocab_size())) < 0.5
    assert val[1]["loss"] < val[0]["loss"] - 0.02

    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["lora_alpha"] == 16
    assert sorted(config["target_modules"]) == sorted(t for t in TARGETS.split(","))
    adapted = peft.PeftModel.from_pretrained(base_model(model_dir), out)
    after = mean_loss(adapted, batches)
    assert abs(after - val[1]["loss"]) < 1e-3, (after, val[1]["loss"])
    # The adapters are what moved the loss (a name PEFT did not match would leave it at `before`).
    assert abs(after - before) > 0.05


def test_the_merged_model_loads_in_transformers_with_the_same_loss(checkpoint, headroom_cli):
    root, model_dir, tok = checkpoint
    out = root / "merged"
    report = train(headroom_cli, model_dir, root, out, "--hf-merge")
    batches = validation_windows(tok, corpus_text(), report["config"]["eval_batches"])
    merged = base_model(out)
    after = mean_loss(merged, batches)
    assert abs(after - report["val_losses"][-1]["loss"]) < 1e-3
    # The tokenizer travels with the model.
    assert (out / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()


def test_a_checkpoint_whose_shapes_differ_from_its_config_is_named(checkpoint, headroom_cli, tmp_path):
    _, model_dir, _ = checkpoint
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (broken / name).write_bytes((model_dir / name).read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    config["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(config))
    run = subprocess.run(
        [headroom_cli, "train", "--model", str(broken), "--steps", "1", "--seq-len", "16"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode != 0
    assert "model.safetensors" in run.stderr and "mlp.gate_proj.weight" in run.stderr, run.stderr
