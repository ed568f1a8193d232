#!/usr/bin/env python3
"""PyTorch peer of `headroom train` (default `gpt-small`), for headroom/PyTorch ratios.

Trains, on the CPU, the model `headroom train` trains by default, on the same data and with
the same hyper-parameters, and prints throughput and memory figures:

  model      byte-level GPT (vocab 256), context 128, width 128, 4 pre-norm blocks of
             4 heads x 32, MLP 128->512->128 with tanh-GELU, final LayerNorm, output head
             tied to the token embedding, dropout 0, init normal(0, 0.02) / zero biases;
             attention is naive (materialised scores) unless --attention sdpa
  training   cross-entropy over all positions, AdamW (lr 3e-3, betas 0.9/0.999, eps 1e-8,
             weight decay 0.01 on all parameters), global-norm clipping to 1.0, linear warm-up
             over 20 steps then cosine decay to a tenth of the rate at the last step (headroom's
             schedule), micro-batch 16, accumulation 1, 200 steps
  data       the corpus bytes, last 10% held out; windows of seq_len+1 bytes at stride seq_len,
             shuffled per epoch with headroom's SplitMix64 Fisher-Yates, so a given --seed
             visits the same windows in the same order as headroom

Reported: parameter count; tokens/s and mean step time over the steps after 5 warm-up steps;
final training loss; validation loss (4 batches of 16 from the held-out tail); memory:
  peak_rss_growth   VmHWM after training minus VmHWM before the model was built
  saved_for_backward  bytes of the unique storages saved for backward in one forward
                    (torch.autograd.graph.saved_tensors_hooks), split into activations
                    (comparable to headroom's `activation` category) and parameter storages
  model_state       parameter + gradient + AdamW state bytes

Needs only torch (no other package; installs nothing). Example:
  python benches/pytorch/gpt_peer.py --steps 200 --json peer.json
"""
import argparse
import contextlib
import json
import math
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as ckpt

DEFAULT_DATA = Path(__file__).resolve().parent / "../../crates/train/data/paradise_lost.txt"
MASK64 = (1 << 64) - 1


