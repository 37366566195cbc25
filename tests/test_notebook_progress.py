"""`cbsite.profile` in a Jupyter kernel says where it is while the cell runs: rich's bar where ipywidgets is installed,
else one stderr line redrawn in place (Jupyter honours the carriage return), never a line every 30 s only. The kernel
is recognised as rich recognises it: `get_ipython()` answering with IPython's ZMQ shell."""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import io
import re

import pytest

from cbsite.collector.pipeline import progress
from cbsite.collector.pipeline.line_progress import NotebookLine

torch = pytest.importorskip("torch")


class ZMQInteractiveShell:
    """The class name of the shell `get_ipython()` returns inside a Jupyter kernel, which rich's detection reads."""


@pytest.fixture
def jupyter_kernel(monkeypatch):
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    if importlib.util.find_spec("ipywidgets") is not None:
        pytest.skip("ipywidgets is installed: rich draws its own bar in the kernel")


def test_a_kernel_without_ipywidgets_gets_the_redrawn_line_and_a_log_keeps_its_lines(jupyter_kernel, monkeypatch):
    assert type(progress.progress_bar(True, 3)) is NotebookLine
    monkeypatch.delattr(builtins, "get_ipython")
    assert type(progress.progress_bar(True, 3)) is progress.LineProgress  # stderr a file or a pipe, no kernel


def test_profile_in_a_notebook_redraws_its_progress_line_as_components_are_measured(jupyter_kernel, monkeypatch):
    from torch import nn

    import cbsite

    monkeypatch.setattr(NotebookLine, "LINE_EVERY_S", 0.0)  # every update drawn, however fast the machine
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    config = cbsite.CollectConfig(min_run_time=0.01, peak_flops=1e11, peak_bandwidth=1e10, calibrate=False)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        run = cbsite.profile(model, torch.randn(8, 16), model_name="mlp", version="v1", config=config)
    text = stderr.getvalue()
    total = run.rows.get_column("path").n_unique()  # the whole model and its three layers

    lines = [line for line in text.split("\n") if "cbsite: collecting" in line]
    assert len(lines) == 1, text  # one line, redrawn; the newline only once the stage is done
    draws = [d.rstrip() for d in lines[0].split("\r") if d]
    assert draws[0].startswith("cbsite: collecting") and f" 0/{total} " in draws[0]  # shown before any measurement
    assert draws[-1].endswith("s elapsed") and f" {total}/{total} (done)" in draws[-1]
    counts = [int(re.search(r" (\d+)/\d+ ", d).group(1)) for d in draws]
    assert counts == sorted(counts) and set(range(total + 1)) <= set(counts), draws
    assert any("mlp · forward" in d for d in draws) and any("· backward" in d for d in draws)
