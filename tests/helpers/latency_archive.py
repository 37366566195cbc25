"""A small archive with latency evidence for the site tests: three versions of one model, a comparison record
(`cbsite compare`) between v1 and v3 (not consecutive), written directly with known units, and two more runs
collected with rounds (samples.parquet) so that their diff is judged on rounds.

    from tests.helpers.latency_archive import write_latency_archive, IDS
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from cbsite import schema, stats
from cbsite.diff import comparison
from tests.helpers.runfactory import make_run, write_archive

SPEC = {"": {"enc": {"enc.a": None, "enc.b": None}, "c": None}}
IDS = {"v1": "20250201T000000Z-0000a1", "v2": "20250202T000000Z-0000a2", "v3": "20250203T000000Z-0000a3",
       "r1": "20250204T000000Z-0000b1", "r2": "20250205T000000Z-0000b2"}
COMPARISON_ID = "20250203T010000Z-0000c1"

# Per (head path, phase): per-process log ratios with a known verdict at the default level and floor.
UNITS: dict[tuple[str, str], list[float]] = {
    ("", "forward"): [0.18, 0.20, 0.19, 0.21, 0.20, 0.19],  # regressed (about 1.22x)
    ("enc.a", "forward"): [0.26, 0.27, 0.25, 0.26, 0.28, 0.26],  # regressed (about 1.30x)
    ("enc.b", "forward"): [0.001, -0.002, 0.0, 0.001, -0.001, 0.0],  # unchanged
    ("c", "forward"): [-0.30, -0.31, -0.29, -0.30, -0.30, -0.31],  # improved
    ("", "backward"): [0.10, 0.12, 0.11, 0.09, 0.11, 0.10],  # regressed
    ("enc.a", "backward"): [0.30, -0.20, 0.10, 0.25, -0.15, 0.05],  # inconclusive
    ("enc.b", "backward"): [0.002, 0.0, -0.001, 0.001, 0.0, -0.002],  # unchanged
    ("c", "backward"): [0.001, 0.0, -0.001, 0.002, 0.0, 0.0],  # unchanged
}
EXPECTED = {k: v for k, v in {
    ("", "forward"): "regressed", ("enc.a", "forward"): "regressed", ("enc.b", "forward"): "unchanged",
    ("c", "forward"): "improved", ("", "backward"): "regressed", ("enc.a", "backward"): "inconclusive",
    ("enc.b", "backward"): "unchanged", ("c", "backward"): "unchanged"}.items()}


def _runs() -> list[Any]:
    lat = {"enc.a": 0.10, "enc.b": 0.05, "c": 0.08}
    v1 = make_run(SPEC, model="cmp", version="v1", run_id=IDS["v1"],
                  metrics={p: {"latency_ms": v, "flops": 1000} for p, v in lat.items()})
    v2 = make_run(SPEC, model="cmp", version="v2", run_id=IDS["v2"],
                  metrics={p: {"latency_ms": v * 1.01, "flops": 1000} for p, v in lat.items()})
    # v3: enc.a 30 % slower, c 26 % faster, and enc.b 12 % slower in its raw median, which the paired
    # session found unchanged: the page must not draw that as a change.
    v3 = make_run(SPEC, model="cmp", version="v3", run_id=IDS["v3"],
                  metrics={"enc.a": {"latency_ms": 0.13, "flops": 1000}, "enc.b": {"latency_ms": 0.056, "flops": 1000},
                           "c": {"latency_ms": 0.059, "flops": 1000}})
    return [v1, v2, v3]


def _record() -> dict[str, Any]:
    comps = []
    for (key, phase), units in UNITS.items():
        comps.append({"key": key, "base_path": key, "phase": phase, "units": units,
                      "verdict": stats.paired(units).to_dict(), "flagged": [], "errors": []})
    verdicts = {k: stats.paired(u) for k, u in UNITS.items()}
    return {
        "comparison_version": comparison.COMPARISON_VERSION, "schema_version": schema.SCHEMA_VERSION,
        "comparison_id": COMPARISON_ID, "created_at": "2025-02-03T01:00:00Z",
        "base": {"model": "cmp", "version": "v1", "run_id": IDS["v1"], "provider": {"name": "synthetic"}},
        "head": {"model": "cmp", "version": "v3", "run_id": IDS["v3"], "provider": {"name": "synthetic"}},
        "layout": "interleaved", "processes": 6, "threads": 1, "pairs": 8, "block_s": 0.004,
        "alpha": stats.ALPHA, "floor": stats.FLOOR, "components": comps, "summary": comparison.summary(verdicts),
    }


def _samples(run: Any, rounds: int) -> pl.DataFrame:
    """Blocks of `rounds` rounds for each measured (path, phase) of a run: per-round medians around the
    row's latency, spread by a few %."""
    rows = []
    for r in run.rows.iter_rows(named=True):
        if r["status"] != "measured" or r["latency_ms"] is None:
            continue
        base = r["latency_ms"] / 1000.0
        for rnd in range(rounds):
            wobble = math.exp(0.01 * ((rnd * 7 + len(r["path"])) % 5 - 2))
            for block in range(3):
                rows.append({"run_id": run.run_id, "model": run.model, "version": run.version, "session_id": run.run_id,
                             "path": r["path"], "key": r["path"], "phase": r["phase"], "process": rnd, "round": rnd,
                             "pair": block, "arm": "run", "position": 0, "seconds_per_call": base * wobble,
                             "calls": 10, "start_s": 1.7e9 + rnd, "wait_s": 0.0, "contended": False})
    return pl.from_arrow(pl.DataFrame(rows).to_arrow().cast(schema.SAMPLES_SCHEMA))


def _round_runs() -> list[Any]:
    lat = {"enc.a": 0.10, "enc.b": 0.05, "c": 0.08}
    r1 = make_run(SPEC, model="rounds", version="r1", run_id=IDS["r1"],
                  metrics={p: {"latency_ms": v, "flops": 1000} for p, v in lat.items()})
    r2 = make_run(SPEC, model="rounds", version="r2", run_id=IDS["r2"],
                  metrics={p: {"latency_ms": v * (1.5 if p == "enc.a" else 1.0), "flops": 1000} for p, v in lat.items()})
    for run in (r1, r2):
        run.samples = _samples(run, 4)
        run.meta["rounds"] = 4
    return [r1, r2]


def write_latency_archive(root: Path, rounds: bool = True) -> Path:
    write_archive(root, _runs() + (_round_runs() if rounds else []))
    comparison.write_comparison(root, _record(), None)
    return root
