"""A correct loop with gradient accumulation (two micro-batches per optimizer step) and an
evaluation under torch.no_grad() after every step, its metric kept as a number."""

import torch
from torch import nn
from torch.nn import functional as F


def evaluate(model, val_x, val_y):
    model.eval()
    with torch.no_grad():
        logits = model(val_x)
        accuracy = (logits.argmax(-1) == val_y).float().mean().item()
    model.train()
    return accuracy


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    val_x, val_y = torch.randn(64, 32), torch.randint(0, 10, (64,))
    scores = []
    for _ in range(steps):
        for _ in range(2):
            x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
            (F.cross_entropy(model(x), y) / 2).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        scores.append(evaluate(model, val_x, val_y))
