"""A loop that keeps each step's output in a variable, as the Transformers docs' benchmark loop
does with a model that returns its key/value cache: the previous step's output (its logits and
its cache) is released only when the next forward has returned, so it sits through that
forward's end, the peak."""

import torch
from torch import nn


class WithCache(nn.Module):
    """A model that returns, beside its logits, a state it computed (as a decoder returns its
    key/value cache): 1,024 × 16,384 fp32, 64 MiB, needed by no backward."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h = self.body(x)
        cache = h.detach().repeat(1, 256)
        return self.head(h), cache


def train(steps: int = 5) -> None:
    model = WithCache()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1024, 32)
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)  # MISTAKE: the previous step's `out` lives until this line returns
        out[0].sum().backward()
        opt.step()
