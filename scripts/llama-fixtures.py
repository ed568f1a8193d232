"""Writes the Llama-family fixtures the engine's tests hold it to (crates/nn/tests/data/llama/).

For each of a tiny Llama, Mistral (a sliding window shorter than the sequence) and Qwen2 (q/k/v
biases, a tied head), built offline from a config with transformers and a fixed seed, in fp32:
  {family}/config.json          the model's config.json
  {family}/model.safetensors    its weights under Hugging Face's names
  {family}/expected.safetensors input_ids (B, T) int64, labels (B, T) int64, logits (B, T, V),
                                loss () — mean cross-entropy of logits[:, t] against labels[:, t]
                                (already shifted, every position counted) — and grad.{name} for
                                every parameter.

Run with the repository's environment: .venv/bin/python scripts/llama-fixtures.py
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(__file__), "..", "crates", "nn", "tests", "data", "llama")
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
)
FAMILIES = {
    "llama": dict(rope_theta=10000.0, tie_word_embeddings=False),
    "mistral": dict(rope_theta=1000.0, sliding_window=5, tie_word_embeddings=False),
    "qwen2": dict(rope_theta=1000000.0, tie_word_embeddings=True),
}
BATCH, SEQ = 2, 16


def main():
    for family, extra in FAMILIES.items():
        torch.manual_seed(0)
        config = AutoConfig.for_model(family, **COMMON, **extra)
        config._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Move norms and biases off their initial constants so that their gradients and the
        # engine's use of them are tested.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith(".bias"):
                    p.add_(0.1 * torch.randn_like(p))
        model.train()
        ids = torch.randint(0, COMMON["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
        labels = torch.randint(0, COMMON["vocab_size"], (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        out = os.path.join(ROOT, family)
        os.makedirs(out, exist_ok=True)
        config.save_pretrained(out)
        weights = {n: p.detach().contiguous() for n, p in model.named_parameters()}
        save_file(weights, os.path.join(out, "model.safetensors"))
        expected = {
            "input_ids": ids,
            "labels": labels,
            "logits": logits.detach().contiguous(),
            "loss": loss.detach().reshape(()),
        }
        for n, p in model.named_parameters():
            expected[f"grad.{n}"] = p.grad.contiguous()
        save_file(expected, os.path.join(out, "expected.safetensors"))
        print(family, "loss", loss.item(), "parameters", sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
