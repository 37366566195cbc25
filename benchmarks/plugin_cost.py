"""What each profiler plugin costs: collection time with and without it, in one run.

On the demo DLRM (`dlrm` provider; `--size tiny` by default to keep it short), in one process:
a warm-up collection (not reported: imports, allocator, inductor start-up), a baseline without
plugins, then one collection per plugin alone, the demo's set (trace, ops, log, compile with
max_depth=2), and the baseline again (its spread is the noise floor). For each it prints run.json's
`wall_time_s`, the extra seconds over the mean baseline, the ratio, and the bytes of artifacts written.
Timings are data, not pass/fail; the machine is printed with them.

    .venv/bin/python benchmarks/plugin_cost.py [--size tiny|small] [--budget S] [--threads T] [--json OUT]
                                               [--only WORD ...]   (cases whose name has WORD, plus the baselines)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cbsite.collector import CollectConfig
from cbsite.collector.collect import collect
from cbsite.collector.request import CollectRequest

CASES: list[tuple[str, tuple[str, ...], dict[str, dict[str, Any]]]] = [
    ("baseline", (), {}),
    ("trace", ("trace",), {}),
    ("ops", ("ops",), {}),
    ("trace+ops (one shared profiled pass)", ("trace", "ops"), {}),
    ("log", ("log",), {}),
    ("memory (CPU: profiler allocation timeline)", ("memory",), {}),
    ("numerics (vs bfloat16)", ("numerics",), {}),
    ("compile (every component)", ("compile",), {}),
    ("compile max_depth=2", ("compile",), {"compile": {"max_depth": 2}}),
    ("demo set: trace, ops, log, memory, compile max_depth=2", ("trace", "ops", "log", "memory", "compile"),
     {"compile": {"max_depth": 2}}),
    ("baseline again", (), {}),
]


def one(size: str, budget: float, threads: int | None, plugins: tuple[str, ...], options: dict[str, Any]) -> dict[str, Any]:
    config = CollectConfig(min_run_time=budget, progress=False, num_threads=threads, plugins=plugins, plugin_options=options)
    started = time.perf_counter()
    run = collect(CollectRequest(provider="dlrm", options={"size": size}, model_name="dlrm", version="bench", config=config))
    outer = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        saved = run.save(tmp)
        artifact_bytes = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file() and "artifacts" in f.parts)
        ops_bytes = (saved / "ops.parquet").stat().st_size if (saved / "ops.parquet").exists() else 0
    errors = [e for es in run.rows["plugin_errors"].to_list() for e in (es or [])]
    inside = {name: rec.get("seconds", 0.0) for name, rec in run.meta["config"]["plugins"].items()}
    return {"wall_s": run.meta["wall_time_s"], "outer_s": round(outer, 3), "timed_s": run.meta["timed_s"],
            "artifact_bytes": artifact_bytes, "ops_bytes": ops_bytes, "plugin_errors": len(errors), "errors": sorted(set(errors)),
            "plugin_s": round(sum(inside.values()), 3),
            "components": sum(run.meta["counts"].values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", choices=("tiny", "small", "medium"))
    parser.add_argument("--budget", type=float, default=0.05, help="timed seconds per component and phase")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, help="run only cases whose name contains one of these words")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or c[0].startswith("baseline") or any(w in c[0] for w in args.only)]
    machine = {
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
        "python": platform.python_version(), "threads": args.threads or torch.get_num_threads(),
        "load_before": os.getloadavg()[0],
    }
    print(f"machine: {machine}", flush=True)
    one(args.size, args.budget, args.threads, ("trace", "compile"), {"compile": {"max_depth": 0}})  # warm-up
    results = []
    for label, plugins, options in cases:
        r = one(args.size, args.budget, args.threads, plugins, options)
        results.append({"case": label, **r})
        print(f"  {label:<50} wall {r['wall_s']:7.2f}s  ({r['plugin_errors']} plugin errors)", flush=True)
    base = (results[0]["wall_s"] + results[-1]["wall_s"]) / 2
    machine["load_after"] = os.getloadavg()[0]
    # "in plugins" is the time inside the plugins' profile() calls (run.json config.plugins.*.seconds):
    # the cost itself, free of the run-to-run noise that the wall-time difference carries.
    print(f"\n{'case':<50} {'wall s':>8} {'extra s':>8} {'x base':>7} {'in plugins s':>12} {'artifacts':>10} {'ops.parquet':>11}")
    for r in results:
        print(f"{r['case']:<50} {r['wall_s']:8.2f} {r['wall_s'] - base:8.2f} {r['wall_s'] / base:7.2f} {r['plugin_s']:12.2f} "
              f"{r['artifact_bytes'] / 1e3:9.0f}k {r['ops_bytes'] / 1e3:10.0f}k")
    for r in results:
        for error in r["errors"]:
            print(f"plugin error in {r['case']}: {error}")
    print(f"\ncomponents per run: {results[0]['components']}; load average before/after: "
          f"{machine['load_before']:.1f}/{machine['load_after']:.1f} on {machine['cores']} cores")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "args": vars(args) | {"json": str(args.json)}, "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
