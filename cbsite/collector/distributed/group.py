"""The process group of a distributed collection, from the environment torchrun sets.

torchrun (torch.distributed.elastic) starts one process per rank with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set; Slurm, TorchX and Ray Train launch through the same agent. cbsite
never starts ranks itself. The backend follows the device: gloo on CPU, nccl on CUDA (one device per
local rank). Every collective has a timeout, so a rank that stops answering ends the job instead of
hanging it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from cbsite.errors import CbsiteError

DEFAULT_TIMEOUT_S = 300.0
_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Group:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str
    timeout_s: float

    def record(self) -> dict[str, object]:
        """What run.json's `distributed` says of the group."""
        return {"world_size": self.world_size, "backend": self.backend, "timeout_s": self.timeout_s,
                "launcher": "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "torch.distributed environment"}


def init(device: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Group:
    """Join the process group torchrun described in the environment (or the one already initialised)."""
    import torch.distributed as dist

    if timeout_s <= 0:
        raise CbsiteError(f"--dist-timeout must be a number of seconds above 0, got {timeout_s}")
    if not dist.is_initialized():
        missing = [k for k in _ENV if k not in os.environ]
        if missing:
            raise CbsiteError(
                f"--distributed needs the environment torchrun sets ({', '.join(missing)} missing): launch with "
                "`torchrun --nproc-per-node N -m cbsite collect ... --distributed` (examples/ has multi-node and Slurm recipes)"
            )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CbsiteError("--device cuda with --distributed, but torch sees no CUDA device; use --device cpu (gloo)")
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device, backend = f"cuda:{torch.cuda.current_device()}", "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return Group(dist.get_rank(), dist.get_world_size(), local_rank, dist.get_backend(), device, timeout_s)


def close() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
