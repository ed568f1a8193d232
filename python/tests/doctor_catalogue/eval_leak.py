"""Every evaluation's predictions kept in a history list that is never cleared."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    val_x = torch.randn(256, 32)
    history = []
    for _ in range(steps):
        model.train()
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            history.append(model(val_x))  # MISTAKE: every evaluation's outputs kept
