"""Models whose work is not the same on every call, importable by spawned workers (`tests.varying_models:looped`)."""

from __future__ import annotations

import torch
from torch import nn


class RandomLoop(nn.Module):
    """Calls its Linear 1 to 49 times per forward, drawn at random each call (as stochastic depth or LayerDrop draw)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(int(torch.randint(1, 50, ()))):
            x = torch.relu(self.lin(x))
        return x


class Looped(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.pre = nn.Linear(width, width)
        self.loop = RandomLoop(width)
        self.post = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.loop(self.pre(x)))


def looped(width: int = 64, batch: int = 16, seed: int = 0):
    """A `Looped` and one batch (a `package.module:function` provider)."""
    torch.manual_seed(seed)
    return Looped(width), (torch.randn(batch, width),)


class Summer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, xs) -> torch.Tensor:
        out = 0
        for x in xs:
            out = out + self.lin(x)
        return out


class PassesAnIterator(nn.Module):
    """Hands its submodule an iterator: the model's call uses it up, so a replay of that submodule would see nothing."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.pre = nn.Linear(width, width)
        self.summer = Summer(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.summer(iter([self.pre(x), x * 2]))
