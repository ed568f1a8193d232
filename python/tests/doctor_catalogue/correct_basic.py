"""A correct loop: the loss logged as a number, gradients cleared every step."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    total_loss = 0.0
    losses = []
    for _ in range(steps):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total_loss += loss.item()
        losses.append(loss.item())
