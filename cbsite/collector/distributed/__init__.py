"""Sharded models on torchrun: discovery of the sharded pieces, lockstep replay, one run from every rank.

Modules: `group` (the process group from torchrun's environment), `sharding` (the providers' sharding
plan option, DMP), `discovery` (sharded pieces as components; who communicates), `collectives` (c10d
ops and bytes from the dispatcher), `lockstep` (timing what communicates on all ranks at once),
`ranks` (per-rank rows, rank 0's merged run), `collect` (the driver on each rank).
"""

from __future__ import annotations

from typing import Sequence


def entrypoint(*argv: str) -> None:
    """`cbsite collect ARGV --distributed` for torch.distributed.elastic's launcher (`elastic_launch(config,
    entrypoint)(*argv)`); a non-zero exit raises SystemExit so the launcher records the rank as failed."""
    from cbsite.cli import main

    rc = main(["collect", *argv, *([] if "--distributed" in argv else ["--distributed"])])
    if rc:
        raise SystemExit(rc)


__all__: Sequence[str] = ("entrypoint",)
