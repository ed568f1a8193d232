"""A correct recurrent loop: the state is detached before it goes to the next step."""

import torch
from torch import nn


def train(steps: int = 5) -> None:
    cell = nn.RNNCell(32, 64)
    head = nn.Linear(64, 1)
    opt = torch.optim.SGD([*cell.parameters(), *head.parameters()], lr=0.01)
    h = torch.zeros(8, 64)
    for _ in range(steps):
        x, y = torch.randn(8, 32), torch.randn(8, 1)
        h = cell(x, h.detach())
        loss = (head(h) - y).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
