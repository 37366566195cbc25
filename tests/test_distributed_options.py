"""The options that decide a sharded run's plan: ranks given different sharding options are refused on every rank with
one line naming the mismatch, before the sharded model is built (they died of SIGSEGV inside torchrec, with nothing
said); `--distributed` without `-o sharding` uses torchrec's planner and says what it chose; the providers that need
torchrec say how to install it. Two gloo processes on CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchrec")

REPO = Path(__file__).resolve().parents[1]


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


def test_distributed_built_ins_default_to_the_planner_and_keep_a_given_plan():
    from cbsite.collector.distributed.sharding import PLANNER, with_default_plan

    for provider in ("dlrm", "deepfm", "dlrm-synthetic"):
        assert with_default_plan(provider, {"size": "tiny"}) == {"size": "tiny", "sharding": PLANNER}
        assert with_default_plan(provider, {"sharding": "row_wise"}) == {"sharding": "row_wise"}
    # Tables placed by hand are not torchrec's to shard; a user's function takes only its own options.
    assert with_default_plan("dlrm-synthetic", {"placement": "host"}) == {"placement": "host"}
    assert with_default_plan("mypkg.models:build", {"width": 8}) == {"width": 8}


def _hidden(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`cbsite ARGS` in a fresh process where `module` cannot be imported, as if it were not installed."""
    code = ("import sys\n"
            "class Hide:\n"
            "    def find_spec(self, name, path, target=None):\n"
            f"        if name.split('.')[0] == {module!r}:\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "from cbsite.cli import main\n"
            "raise SystemExit(main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("provider", ["dlrm", "deepfm", "dlrm-synthetic"])
def test_a_torchrec_provider_without_torchrec_is_one_line_with_its_install_hint(provider, tmp_path):
    from cbsite.cli import MISSING_DEPENDENCY

    done = _hidden("torchrec", "collect", provider, "-o", "size=tiny", "--runs", str(tmp_path / "runs"), cwd=tmp_path)
    assert done.returncode == MISSING_DEPENDENCY, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "needs torchrec" in done.stderr and "pip install 'cbsite[" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()  # refused before any work


@pytest.mark.slow
def test_distributed_without_a_plan_uses_torchrecs_planner_and_says_which(tmp_path):
    from cbsite import archive
    from cbsite.collector.distributed.sharding import plan_summary
    from tests.test_distributed import torchrun

    done = torchrun(["dlrm", "-o", "size=tiny", "-o", "num_tables=3", "--model", "planned", "--version", "v0"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (ref,) = archive.list_runs(tmp_path)
    meta = archive.read_run(ref.path).meta
    assert meta["provider"]["options"]["sharding"] == "planner"
    plan = meta["distributed"]["sharding_plan"]
    tables = [t for module in plan.values() for t in module.values()]
    assert len(tables) == 3 and all(t["ranks"] and set(t["ranks"]) <= {0, 1} for t in tables), plan
    said = [line for line in done.stderr.splitlines() if "torchrec's planner chose" in line]
    assert said == [f"cbsite: torchrec's planner chose, for 2 ranks: {plan_summary(plan)}"], done.stderr[-3000:]


@pytest.mark.slow
def test_a_users_unsharded_torchrec_model_is_sharded_by_the_planner(tmp_path):
    """A `module:function` that returns the plain model (tables in an EmbeddingBagCollection) is sharded as the
    built-ins are without a plan, and its plan is recorded where theirs is."""
    from cbsite import archive
    from tests.test_distributed import torchrun

    done = torchrun(["distributed_models:plain_dlrm", "--model", "users", "--version", "v0"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (ref,) = archive.list_runs(tmp_path)
    meta = archive.read_run(ref.path).meta
    plan = meta["provider"]["details"]["sharding"]
    assert plan == meta["distributed"]["sharding_plan"] and len(next(iter(plan.values()))) == 2, plan
    assert sum("torchrec's planner chose, for 2 ranks:" in line for line in done.stderr.splitlines()) == 1
