"""compile and numerics plugins on tiny modules (torch.compile on CPU is slow: few, small tests)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn


def rows_of(run, phase):
    return {r["path"]: r for r in run.table(phase).to_dicts()}


class Branchy(nn.Module):
    """A data-dependent Python branch: Dynamo cannot trace through it and breaks the graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y - 1


@pytest.mark.slow
def test_compile_reports_speedup_and_graph_breaks(fast_config):
    from cbsite.collector import profile

    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    model = nn.Sequential(mlp, Branchy())
    cfg = dataclasses.replace(fast_config, phases=("forward",), plugins=("compile",),
                              plugin_options={"compile": {"max_depth": 1}})
    run = profile(model, torch.randn(4, 8), config=cfg)
    fwd = rows_of(run, "forward")
    plain, branchy = fwd["0"], fwd["1"]
    assert plain["graph_breaks"] == 0 and plain["graph_break_reasons"] == []
    assert plain["compiled_latency_ms"] > 0 and plain["compile_time_s"] > 0
    assert plain["compile_speedup"] == plain["latency_ms"] / plain["compiled_latency_ms"]  # reported, not judged
    assert branchy["graph_breaks"] >= 1 and branchy["graph_break_reasons"]
    assert branchy["compile_speedup"] is not None and branchy["plugin_errors"] is None
    assert fwd["0.0"]["compiled_latency_ms"] is None  # deeper than max_depth: not compiled
    assert run.meta["config"]["plugins"]["compile"]["status"] == "compiled components: depth <= 1, cold inductor cache"


def _cache_files(folder):
    return [f for f in folder.rglob("*") if f.is_file()] if folder.exists() else []


@pytest.mark.slow
def test_cold_compiles_leave_the_users_inductor_cache_alone_and_warm_ones_use_it(fast_config, tmp_path, monkeypatch):
    from cbsite.collector import profile

    users_cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(users_cache))
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
    cold = dataclasses.replace(fast_config, phases=("forward",), plugins=("compile",),
                               plugin_options={"compile": {"max_depth": 0}})
    row = rows_of(profile(model, torch.randn(4, 8), config=cold), "forward")[""]
    assert row["compiled_latency_ms"] > 0 and _cache_files(users_cache) == []  # compiled in a fresh, deleted cache
    warm = dataclasses.replace(cold, plugin_options={"compile": {"max_depth": 0, "cache": "warm"}})
    row = rows_of(profile(model, torch.randn(4, 8), config=warm), "forward")[""]
    assert row["compiled_latency_ms"] > 0 and _cache_files(users_cache)  # the user's cache filled


class NaiveLog1p(nn.Module):
    """log(1 + x): for small x, 1 + x rounds to 1 in bfloat16 (8 bits of mantissa) and the result is lost."""

    def forward(self, x):
        return torch.log(1 + x)


class StableLog1p(nn.Module):
    def forward(self, x):
        return torch.log1p(x)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.naive = NaiveLog1p()
        self.stable = StableLog1p()

    def forward(self, x):
        y = self.proj(x)
        return self.naive(y) + self.stable(y)


def test_numerics_flags_the_planted_component(fast_config):
    from cbsite.collector import profile

    torch.manual_seed(0)
    model = Small()
    with torch.no_grad():
        model.proj.weight.mul_(1e-2)
        model.proj.bias.mul_(1e-2)
    cfg = dataclasses.replace(fast_config, phases=("forward",), plugins=("numerics",))
    fwd = rows_of(profile(model, 1e-2 * torch.randn(8, 16), config=cfg), "forward")
    assert fwd["proj"]["numerics_ok"] is True and fwd["stable"]["numerics_ok"] is True
    assert fwd["naive"]["numerics_ok"] is False and fwd["naive"]["numerics_max_rel_err"] > 0.1
    assert fwd[""]["numerics_ok"] is False  # the root contains the planted component
    assert fwd["stable"]["numerics_max_rel_err"] < 1.6e-2
    assert fwd["naive"]["numerics_reference"].startswith("eager float32 on cpu vs bfloat16 (rtol 0.016")


class UpcastsOnPurpose(nn.Module):
    """Like torchrec's embedding bags: returns float32 whatever its own dtype."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.proj(x).float())


def test_numerics_autocast_mode_handles_a_model_that_mixes_dtypes(fast_config):
    from cbsite.collector import profile

    torch.manual_seed(0)
    x = torch.randn(8, 16)
    cast = dataclasses.replace(fast_config, phases=("forward",), plugins=("numerics",))
    root = rows_of(profile(UpcastsOnPurpose(), x, config=cast), "forward")[""]
    assert root["numerics_ok"] is None and "numerics.mode=autocast" in root["plugin_errors"][0]
    auto = dataclasses.replace(cast, plugin_options={"numerics": {"mode": "autocast"}})
    fwd = rows_of(profile(UpcastsOnPurpose(), x, config=auto), "forward")
    assert fwd[""]["numerics_ok"] is True and 0 < fwd[""]["numerics_max_rel_err"] < 1.6e-2  # bf16 matmuls really ran
    assert fwd[""]["numerics_reference"].startswith("eager float32 on cpu vs bfloat16 autocast (rtol 0.016")


def test_the_speedup_follows_the_latency_when_rounds_pool_it_again():
    """Rounds and the hierarchy re-measurement pool a row's latency again and re-derive its ratios: the speedup
    (eager / compiled) is one of them, never left at the first latency's ratio."""
    from cbsite import tree

    row = {"latency_ms": 0.2, "compiled_latency_ms": 0.1, "compile_speedup": 2.0, "flops": 100, "bytes_moved": 10}
    row["latency_ms"] = 0.3
    tree.derive_ratios(row, None, None)
    assert row["compile_speedup"] == 0.3 / 0.1
    plain = {"latency_ms": 0.3, "flops": 100, "bytes_moved": 10}
    tree.derive_ratios(plain, None, None)
    assert "compile_speedup" not in plain  # no compiled timing: no column invented
