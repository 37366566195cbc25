"""`module:function` providers for tests/test_distributed.py, launched by torchrun in the ranks' processes.

`killed_dlrm` is a sharded DLRM whose dense arch ends in `Killer`, a module that SIGKILLs its own process
on rank `kill_rank` when it is called the `kill_at`-th time: the capture forwards call it a few times,
the per-rank measurement many more, so the rank dies in the middle of measuring, as a rank lost to the
OOM killer or a node failure would.
"""

from __future__ import annotations

import os
import signal

import torch
from torch import nn

from cbsite.collector.distributed.sharding import shard
from cbsite.collector.providers import provide


class Killer(nn.Module):
    def __init__(self, kill_rank: int, kill_at: int) -> None:
        super().__init__()
        self.kill_rank, self.kill_at, self.calls = kill_rank, kill_at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        self.calls += 1
        if dist.get_rank() == self.kill_rank and self.calls >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return x


def killed_dlrm(kill_rank: int = 1, kill_at: int = 40):
    """A tiny DLRM, tables table-wise and row-wise, with a Killer after its dense arch: (DMP, dense, sparse)."""
    import torch.distributed as dist

    provided = provide("dlrm", {"size": "tiny", "num_tables": 2}, batches=1, seed=dist.get_rank())
    model = provided.model
    model.dense_arch = nn.Sequential(model.dense_arch, Killer(kill_rank, kill_at))
    dmp, _ = shard(model, ["table_wise", "row_wise"], [None, None])
    return dmp, provided.inputs[0].args


def plain_dlrm():
    """A tiny DLRM as a user's function returns it, unsharded: --distributed shards it with torchrec's planner."""
    provided = provide("dlrm", {"size": "tiny", "num_tables": 2}, batches=1, seed=0)
    return provided.model, provided.inputs[0].args
