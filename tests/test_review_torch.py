"""Review on real (tiny) torch models: moved modules matched by structure, and `collect --version auto`."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from cbsite.cli import main  # noqa: E402
from cbsite.collector import profile  # noqa: E402
from cbsite.diff.rundiff import diff_runs  # noqa: E402


class Block(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Wrap(nn.Module):
    """A new container around an existing layer (e.g. to add a norm later)."""

    def __init__(self, proj: nn.Module) -> None:
        super().__init__()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.proj = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.blocks(x))


class Head(nn.Module):
    """`blocks` renamed `layers` with a wider second block; `proj` wrapped in a new `out` container."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(Block(), Block(hidden=64))
        self.out = Wrap(nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.layers(x))


def test_renamed_and_wrapped_blocks_are_reported_as_moved_with_their_deltas(fast_config) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    config = dataclasses.replace(fast_config, phases=("forward",))  # moves are matched on the forward structure
    base = profile(Base(), x, model_name="net", version="v1", config=config)
    head = profile(Head(), x, model_name="net", version="v2", config=config)

    rd = diff_runs(base, head, match_moved=True)
    c = {d.path: d for d in rd.for_phase("forward")}
    moved = {p: d.base_path for p, d in c.items() if d.kind == "moved"}
    assert moved == {
        "layers": "blocks", "layers.0": "blocks.0", "layers.1": "blocks.1",
        "layers.0.fc1": "blocks.0.fc1", "layers.0.act": "blocks.0.act", "layers.0.fc2": "blocks.0.fc2",
        "layers.1.fc1": "blocks.1.fc1", "layers.1.act": "blocks.1.act", "layers.1.fc2": "blocks.1.fc2",
        "out.proj": "proj",
    }
    assert c["out"].kind == "added" and c["out"].self_delta["flops"] == 0  # the wrapper itself adds no FLOPs
    # The renamed block carries its change: hidden 32 -> 64 doubles both matmuls' FLOPs and parameters.
    for layer in ("layers.1.fc1", "layers.1.fc2"):
        assert c[layer].delta["flops"] == c[layer].base["flops"] > 0
        assert c[layer].delta["param_bytes"] > 0
    assert c["layers.0"].delta["flops"] == 0 and c["out.proj"].delta["flops"] == 0
    assert c["layers.1"].delta["flops"] == rd.totals["forward"]["flops"].delta  # all of the growth is there
    # Without matching, the same change is removals plus additions.
    plain = diff_runs(base, head, match_moved=False).counts()
    assert plain["moved"] == 0 and plain["removed"] == 10 and plain["added"] == 11


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout.strip()


@pytest.mark.slow
def test_collect_version_auto_names_the_commit_and_the_dirty_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "tinymodel.py").write_text(
        "import torch\n\ndef make():\n    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),)\n"
    )
    _git(repo, "init", "-q")
    _git(repo, "add", "tinymodel.py")
    _git(repo, "commit", "-q", "-m", "tiny")
    short = _git(repo, "rev-parse", "--short", "HEAD")
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(repo))
    monkeypatch.delitem(sys.modules, "tinymodel", raising=False)  # another test's tinymodel may be loaded
    runs = tmp_path / "runs"  # outside the repo; an untracked runs/ inside it would not make it dirty either
    argv = ["collect", "tinymodel:make", "--model", "tiny", "--version", "auto", "--runs", str(runs), "--budget", "0.005",
            "--phases", "forward", "--no-progress", "--peak-flops", "1e11", "--peak-bandwidth", "1e10", "--no-calibrate",
            "--no-step", "--max-component-s", "0.5", "--batches", "1"]

    assert main(argv) == 0
    (repo / "untracked.txt").write_text("not part of the model")  # untracked files do not count
    assert main(argv) == 0
    (repo / "tinymodel.py").write_text((repo / "tinymodel.py").read_text() + "# edited\n")
    assert main(argv) == 0
    capsys.readouterr()
    versions = sorted(p.name for p in (runs / "tiny").iterdir())
    assert versions == [short, f"{short}-dirty"]
    assert len(list((runs / "tiny" / short).iterdir())) == 2


def test_collect_version_auto_outside_a_git_tree_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # do not find a repository above tmp
    assert main(["collect", "nanogpt", "--version", "auto", "--runs", str(tmp_path / "runs")]) == 2
    assert "--version auto needs a git work tree" in capsys.readouterr().err
