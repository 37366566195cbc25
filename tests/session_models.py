"""Tiny models for session tests, importable by spawned worker processes (`tests.session_models:mlp`)."""

from __future__ import annotations

import torch
from torch import nn


class Slowed(nn.Linear):
    """A Linear that also does `repeat` more times its own matmul: real extra work, the same output."""

    def __init__(self, fan_in: int, fan_out: int, repeat: int) -> None:
        super().__init__(fan_in, fan_out)
        self.repeat = repeat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        for _ in range(self.repeat):
            out = out + 0.0 * torch.nn.functional.linear(x, self.weight)
        return out


class Net(nn.Module):
    """Three Linear+ReLU blocks; `repeat` > 0 plants that much extra matmul work in `layers.1.0`."""

    def __init__(self, repeat: int = 0, width: int = 256) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(Slowed(width, width, repeat) if i == 1 else nn.Linear(width, width), nn.ReLU()) for i in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def mlp(repeat: int = 0, width: int = 256, batch: int = 128, seed: int = 0):
    """A `Net` and one batch (a `package.module:function` provider)."""
    torch.manual_seed(seed)
    return Net(repeat, width), (torch.randn(batch, width),)


class Greedy(nn.Module):
    """Cheap on its first call (the census), then asks for 1.5 GB on every later call (its measurement)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > 1:
            torch.empty(3 * 2**27, dtype=torch.float32)  # 1.5 GB, never touched: only the data segment grows
        return x * 2


def greedy():
    """A Linear and a `Greedy` (a provider for the worker memory-limit test)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), Greedy()), (torch.randn(4, 8),)


def killed():
    """A provider whose process is killed as the kernel's OOM killer would (SIGKILL) while it builds."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


BUILT_WITH_THREADS: list[int] = []  # the intra-op threads each `threads_seen` build ran with (this process)


def threads_seen(width: int = 32, batch: int = 8):
    """A small `Net` whose build notes the intra-op threads it ran with (the collection's build is capped while the
    start calibration runs beside it: device.start_calibration)."""
    BUILT_WITH_THREADS.append(torch.get_num_threads())
    torch.manual_seed(0)
    return Net(width=width), (torch.randn(batch, width),)
