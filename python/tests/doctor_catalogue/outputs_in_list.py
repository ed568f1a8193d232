"""The logits of every step kept in a list (for a metric at the epoch's end)."""

import torch
from torch import nn
from torch.nn import functional as F


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 128), nn.GELU())
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.body(x))


def train(steps: int = 5) -> None:
    model = Classifier()
    opt = torch.optim.AdamW(model.parameters())
    all_logits = []
    for _ in range(steps):
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        all_logits.append(logits)  # MISTAKE: keeps each step's output (and graph)
        loss.backward()
        opt.step()
        opt.zero_grad()
