#!/usr/bin/env python3
"""PyTorch peer of `headroom train --model DIR` for a Llama, for headroom/PyTorch ratios.

Builds `transformers.LlamaForCausalLM` from the Hugging Face `config.json` that headroom reads
(`--config DIR/config.json`) and trains it on the CPU on the same data and with the same
hyper-parameters as headroom, reusing `gpt_peer.py`'s data, training loop and report (same JSON
keys):

  model      LlamaForCausalLM from the config (fp32 master weights; vocab 256, the corpus read
             byte by byte as headroom reads it without a tokenizer.json); attention
             `attn_implementation="eager"` (materialised scores; headroom's --attention naive)
             or "sdpa" (scaled_dot_product_attention; headroom's --attention memory-efficient);
             --checkpoint block recomputes each decoder layer in backward (transformers'
             gradient checkpointing, non-reentrant; headroom's --checkpoint all)
  precision  fp32, or bf16-mixed: CPU autocast to bfloat16 around the forward, fp32 master
             weights, gradients and AdamW states
  loss       mean cross-entropy over all positions on fp32 logits (the logits cast to fp32
             before the loss, as transformers' own causal-LM loss does); the inputs and targets
             are already shifted by the sampler, so the model's built-in loss (which shifts
             again) is not used
  training   AdamW (lr 3e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on all parameters),
             global-norm clipping to 1.0, linear warm-up over 20 steps then cosine decay to a
             tenth at the last step: headroom's defaults for `--optimizer adamw`
  data       the corpus bytes, last 10% held out; windows of seq_len+1 bytes at stride seq_len in
             headroom's SplitMix64 Fisher-Yates order, so a given --seed visits the same windows
             in the same order as headroom

What is identical to headroom and what is not:
  identical  the architecture and its shape (both read the same config.json), the batches and
             their order, the loss definition, the optimizer, its hyper-parameters and schedule
  different  the initial weights: both draw normal(0, initializer_range) for the projections
             and embeddings and ones for the norm gains, but from different generators
             (torch.manual_seed here, headroom's seeded generator there), so the losses agree
             statistically, not bit for bit: at step 1 both are near ln(256) = 5.545 (logits
             near zero at init: every weight has std 0.02) and both fall with training. The
             kernels (matmul blocking, bf16 rounding points, softmax) also differ, so even the
             same weights would give losses that agree to rounding only.

Reported as gpt_peer.py reports (same JSON keys): tokens/s after 5 warm-up steps, final
training loss, validation loss, peak RSS growth (VmHWM from just before the model is built, so
importing torch and transformers is not counted), saved tensors, model state.

Needs torch and transformers (installs nothing). Example:
  python benches/pytorch/llama_peer.py --config /tmp/llama/config.json --seq-len 256 \\
      --micro-batch 8 --steps 20 --precision bf16-mixed --json peer.json
"""
import argparse
import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from gpt_peer import run_arguments, train_and_report

ATTENTION = {"naive": "eager", "sdpa": "sdpa"}


class CausalLm(nn.Module):
    """A `LlamaForCausalLM` whose forward(inputs, targets) is the mean cross-entropy over all
    positions, computed on fp32 logits."""

    def __init__(self, config_path, attention, checkpoint):
        super().__init__()
        config = LlamaConfig.from_json_file(str(config_path))
        # The weights in fp32 whatever the file's torch_dtype says: they are the master copy.
        self.lm = LlamaForCausalLM._from_config(config, attn_implementation=ATTENTION[attention],
                                                dtype=torch.float32)
        if checkpoint == "block":
            self.lm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lm.train()

    def forward(self, inputs, targets):
        logits = self.lm(input_ids=inputs, use_cache=False).logits
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, required=True,
                    help="the Hugging Face config.json (the file `headroom train --model DIR` "
                         "reads as DIR/config.json)")
    run_arguments(ap)
    ap.add_argument("--seq-len", type=int, default=256)
    args = ap.parse_args()
    cfg = json.loads(args.config.read_text())
    if cfg.get("model_type") != "llama":
        ap.error(f"{args.config}: model_type {cfg.get('model_type')!r}; this peer builds llama")
    if cfg.get("vocab_size") != 256:
        ap.error(f"{args.config}: vocab_size {cfg.get('vocab_size')}; the peer reads the corpus "
                 "byte by byte, so the config needs vocab_size 256")
    if args.seq_len > cfg.get("max_position_embeddings", 2048):
        ap.error(f"--seq-len {args.seq_len} exceeds max_position_embeddings "
                 f"{cfg['max_position_embeddings']} in {args.config}")
    name = (f"llama {cfg['num_hidden_layers']}x{cfg['hidden_size']}, {cfg['num_attention_heads']}"
            f"/{cfg.get('num_key_value_heads', cfg['num_attention_heads'])} heads, ffn "
            f"{cfg['intermediate_size']}")
    train_and_report(args, lambda: CausalLm(args.config, args.attention, args.checkpoint), name)


if __name__ == "__main__":
    main()
