"""Evaluation after every step in eval() mode but outside torch.no_grad(): its forward saves
tensors for a backward that never runs."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters())
    val_x = torch.randn(64, 32)
    for _ in range(steps):
        model.train()
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        val_out = model(val_x)  # MISTAKE: no torch.no_grad() around evaluation
        print("val", val_out.argmax(-1).float().mean().item())
