"""Small modules several test files share."""

from __future__ import annotations

from torch import nn


class FailsWhenAlone(nn.Module):
    """A container whose own replay raises while its children run fine."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("only works once")
        return self.inner(x)
