"""A correct loop that clears gradients first and in place (set_to_none=False: they stay
allocated between steps, zeroed), through the module's zero_grad."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        model.zero_grad(set_to_none=False)
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        F.cross_entropy(model(x), y).backward()
        opt.step()
