"""Plugin architecture and the cheap built-in profilers (trace, ops, log, memory) on small real models."""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
import textwrap

import pytest
import torch
from torch import nn

from cbsite import archive
from cbsite.collector import CollectConfig, profile
from cbsite.collector.plugins import Option, PluginResult, Profiler, registry
from cbsite.collector.plugins.memory import CPU_STATUS
from cbsite.collector.plugins.ops import COVERAGE_FLOOR, OTHER
from cbsite.collector.plugins.runner import label, slug
from cbsite.errors import CbsiteError


def rows_of(run, phase):
    return {r["path"]: r for r in run.table(phase).to_dicts()}


def metrics(row):
    return {m["name"]: m["value"] for m in row["plugin_metrics"] or []}


def selected(meta):
    """config.plugins without the seconds each plugin took (a timing, checked for presence only)."""
    plugins = meta["config"]["plugins"]
    assert all(rec["seconds"] >= 0 for rec in plugins.values() if rec["kind"] == "profiler")
    return {name: {k: v for k, v in rec.items() if k != "seconds"} for name, rec in plugins.items()}


def with_plugins(cfg, *names, **options):
    return dataclasses.replace(cfg, plugins=names, plugin_options=options, num_threads=1)


def test_builtins_register_through_entry_points():
    assert {"trace", "ops", "memory", "log", "compile", "numerics"} <= set(registry.available("profilers"))
    assert {"shrink-hash", "replicate-batch"} <= set(registry.available("preprocessors"))
    assert {"dlrm", "deepfm", "dlrm-synthetic", "nanogpt"} <= set(registry.available("providers"))


def test_unknown_plugins_and_options_reported_at_once_with_known_names(fast_config):
    with pytest.raises(CbsiteError) as err:
        dataclasses.replace(fast_config, plugins=("trace", "nope"),
                            plugin_options={"trace": {"iterations": "many", "colour": 1}, "ops": {"top": 3}})
    msg = str(err.value)
    assert "unknown plugin 'nope'" in msg and "trace.colour" in msg and "trace.iterations='many'" in msg
    assert "'ops', which is not selected" in msg and "compile, log, memory, numerics, ops, trace" in msg


def test_slugs_are_safe_and_unique():
    paths = ["", "a", "A", "a.b", "a_b", "a-b", "a/b", "a b", "-root", ".x", "é", "x" * 300, "x" * 299 + "y"]
    slugs = [slug(p) for p in paths]
    assert len(set(slugs)) == len(paths) and len({s.lower() for s in slugs}) == len(paths)
    for s in slugs:
        assert s and len(s) <= 120 and s not in (".", "..") and not s.startswith(".")
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in s) and s == s.lower()


