"""A running error summed as a tensor: each step's sum keeps that step's graph and the tensors
it saved (PyTorch FAQ: "don't accumulate history across your training loop")."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 8))
    opt = torch.optim.AdamW(model.parameters())
    total_error = 0.0
    for _ in range(steps):
        x, y = torch.randn(16, 32), torch.randn(16, 8)
        out = model(x)
        loss = F.mse_loss(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total_error += (out - y).abs().mean()  # MISTAKE: a tensor sum, not .item()
