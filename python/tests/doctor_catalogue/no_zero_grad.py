"""No zero_grad anywhere: every backward adds into the gradients of all the steps before."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = F.cross_entropy(model(x), y)
        loss.backward()  # MISTAKE: no opt.zero_grad() in this loop
        opt.step()