class Sibling(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


def test_trace_is_chrome_json_with_the_label_and_only_the_component(fast_config, tmp_path):
    cfg = with_plugins(fast_config, "trace", trace={"iterations": 2})
    run = profile(Sibling(), torch.randn(4, 32), config=cfg)
    saved = archive.read_run(run.save(tmp_path))
    fwd, bwd = rows_of(saved, "forward"), rows_of(saved, "backward")
    for rows, phase in ((fwd, "forward"), (bwd, "backward")):
        for path in ("", "lin", "act"):
            assert rows[path]["trace_file"] == f"artifacts/{slug(path)}/{phase}.trace.json.gz"
    names = {}
    for path in ("", "lin"):
        events = json.loads(gzip.decompress((saved.path / fwd[path]["trace_file"]).read_bytes()))["traceEvents"]
        spans = [e for e in events if e.get("name") == label(path, "forward")]
        assert len(spans) == 2  # one per iteration
        ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        assert ops
        for op in ops:  # every op lies inside one of the component's spans
            assert any(s["ts"] <= op["ts"] and op["ts"] + op["dur"] <= s["ts"] + s["dur"] + 1 for s in spans), op["name"]
        names[path] = {e["name"] for e in ops}
    assert "aten::addmm" in names["lin"] and "aten::relu" not in names["lin"]  # the sibling's work is not there
    assert {"aten::addmm", "aten::relu"} <= names[""]


@pytest.mark.serial  # the coverage floor is of a wall-clock span: a busy neighbour stretches the Python between ops
def test_ops_rows_add_up_to_the_component_cpu_time(fast_config):
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU())
    cfg = with_plugins(fast_config, "ops", ops={"top": 2})
    run = profile(model, torch.randn(256, 512), config=cfg)
    ops = run.ops
    from cbsite import schema

    assert ops is not None and ops.columns == schema.OPS_COLUMNS
    for phase in ("forward", "backward"):
        row = rows_of(run, phase)["0"]
        mine = ops.filter((ops["path"] == "0") & (ops["phase"] == phase) & (ops["kind"] == "op")).sort("rank")
        m = metrics(row)
        total = mine["cpu_time_ms"].sum()
        # The stated tolerance (ops.py): the rows are the op events' self times, so they add up to the
        # profiled span minus the Python between ops: never more than the span, at least COVERAGE_FLOOR of it.
        assert total == pytest.approx(m["ops.ops_cpu_ms"], rel=1e-9)
        assert total <= m["ops.profiled_cpu_ms"] * (1 + 1e-9)
        assert total >= COVERAGE_FLOOR * m["ops.profiled_cpu_ms"], (phase, total, m)
        assert mine["share"].sum() == pytest.approx(1.0)
        assert len(mine) == 3 and mine["op"][-1].startswith(OTHER)  # top 2, the rest in one row
    fwd_ops = ops.filter((ops["path"] == "0") & (ops["phase"] == "forward"))
    addmm = fwd_ops.filter(fwd_ops["op"] == "aten::addmm").to_dicts()[0]
    assert addmm["rank"] == 1 and addmm["calls"] == 1 and addmm["flops"] == rows_of(run, "forward")["0"]["flops"]


class Chatty(nn.Module):
    def forward(self, x):
        print("chatty says hi")
        import warnings

        warnings.warn("chatty warns", stacklevel=1)
        return x + 1


class Broken(nn.Module):
    def forward(self, x):
        raise ValueError("planted failure for the log")


class ChattyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.chatty = Chatty()
        self.quiet = nn.Linear(4, 4)
        self.broken = Broken()

    def forward(self, x):
        try:
            self.broken(x)
        except ValueError:
            pass
        return self.chatty(self.quiet(x))  # its input requires grad: backward is measured too


def test_log_captures_prints_warnings_and_the_failure_traceback(fast_config, tmp_path):
    run = profile(ChattyModel(), torch.randn(2, 4), config=with_plugins(fast_config, "log"))
    saved = archive.read_run(run.save(tmp_path))
    fwd = rows_of(saved, "forward")
    text = (saved.path / fwd["chatty"]["log_file"]).read_text()
    assert "[stdout] chatty says hi  (x" in text and "UserWarning: chatty warns" in text
    assert "== forward (measured) ==" in text and "== backward (measured) ==" in text
    assert metrics(fwd["chatty"])["log.lines"] > 1
    assert fwd["quiet"]["log_file"] is None and metrics(fwd["quiet"])["log.lines"] == 0  # no empty files
    broken = (saved.path / fwd["broken"]["log_file"]).read_text()
    assert fwd["broken"]["status"] == "failed"
    assert "Traceback (most recent call last)" in broken and "planted failure for the log" in broken


def test_memory_on_cpu_says_the_cuda_snapshot_is_unavailable_and_writes_the_profiler_timeline(fast_config, tmp_path):
    run = profile(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4), config=with_plugins(fast_config, "memory"))
    assert run.meta["config"]["plugins"]["memory"]["status"] == CPU_STATUS
    assert CPU_STATUS.startswith("CUDA allocator snapshot not available on CPU")
    saved = run.save(tmp_path)
    for row in run.table().to_dicts():
        assert row["peak_memory_bytes"] is not None  # the allocator's peak per phase, as on any run
        view = saved / row["memory_file"]  # the timeline (tests/test_memory_view.py checks its content)
        assert view.stat().st_size > 0 and view.with_suffix(".pickle").stat().st_size > 0


