"""Ranks given different sharding options are refused on every rank with one line naming the mismatch, before the
sharded model is built (they died of SIGSEGV inside torchrec, with nothing said). Two gloo processes on CPU."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

pytest.importorskip("torchrec")


def _rank(rank: int, port: int, out: str, per_rank: list) -> None:
    """One rank: join the group, shard a tiny DLRM with this rank's option, write what happened."""
    import torch.distributed as dist

    from cbsite.collector.distributed.sharding import shard
    from cbsite.collector.providers import provide
    from cbsite.errors import CbsiteError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = provide("dlrm", {"size": "tiny", "num_tables": 2}).model
        try:
            shard(model, per_rank[rank], [None, None])
            said = "built"
        except CbsiteError as exc:
            said = f"error: {exc}"
        Path(out, f"{rank}.json").write_text(json.dumps(said))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path, per_rank) -> list[str]:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(_free_port(), str(tmp_path), per_rank), nprocs=2, start_method="spawn", join=True)
    return [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_ranks_given_different_sharding_are_refused_on_every_rank_naming_it(tmp_path):
    said = _run(tmp_path, [["table_wise", "row_wise"], ["row_wise", "row_wise"]])
    for line in said:
        assert line.startswith("error: the ranks were given different sharding options"), said
        assert 'rank 0 ["table_wise", "row_wise"]' in line and 'rank 1 ["row_wise", "row_wise"]' in line, line
        assert "\n" not in line


@pytest.mark.slow
def test_ranks_given_the_same_sharding_build(tmp_path):
    assert _run(tmp_path, [["table_wise", "row_wise"]] * 2) == ["built", "built"]
