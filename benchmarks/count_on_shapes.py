"""Counting on shapes against counting for real (issue 13): the same collection with `count_on_shapes` on and
stubbed out, alternating, each in a fresh process: its peak resident memory (ru_maxrss), the seconds of its
counting passes (run.json `breakdown_s.components_counting`) and how many phases went each way (`counting`).
No calibration and no step, so the two arms differ in counting alone. Nothing here asserts.

    PYTHONPATH=. .venv/bin/python benchmarks/count_on_shapes.py [--cases dlrm-medium,nanogpt-small] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = {
    "dlrm-medium": ("dlrm", {"size": "medium"}),
    "nanogpt-small": ("nanogpt", {"size": "small"}),
    "nanogpt-2x128": ("nanogpt", {"size": "medium", "batch_size": 2, "seq_len": 128}),
}

ONE = r"""
import json, resource, sys, torch
import cbsite.collector.measure as measure
from cbsite.collector.config import CollectConfig
from cbsite.collector.profiler import profile_model
from cbsite.collector.providers import provide
if sys.argv[1] == "real":
    measure.count_on_shapes = lambda *args: None
torch.set_num_threads(1)
p = provide(sys.argv[2], json.loads(sys.argv[3]), batches=3)
run = profile_model(p.model, [(i.args, i.kwargs) for i in p.inputs], CollectConfig(progress=False, calibrate=False, step=False))
print(json.dumps({"peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "counting_s": run.meta["breakdown_s"]["components_counting"],
                  "on_shapes": run.meta["counting"]["on_shapes"], "real": run.meta["counting"]["real"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="dlrm-medium,nanogpt-small")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at start")
    for name in args.cases.split(","):
        provider, options = CASES[name]
        for _ in range(args.repeats):
            for arm in ("shapes", "real"):
                done = subprocess.run([sys.executable, "-c", ONE, arm, provider, json.dumps(options)],
                                      capture_output=True, text=True)
                out = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else f"error: {done.stderr.strip()[-300:]}"
                print(f"{name:14s} {arm:6s} {out}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