@pytest.mark.gpu
def test_memory_snapshot_on_cuda(tmp_path):
    import pickle

    cfg = CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e12, peak_bandwidth=1e11,
                        progress=False, device="cuda", plugins=("memory",))
    run = profile(nn.Sequential(nn.Linear(256, 256), nn.ReLU()), torch.randn(64, 256), config=cfg)
    saved = archive.read_run(run.save(tmp_path))
    for phase in ("forward", "backward"):
        row = rows_of(saved, phase)["0"]
        snapshot = pickle.loads((saved.path / row["memory_file"]).with_suffix(".pickle").read_bytes())
        assert snapshot["device_traces"] and any(e["action"] == "alloc" for e in snapshot["device_traces"][0])
        assert (saved.path / row["memory_file"]).with_suffix(".txt").read_text().startswith("== segments ==")
        assert row["memory_file"].endswith(f"{phase}.memory.json")
        assert metrics(row)["memory.peak_bytes"] > 0
    assert "status" not in saved.meta["config"]["plugins"]["memory"]


class Boom(Profiler):
    name = "boom"
    description = "raises on one component"
    options = {"target": Option("1")}

    def profile(self, ctx):
        if ctx.path == self.opts["target"]:
            raise RuntimeError("boom plugin failed here")
        return PluginResult(metrics={"seen": 1.0})


class _Entry:
    def __init__(self, obj):
        self.obj = obj

    def load(self):
        return self.obj


def test_a_raising_plugin_marks_only_its_output_and_the_run_goes_on(fast_config, monkeypatch):
    real = registry.available
    monkeypatch.setattr(registry, "available",
                        lambda kind: {**real(kind), **({"boom": _Entry(Boom)} if kind == "profilers" else {})})
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    run = profile(model, torch.randn(2, 4), config=with_plugins(fast_config, "boom", "trace"))
    for phase in ("forward", "backward"):
        rows = rows_of(run, phase)
        assert rows["1"]["status"] == "measured" and rows["1"]["latency_ms"] > 0
        assert rows["1"]["plugin_errors"] == [rows["1"]["plugin_errors"][0]]
        assert rows["1"]["plugin_errors"][0].startswith("boom: RuntimeError: boom plugin failed here")
        assert rows["1"]["trace_file"] is not None  # the other plugin still ran on that component
        assert rows["0"]["plugin_errors"] is None and metrics(rows["0"])["boom.seen"] == 1.0
    assert selected(run.meta)["boom"] == {"kind": "profiler", "options": {"target": "1"}}


@pytest.mark.slow
def test_configuration_file_and_cli_selection(tmp_path, monkeypatch):
    from cbsite.cli import main

    (tmp_path / "tinymodel.py").write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(4, 4)), (torch.randn(2, 4),)
    """))
    (tmp_path / "cbsite.toml").write_text('plugins = ["trace", "ops"]\n[options.trace]\niterations = 2\n[options.ops]\ntop = 4\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tinymodel", raising=False)  # another test may have loaded its own tinymodel
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)  # the file is found from the working directory upwards
    common = ["collect", "tinymodel:build", "--runs", str(tmp_path / "runs"), "--budget", "0.002",
              "--phases", "forward", "--no-progress", "--no-step", "--peak-flops", "1e11", "--peak-bandwidth", "1e10",
              "--no-calibrate"]
    assert main(common) == 0
    assert main(common + ["--plugin", "trace", "--plugin-option", "trace.iterations=1", "--version", "v1"]) == 0
    by_version = {ref.version: archive.read_run(ref.path) for ref in archive.list_runs(tmp_path / "runs")}
    assert selected(by_version["v0"].meta) == {
        "trace": {"kind": "profiler", "options": {"iterations": 2}},
        "ops": {"kind": "profiler", "options": {"top": 4, "iterations": 3}},
    }
    assert by_version["v0"].ops is not None
    assert selected(by_version["v1"].meta) == {"trace": {"kind": "profiler", "options": {"iterations": 1}}}
    (tmp_path / "cbsite.toml").unlink()
    (tmp_path / "pyproject.toml").write_text('[tool.cbsite]\nplugins = ["trace"]\ncolour = "red"\n[tool.cbsite.options]\ntrace = 3\n')
    with pytest.raises(CbsiteError) as err:
        registry.merged_selection([], {}, work)
    assert "unknown key 'colour'" in str(err.value) and "options must be tables" in str(err.value)
