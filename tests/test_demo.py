"""`cbsite demo`: the quick first look (default) and the full demo (--full), planned without collecting anything:
compare, collect and the study sweep are replaced by recorders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import cbsite.collector.collect as collect_module
import cbsite.collector.executors as executors
import cbsite.collector.session.compare as compare_module
from cbsite.cli import main
from cbsite.cli.demo import DEMO, DEMO_PLUGINS, DEMO_QUICK_COMPARE, DEMO_QUICK_PLUGINS
from cbsite.collector.device import cpu_name


def _demo_run(demo_runs: Path, runs: Path, model: str, version: str, **changes) -> Path:
    """A demo run's run.json (from the tests' archive), as if collected on this machine with this torch."""
    source = next((demo_runs / model / version).iterdir())
    meta = json.loads((source / "run.json").read_text())
    meta["device"]["name"] = cpu_name()
    meta["versions"]["torch"] = torch.__version__
    for key, value in changes.items():
        meta["config"][key] = value
    folder = runs / model / version / source.name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(meta))
    shutil.copy(source / "components.parquet", folder / "components.parquet")
    return folder


@pytest.fixture
def recorded(monkeypatch):
    seen = {"compare": [], "collect": [], "sweep": 0}

    def compare(base, head, cfg, **_):
        seen["compare"].append((base, head, cfg))
        side = SimpleNamespace(path=Path("x"))
        return SimpleNamespace(base=side, head=side, record={"summary": {"verdicts": {"regressed": 1}}, "wall_s": 1.0},
                               save=lambda root: Path(root) / "_comparisons" / "c")

    def collect(request):
        seen["collect"].append(request)
        return SimpleNamespace(save=lambda root: Path(root) / request.model_name,
                               meta={"wall_time_s": 1.0, "counts": {}})

    def run_sweep(*_a, **_k):
        seen["sweep"] += 1
        return {"points": []}

    monkeypatch.setattr(compare_module, "compare", compare)
    monkeypatch.setattr(collect_module, "collect", collect)
    monkeypatch.setattr(executors, "run_sweep", run_sweep)
    return seen


def test_quick_demo_compares_the_dlrm_pair_and_keeps_unchanged_runs(demo_runs, tmp_path, monkeypatch, recorded):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    for _, name, version, _ in DEMO[2:]:
        _demo_run(demo_runs, runs, name, version)
    assert main(["demo", "--runs", str(runs), "--collect-only", "--no-progress"]) == 0
    (base, head, cfg), = recorded["compare"]
    assert (base.version, head.version) == ("v1", "v2")
    assert (cfg.processes, cfg.pairs) == (DEMO_QUICK_COMPARE["processes"], DEMO_QUICK_COMPARE["pairs"])
    assert base.config.plugins == DEMO_QUICK_PLUGINS and "compile" not in base.config.plugin_options
    assert recorded["collect"] == []  # deepfm and nanogpt: the archive holds them, collected the same way
    assert recorded["sweep"] == 1


def test_quick_demo_collects_what_the_archive_lacks_or_holds_collected_otherwise(demo_runs, tmp_path, monkeypatch, recorded):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    _demo_run(demo_runs, runs, "deepfm", "v1", min_run_time=0.05)  # another budget: not the same collection
    assert main(["demo", "--runs", str(runs), "--collect-only", "--no-progress"]) == 0
    assert [r.model_name for r in recorded["collect"]] == ["deepfm", "nanogpt"]
    assert all(r.config.plugins == DEMO_QUICK_PLUGINS for r in recorded["collect"])


def test_full_demo_recollects_every_model_with_compile(demo_runs, tmp_path, monkeypatch, recorded):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    for _, name, version, _ in DEMO[2:]:
        _demo_run(demo_runs, runs, name, version)
    assert main(["demo", "--full", "--runs", str(runs), "--collect-only", "--no-progress"]) == 0
    (base, _, cfg), = recorded["compare"]
    assert (cfg.processes, cfg.pairs) == (compare_module.CompareConfig().processes, compare_module.CompareConfig().pairs)
    assert [r.model_name for r in recorded["collect"]] == ["deepfm", "nanogpt"]
    for config in [base.config] + [r.config for r in recorded["collect"]]:
        assert config.plugins == DEMO_PLUGINS and config.plugin_options["compile"] == {"max_depth": 2}
