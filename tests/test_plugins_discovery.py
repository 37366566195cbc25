"""A third-party plugin package, built and pip-installed in the test, is found, runs, and lands in the run."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

PACKAGE = "cbsite-testplugin-xyz"

MODULE = '''
from cbsite.collector.plugins import Option, PluginResult, Profiler


class ParamNorm(Profiler):
    name = "param-norm"
    description = "L2 norm of the component's parameters (a third-party example)"
    options = {"scale": Option(1.0)}

    def profile(self, ctx):
        if ctx.phase != "forward":
            return None
        norm = sum(float(p.detach().pow(2).sum()) for p in ctx.module.parameters()) ** 0.5
        return PluginResult(metrics={"l2": norm * self.opts["scale"]})


class CountRows:
    name = "count-rows"
    description = "writes the number of rows into run.json"
    options = {}

    def __init__(self, options):
        self.options_given = options

    def report(self, run):
        run.meta["count_rows"] = run.rows.height
'''


@pytest.fixture
def installed_plugin(tmp_path):
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "cbsite_testplugin_xyz.py").write_text(MODULE)
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{PACKAGE}"
        version = "0.1"

        [project.entry-points."cbsite.profilers"]
        param-norm = "cbsite_testplugin_xyz:ParamNorm"

        [project.entry-points."cbsite.reporters"]
        count-rows = "cbsite_testplugin_xyz:CountRows"

        [tool.setuptools]
        py-modules = ["cbsite_testplugin_xyz"]
    """))
    from cbsite.collector.plugins import registry

    # Looked up before the install, as in a notebook that collected once, then installed a plugin.
    assert "param-norm" not in registry.available("profilers")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # Offline: no index, and setuptools from the venv instead of an isolated build environment.
    subprocess.run(pip + ["install", "--no-deps", "--no-build-isolation", "--no-index", str(src)], check=True)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        subprocess.run(pip + ["uninstall", "-y", PACKAGE], check=True)
        sys.modules.pop("cbsite_testplugin_xyz", None)
        importlib.invalidate_caches()


def test_third_party_plugin_is_found_runs_and_lands_in_the_run(installed_plugin, fast_config, tmp_path):
    import dataclasses

    from cbsite import archive
    from cbsite.collector import profile
    from cbsite.collector.plugins import registry

    assert "param-norm" in registry.available("profilers") and "count-rows" in registry.available("reporters")
    model = nn.Sequential(nn.Linear(3, 2, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]]))
    cfg = dataclasses.replace(fast_config, plugins=("param-norm", "count-rows"),
                              plugin_options={"param-norm": {"scale": 2.0}})
    run = archive.read_run(profile(model, torch.randn(2, 3), config=cfg).save(tmp_path))
    row = run.table("forward").filter(run.table("forward")["path"] == "0").to_dicts()[0]
    assert {"name": "param-norm.l2", "value": 10.0} in row["plugin_metrics"]  # ||W|| = 5, scaled by 2
    assert run.meta["count_rows"] == run.rows.height
    record = run.meta["config"]["plugins"]["param-norm"]
    assert record["kind"] == "profiler" and record["options"] == {"scale": 2.0} and record["seconds"] >= 0
