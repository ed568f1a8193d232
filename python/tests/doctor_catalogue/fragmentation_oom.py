"""A fragmentation-bound out-of-memory: each step splits its work into six 6 MiB chunks and keeps
two of them (one in each half) as a cache for the next step; the 9 MiB buffer that follows fits
in no freed hole of the caching allocator's 20 MiB segments, though the bytes are free, while
expandable segments map the freed chunks into one contiguous range."""

import torch
from torch import nn

MIB = 1 << 20
ROWS = 1024  # float32 rows of 1024: 4 KiB each


def train(steps: int = 1) -> None:
    model = nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        chunks = [torch.randn(6 * MIB // (4 * ROWS), ROWS) for _ in range(6)]
        cache = [chunks[1], chunks[4]]
        del chunks
        buffer = torch.empty(9 * MIB // (4 * ROWS), ROWS)  # MISTAKE: fits in no freed hole
        loss = model(torch.randn(4, 16)).sum() + buffer.sum() + cache[0].sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
