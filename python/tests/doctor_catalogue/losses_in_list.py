"""Each step's loss appended to a list as a tensor."""

import torch
from torch import nn
from torch.nn import functional as F


def train(steps: int = 5) -> None:
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        loss = F.cross_entropy(model(x), y)
        losses.append(loss)  # MISTAKE: the tensor, not loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad()
