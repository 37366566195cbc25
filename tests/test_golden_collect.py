"""Golden records of what a collection writes, keyed on everything but timings.

Three small real models (the demo's DLRM and nanoGPT at their tiny size, and `tests.session_models:mlp` through the
`package.module:function` provider) are collected through the CLI, forward and backward, and their run.json and
components.parquet are compared with tests/golden/collect/<model>.json. Kept: every field a collection decides
without a clock (paths, kinds, statuses, FLOPs, bytes, parameters, call counts, shapes, notes, the run.json sections
and their deterministic values). Dropped (RUN_DROPPED, ROW_DROPPED, TIMING_NOTES below): what is measured in time or
depends on the machine's load, memory or installation. A refactoring of the collector keeps these files identical.

Regenerate after an intended change, then review the diff of tests/golden/collect/:

    CBSITE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden_collect.py

(`make golden` regenerates this and the generator's golden files.)
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

ROOT = Path(__file__).parents[1]
GOLDEN = Path(__file__).parent / "golden" / "collect"
REGEN = os.environ.get("CBSITE_REGEN_GOLDEN") == "1"

# The DLRM's record holds what a calibrated run writes (its settings, start and end); the other two skip both
# calibrations (--no-calibrate), so theirs hold what a run without calibration writes.
MODELS = {
    "dlrm": ["dlrm", "-o", "size=tiny"],
    "nanogpt": ["nanogpt", "-o", "size=tiny", "--no-step", "--no-calibrate"],
    "mlp": ["tests.session_models:mlp", "-o", "width=32", "-o", "batch=8", "--model", "mlp", "--no-calibrate"],
}
# Given peaks, a tiny budget and a per-component cap keep each collection to seconds on a loaded machine; the cap
# bounds the waits for a quiet machine, which is what a collection beside other work spends most of its time on.
FAST = ["--device", "cpu", "--budget", "0.01", "--max-component-s", "0.5", "--peak-flops", "1e11",
        "--peak-bandwidth", "1e10", "--no-progress", "--version", "golden"]

# run.json fields that are timings, or depend on the machine's load, memory, installation or clock. A pattern is a
# dotted path; `*` matches one key. A list is dropped or kept whole.
RUN_DROPPED = (
    "run_id", "created_at", "versions", "git", "wall_time_s", "timed_s", "breakdown_s", "samples.rows",
    # warnings: load, drift between calibrations, peak checks and MFU: all from timings or memory
    "warnings",
    "device.name", "device.cores", "device.load_average",
    # the calibration's measured rates and the shapes they elected; its settings are kept
    "device.calibration.check_s", "device.calibration.best_matmul_shape",
    "device.calibration.*.bandwidth", "device.calibration.*.flops", "device.calibration.*.best_matmul_shape",
    "device.calibration.*.repeats", "device.calibration.*.seconds", "device.calibration.*.ran_beside_setup_s",
    "device.calibration.*.waited_for_s",
    "device.calibration.end.matmul_shapes", "device.calibration.used", "device.calibration.component_shapes",
    # which components are counted on a real run follows how long their ancestor's statement ran (under 10 ms: real);
    # the counts are the same either way
    "counting.on_shapes", "counting.real",
    # which pairs are inverted depends on latencies; the number of pairs does not
    "hierarchy.consistent", "hierarchy.inverted", "hierarchy.remeasured_pairs", "hierarchy.share_consistent",
    "noise.round_spread_median", "noise.round_spread_p90",
    # twins timed apart: their spread is a timing (how many sets there are is not)
    "noise.twins.spread_median", "noise.twins.spread_max", "noise.twins.worst",
    # the memory limit follows the memory available at the start, the cache size the CPU; peaks are the process's RSS
    "memory.limit_bytes", "memory.cache_bytes", "memory.peak_rss_bytes", "memory.peak_rss_bytes_after_stage",
    "memory.peak_set_by", "memory.peak_raised_most_by", "memory.heap_returned",
    # the re-measurement's captures follow which pairs came out inverted, a timing
    "memory.remeasure_captures",
    # the whole-model step's timings (its batch, config and optimizer are kept)
    "step.*.blocks", "step.*.contended_blocks", "step.*.examples_per_s", "step.*.examples_per_s_p25",
    "step.*.examples_per_s_p75", "step.*.iterations", "step.*.ms", "step.*.p25_ms", "step.*.p75_ms",
    "step.*.round_ms", "step.*.warm_up_s", "step.*.warm_from_components_s", "step.*.device_time_ms",
)
# components.parquet columns measured in time (or the run's id).
ROW_DROPPED = (
    "run_id", "latency_ms", "latency_p25_ms", "latency_p75_ms", "samples", "cpu_time_ms", "device_time_ms",
    "tflops_per_s", "mfu", "bandwidth_gbps", "bandwidth_util", "compiled_latency_ms", "compile_speedup",
    "compile_time_s",
)
# Notes (of rows and of the step) whose presence follows the timing: a busy machine, the cap, a rate above a peak,
# a child timed slower than its parent (and its re-measurement).
TIMING_NOTES = ("contended", "cut short:", "run-to-run spread", "MFU above 100 %", "FLOPs suspect",
                "bandwidth utilisation above 100 %", "slower than its parent ", "faster than its child ",
                "the interleaved re-measurement")


def _dropped(path: tuple[str, ...]) -> bool:
    for pattern in RUN_DROPPED:
        parts = pattern.split(".")
        if len(parts) == len(path) and all(p in ("*", k) for p, k in zip(parts, path)):
            return True
    return False


def _keep_notes(notes: list[str] | None) -> list[str] | None:
    return notes if notes is None else [n for n in notes if not n.startswith(TIMING_NOTES)]


def _normal_meta(value: Any, path: tuple[str, ...] = ()) -> Any:
    if isinstance(value, dict):
        out = {k: _normal_meta(v, path + (k,)) for k, v in value.items() if not _dropped(path + (k,))}
        # A section that held timings only is gone too: a run that did not calibrate has `device.calibration` only
        # where a row beat the given peak (its `component_shapes`), which follows the timings.
        out = {k: v for k, v in out.items() if not (v == {} and isinstance(value[k], dict) and value[k])}
        if path[:1] == ("step",) and "notes" in out:
            out["notes"] = _keep_notes(out["notes"])
        return out
    if isinstance(value, list):
        return [_normal_meta(v, path) for v in value]
    return value


def normalised(run_dir: Path) -> dict[str, Any]:
    """run.json and components.parquet of one run, without timings: rows in (order, phase) order."""
    meta = _normal_meta(json.loads((run_dir / "run.json").read_text()))
    rows = pl.read_parquet(run_dir / "components.parquet").sort("order", "phase").drop(ROW_DROPPED).to_dicts()
    for row in rows:
        row["notes"] = _keep_notes(row["notes"])
    return {"run": meta, "components": rows}


def _dump(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=True) + "\n"


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> dict[str, Path]:
    """Each model's run folder. The three collections run side by side: only their timings share the machine."""
    runs = tmp_path_factory.mktemp("collect")
    # From a folder outside any git checkout (run.json's `git` stays null), with the repository importable.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "cbsite", "collect", *args, *FAST, "--runs", str(runs)],
                               cwd=runs, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, args in MODELS.items()
    }
    outputs = {name: proc.communicate(timeout=600)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"cbsite collect {name} failed:\n{outputs[name][-4000:]}"
    return {name: next((runs / name / "golden").iterdir()) for name in MODELS}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_collection_matches_golden_record(collected, model):
    produced = _dump(normalised(collected[model]))
    golden = GOLDEN / f"{model}.json"
    if REGEN:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(produced)
    assert golden.exists(), f"missing {golden}: run CBSITE_REGEN_GOLDEN=1 .venv/bin/python -m pytest {__file__}"
    expected = golden.read_text()
    if produced != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), produced.splitlines(True),
                                            f"golden/collect/{model}.json", "collected", n=2))
        pytest.fail(f"the collection of {model} differs from {golden} (if intended, regenerate: see the module "
                    f"docstring):\n{diff[:20000]}", pytrace=False)
