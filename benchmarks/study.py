"""Points per minute of a CPU-sized study, with 1 and 2 local workers, and how much the second worker
disturbs the latencies (pinned vs not).

The same 4-point dlrm-synthetic study (tiny preset, dense_features x embedding_dim) is swept three times
into fresh archives: 1 worker; 2 workers pinned to their own cores (the default); 2 workers not pinned
(same thread count, placed by the kernel). Printed per configuration: wall seconds, points per minute,
and, per point, the root's forward latency and the train step's examples/s relative to the 1-worker
sweep (median over points of head/base), with the share of contended step blocks.

    PYTHONPATH=. .venv/bin/python benchmarks/study.py           # about 3-5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from cbsite import study as cstudy
from cbsite.archive import list_runs, read_run

GRID = ["dense_features=64,512", "embedding_dim=8,32"]


def sweep(root: Path, workers: int, pin: bool, budget: float) -> float:
    from cbsite.collector.config import CollectConfig
    from cbsite.collector.executors import run_sweep
    from cbsite.collector.request import CollectRequest

    study = cstudy.Study.from_grid("bench", "dlrm-synthetic", GRID, base_options={"size": "tiny"})
    config = CollectConfig(min_run_time=budget, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10, progress=False)
    request = CollectRequest(provider="dlrm-synthetic", batches=2, config=config)
    started = time.perf_counter()
    record = run_sweep(study, study.points, root, request, workers=workers, pin=pin)
    wall = time.perf_counter() - started
    failed = [p for p in record["points"] if p["status"] != "done"]
    if failed:
        raise SystemExit(f"points failed: {failed}")
    return wall


def figures(root: Path) -> dict[str, dict[str, float]]:
    out = {}
    for ref in list_runs(root):
        run = read_run(ref.path)
        fwd = run.table("forward").filter(run.table("forward")["path"] == "")["latency_ms"][0]
        train = run.meta["step"]["train"]
        blocks = train.get("blocks") or []
        out[ref.version] = {"fwd_ms": fwd, "train_eps": train.get("examples_per_s"),
                            "contended": sum(b["contended"] for b in blocks) / max(1, len(blocks))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.05, help="per-component budget (s)")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores, load {os.getloadavg()[0]:.1f}; study: dlrm-synthetic tiny, {' x '.join(GRID)}, budget {args.budget}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="cbsite-bench-study-") as tmp:
        for name, workers, pin in (("1 worker", 1, True), ("2 workers pinned", 2, True), ("2 workers unpinned", 2, False)):
            root = Path(tmp) / name.replace(" ", "-")
            wall = sweep(root, workers, pin, args.budget)
            results[name] = (wall, figures(root))
            print(f"{name:20s} {wall:6.1f} s  {4 / wall * 60:5.2f} points/min", flush=True)
    base = results["1 worker"][1]
    for name, (_wall, figs) in results.items():
        if name == "1 worker":
            continue
        fwd = statistics.median(figs[k]["fwd_ms"] / base[k]["fwd_ms"] for k in base)
        eps = statistics.median(figs[k]["train_eps"] / base[k]["train_eps"] for k in base)
        cont = statistics.mean(figs[k]["contended"] for k in figs)
        print(f"{name:20s} forward latency x{fwd:.2f}, train examples/s x{eps:.2f} vs 1 worker; "
              f"{cont:.0%} of step blocks contended")
    print(f"1 worker: {statistics.mean(base[k]['contended'] for k in base):.0%} of step blocks contended")


if __name__ == "__main__":
    main()
