"""Is the CPU peak the same when the start calibration runs beside the model's build, and with its cheaper passes?

A collection now starts its start calibration in the kept worker before it builds the model
(`device.start_calibration`), so the worker's start and the calibration overlap the build and the census instead of
following them; the build runs on the cores the calibration leaves (one of two here). And the calibration's later
passes time the first pass's two fastest matmul shapes only (`device.best_shapes`). A sceptic asks whether either
changes the peak, the denominator of every MFU and bandwidth utilisation. This measures both, in one run:

1. **Beside a build or alone.** Trials in random order, each in a fresh process (so the provider's imports are cold,
   as in `cbsite collect`) with a fresh kept worker: the calibration started, then either the provider imported and
   its model built in that process with the threads `start_calibration` leaves (beside), or that process asleep for
   as long (alone); then the calibration taken. Per trial: the peak FLOP/s and copy bandwidth, each pass's wait for a
   CPU (`waited_s`), and, beside a build, how long the build ran and how long the calibration was waited for after it.
2. **The later passes' shapes.** Calibrations in a clean worker that time every shape in every pass: the peak the
   full passes give against the peak the cheaper rule would have given from the same passes (the first pass's every
   shape, the later passes' best two of the first).

It prints the medians and ratios measured in this run, and the machine with its load. Nothing here asserts.

    PYTHONPATH=. .venv/bin/python benchmarks/calibration_overlap.py [--trials 4] [--provider dlrm] [--options '{"size": "medium"}'] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from cbsite.collector import device
from cbsite.collector.clean_worker import kept_worker


def _full_passes(dtype_name: str, num_threads: int, repeats: int) -> list[dict[str, Any]]:
    """The worker's job: `repeats` passes that each time every shape (the rule before the cheaper later passes)."""
    torch.set_num_threads(num_threads)
    dtype = getattr(torch, dtype_name)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = device.calibrate_once(dtype, num_threads)
        out.append({**p, "seconds": time.perf_counter() - t0})
    return out


def trial(beside: bool, provider: str, options: dict[str, Any], idle_s: float) -> dict[str, Any]:
    """One calibration started in a fresh kept worker, beside this process's build of the model or alone."""
    threads_before = torch.get_num_threads()
    with kept_worker(start_now=True):
        t0 = time.perf_counter()
        left = device.start_calibration(torch.float32, 1)
        build_s = None
        if beside:
            torch.set_num_threads(left or 1)
            from cbsite.collector.providers import provide  # imported here, as a collection's build imports it

            provided = provide(provider, options, batches=3)
            build_s = time.perf_counter() - t0
            del provided
            torch.set_num_threads(threads_before)
        else:
            time.sleep(idle_s)  # the worker alone: this process idles as long as a build takes
        cal = device.calibrate_cpu(torch.float32, 1)
    detail = cal["detail"]
    return {"beside": beside, "flops": cal["flops"], "bandwidth": cal["bandwidth"], "started_early": detail.get("started_early"),
            "waited_s": [r.get("waited_s") for r in detail["repeats"]], "build_s": build_s,
            "waited_for_s": detail.get("waited_for_s"), "ran_beside_setup_s": detail.get("ran_beside_setup_s"),
            "from_start_s": time.perf_counter() - t0}


def rule_check(runs: int) -> list[dict[str, Any]]:
    """Full passes (every shape, every pass) against what the cheaper later passes would have kept of them."""
    out = []
    for _ in range(runs):
        # By its module's name, so that the spawned worker can import it (this file runs as __main__).
        job = importlib.import_module("benchmarks.calibration_overlap")._full_passes
        passes, method = device.in_clean_worker(job, "float32", 1, device.CALIBRATION_REPEATS)
        full = max(r[3] for p in passes for r in p["rates"])
        kept = device.best_shapes(passes[0])
        rule = max([r[3] for r in passes[0]["rates"]] + [r[3] for p in passes[1:] for r in p["rates"] if r[:3] in kept])
        per_shape = {tuple(r[:3]): r for r in passes[0]["rates"]}
        out.append({"method": method, "full_peak": full, "rule_peak": rule, "rule_over_full": rule / full,
                    "best_two": kept, "full_best_shape": max(((r[3], r[:3]) for p in passes for r in p["rates"]))[1],
                    "full_s": sum(p["seconds"] for p in passes), "shapes": len(per_shape)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4, help="trials per condition (beside a build, alone)")
    ap.add_argument("--rule-runs", type=int, default=3)
    ap.add_argument("--provider", default="dlrm")
    ap.add_argument("--options", default='{"size": "medium"}')
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", choices=("beside", "alone"), help=argparse.SUPPRESS)  # one trial, in this process
    ap.add_argument("--idle-s", type=float, default=2.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    options = json.loads(args.options)
    print(f"machine: {platform.processor() or platform.machine()} ({device.cpu_name()}), {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f} at start", flush=True)
    if args.one:
        print(json.dumps(trial(args.one == "beside", args.provider, options, args.idle_s)))
        return
    order = [True, False] * args.trials
    random.Random(0).shuffle(order)
    trials = []
    idle_s = 2.0  # until the first build says how long one takes
    for beside in order:
        cmd = [sys.executable, __file__, "--one", "beside" if beside else "alone", "--provider", args.provider,
               "--options", args.options, "--idle-s", f"{idle_s:.3f}"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        trials.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if beside:
            idle_s = trials[-1]["build_s"]
        print(json.dumps(trials[-1]), flush=True)
    rules = rule_check(args.rule_runs)
    for r in rules:
        print(json.dumps(r), flush=True)
    load_end = os.getloadavg()[0]

    def med(key: str, beside: bool) -> float:
        return statistics.median(t[key] for t in trials if t["beside"] is beside)

    print(f"\nstart calibration ({args.trials} trials each, random order; {args.provider} {options} built beside)")
    print(f"{'condition':10s} {'GFLOP/s':>8s} {'GB/s':>6s} {'max pass wait ms':>16s} {'build s':>8s} {'waited after s':>14s}")
    for beside in (True, False):
        waits = max(w for t in trials if t["beside"] is beside for w in t["waited_s"] if w is not None)
        build = f"{med('build_s', True):8.2f}" if beside else f"{'':8s}"
        print(f"{'beside' if beside else 'alone':10s} {med('flops', beside) / 1e9:8.1f} {med('bandwidth', beside) / 1e9:6.1f} "
              f"{waits * 1e3:16.1f} {build} {med('waited_for_s', beside):14.2f}")
    print(f"beside / alone: FLOP/s {med('flops', True) / med('flops', False):.4f}, "
          f"bandwidth {med('bandwidth', True) / med('bandwidth', False):.4f}")
    print(f"\nlater passes on the first pass's two fastest shapes ({args.rule_runs} calibrations of full passes)")
    for r in rules:
        print(f"  full peak {r['full_peak'] / 1e9:.1f} GFLOP/s at {r['full_best_shape']}, the rule's {r['rule_peak'] / 1e9:.1f} "
              f"({r['rule_over_full']:.4f}); best two of the first pass {r['best_two']}; full passes took {r['full_s']:.2f} s")
    print(f"load {load_end:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"trials": trials, "rules": rules, "options": options,
                                               "provider": args.provider}, indent=1))


if __name__ == "__main__":
    main()