class SplitMix64:
    """headroom's deterministic generator (crates/memory synthetic.rs)."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def range(self, lo, hi):
        return lo + self.next_u64() % max(hi - lo, 1)


class Sampler:
    """Training windows shuffled per epoch, and a fixed validation tail, as headroom's."""

    def __init__(self, data, seq_len, seed, val_fraction=0.1):
        self.tokens = torch.tensor(list(data), dtype=torch.long)
        self.train_len = len(data) - int(len(data) * val_fraction)
        self.seq_len, self.seed, self.epoch, self.cursor = seq_len, seed, 0, 0
        self._shuffle()

    def _shuffle(self):
        n = (self.train_len - 1) // self.seq_len
        self.order = list(range(n))
        rng = SplitMix64(self.seed ^ ((self.epoch * 0x9E3779B97F4A7C15) & MASK64))
        for i in range(n - 1, 0, -1):
            j = rng.range(0, i + 1)
            self.order[i], self.order[j] = self.order[j], self.order[i]

    def _batch(self, starts):
        w = torch.stack([self.tokens[s:s + self.seq_len + 1] for s in starts])
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def next_train(self, batch):
        starts = []
        for _ in range(batch):
            if self.cursor >= len(self.order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._shuffle()
            starts.append(self.order[self.cursor] * self.seq_len)
            self.cursor += 1
        return self._batch(starts)

    def validation(self, batch, max_batches):
        starts = list(range(self.train_len, len(self.tokens) - self.seq_len, self.seq_len))
        chunks = [starts[i:i + batch] for i in range(0, len(starts), batch)]
        return [self._batch(c) for c in chunks if len(c) == batch][:max_batches]


class Block(nn.Module):
    def __init__(self, width, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(width, eps=1e-5), nn.LayerNorm(width, eps=1e-5)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def attend(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=256, seq_len=128, width=128, layers=4, heads=4, attention="naive",
                 checkpoint="none"):
        super().__init__()
        self.checkpoint = checkpoint
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, eps=1e-5)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            # --checkpoint block: each block's activations recomputed in backward (headroom's
            # --checkpoint all), non-reentrant as PyTorch recommends.
            if self.checkpoint == "block" and torch.is_grad_enabled():
                x = ckpt.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = F.linear(self.ln_f(x), self.tok.weight)  # head tied to the token embedding
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def vm_hwm():
    """Peak resident set size of this process in bytes (Linux), or 0 if unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class SavedTensors:
    """Records the unique storages autograd saves for backward while active."""

    def __init__(self):
        self.storages = {}

    def pack(self, t):
        s = t.untyped_storage()
        self.storages[s.data_ptr()] = s.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def bytes(self, params):
        """(total, of which parameter storages) in bytes."""
        ptrs = {p.untyped_storage().data_ptr() for p in params}
        return (sum(self.storages.values()),
                sum(n for ptr, n in self.storages.items() if ptr in ptrs))


def learning_rate(base, step, warmup, total):
    """headroom's schedule (crates/train trainer/schedule.rs): linear warm-up to `base` over
    `warmup` steps, then cosine decay to a tenth of it at the last step (step 0-based)."""
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    low = base * 0.1
    progress = min((step - min(warmup, step)) / max(total - warmup, 1), 1.0)
    return low + (base - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def run_arguments(ap):
    """The flags every peer shares: data, batch, precision, optimizer and output."""
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32")
    ap.add_argument("--attention", choices=["naive", "sdpa"], default="naive")
    ap.add_argument("--checkpoint", choices=["none", "block"], default="none")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", type=Path, help="also write the results to this file")


def train_and_report(args, build, model_name):
    """Trains `build()` (a module whose forward(inputs, targets) returns the mean loss) as
    headroom trains (see the module docstring), prints the figures and writes --json."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sampler = Sampler(args.data.read_bytes(), args.seq_len, args.seed)
    bf16 = args.precision == "bf16-mixed"

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    rss_before = vm_hwm()
    model = build()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    n_params = sum(p.numel() for p in params)

    saved = SavedTensors()
    times, losses = [], []
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = learning_rate(args.lr, step, args.warmup, args.steps)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for micro in range(args.accumulation):
            inputs, targets = sampler.next_train(args.micro_batch)
            # The first micro-batch's forward (a warm-up step) also records saved tensors.
            record = saved.hooks() if step == 0 and micro == 0 else contextlib.nullcontext()
            with autocast(), record:
                loss = model(inputs, targets) / args.accumulation
            loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss_sum)
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss_sum:.4f}  {times[-1] * 1e3:7.1f} ms", flush=True)
    loss_value = losses[-1] if losses else float("nan")
    rss_after = vm_hwm()
    saved_total, saved_params = saved.bytes(params)

    model.eval()
    with torch.no_grad(), autocast():
        vals = [model(x, y).item() for x, y in sampler.validation(args.micro_batch, 4)]
    val_loss = sum(vals) / len(vals) if vals else float("nan")

    warm = 5 if len(times) > 5 else 0
    timed = times[warm:]
    tokens_per_step = args.micro_batch * args.accumulation * args.seq_len
    state = sum(t.nbytes for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    param_bytes = sum(p.nbytes for p in params)
    grad_bytes = sum(p.grad.nbytes for p in params if p.grad is not None)
    results = {
        "framework": f"pytorch {torch.__version__}",
        "model": model_name,
        "precision": args.precision,
        "attention": args.attention,
        "checkpoint": args.checkpoint,
        "threads": args.threads,
        "micro_batch": args.micro_batch,
        "accumulation": args.accumulation,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "parameters": n_params,
        "tokens_per_s": tokens_per_step * len(timed) / sum(timed) if timed else None,
        "mean_step_ms": 1e3 * sum(timed) / len(timed) if timed else None,
        "warmup_steps_excluded": warm,
        "final_train_loss": loss_value,
        "train_losses": losses,
        "val_loss": val_loss,
        "peak_rss_growth_bytes": rss_after - rss_before,
        "saved_for_backward_bytes": saved_total,
        "saved_activation_bytes": saved_total - saved_params,
        "saved_parameter_bytes": saved_params,
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_state_bytes": state,
        "model_state_bytes": param_bytes + grad_bytes + state,
    }

    mib = lambda b: f"{b / 2**20:10.2f} MiB"  # noqa: E731
    rows = [
        ("parameters", f"{n_params:,}"),
        ("tokens/s", f"{results['tokens_per_s']:,.0f}" if timed else "n/a"),
        ("mean step", f"{results['mean_step_ms']:.1f} ms" if timed else "n/a"),
        ("final train loss", f"{loss_value:.4f}"),
        ("validation loss", f"{val_loss:.4f}"),
        ("peak RSS growth", mib(rss_after - rss_before)),
        ("saved for backward", mib(saved_total)),
        ("  activations", mib(saved_total - saved_params)),
        ("  parameter storages", mib(saved_params)),
        ("params+grads+AdamW", mib(results["model_state_bytes"])),
    ]
    print(f"\n{results['framework']}, {model_name}, {args.precision}, {args.attention} attention, "
          f"{args.threads} threads, batch {args.micro_batch}x{args.accumulation}x{args.seq_len}")
    for name, value in rows:
        print(f"  {name:<22}{value:>16}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    run_arguments(ap)
    ap.add_argument("--seq-len", type=int, default=128)
    # The shape (headroom's --layers/--width/--heads): gpt-small's by default; the issue's
    # larger comparison is --layers 6 --width 384 --heads 6 --seq-len 256.
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    args = ap.parse_args()
    if args.width % args.heads:
        ap.error(f"--width {args.width} is not a multiple of --heads {args.heads}")
    name = ("gpt-small" if (args.layers, args.width, args.heads) == (4, 128, 4)
            else f"gpt {args.layers}x{args.width}, {args.heads} heads")
    train_and_report(args, lambda: GPT(seq_len=args.seq_len, width=args.width,
                                       layers=args.layers, heads=args.heads,
                                       attention=args.attention, checkpoint=args.checkpoint),
                     name)


if __name__ == "__main__":
    main()
