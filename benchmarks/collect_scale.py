"""How a collection's memory and time grow with the model (issue 13), against a plain training step.

For each case, in fresh processes one after another (never two at once, so they do not disturb each other):

1. **plain step**: the provider's model and batch 0, `torch.set_num_threads(1)` as the collector times,
   three iterations of zero_grad, forward, `output.mean().backward()` and an SGD step at lr 0; the
   process's peak resident memory (ru_maxrss) and the median iteration time.
2. **collection**: `cbsite collect PROVIDER -o ... --no-progress` into a temporary archive with the
   default budget; its own peak (ru_maxrss, run.json `memory.peak_rss_bytes`), wall time (run.json `wall_time_s`:
   from keeping the caller's model values, column "keep", to the end) and the time
   inside timed blocks (`timed_s`, the components' blocks, plus the blocks of the re-timing of inverted
   parent/child pairs, `breakdown_s.hierarchy_remeasure_timed_blocks`, and the whole-model step's blocks),
   and the breakdown run.json records (`breakdown_s`; "setup" is `setup_and_capture`: moving the model and the
   batches, and the census), with the start calibration's overlap with the build.

It prints one table of measured figures and ratios (collection peak / plain-step peak, wall / timed), the
whole process's wall time (`cbsite collect` from its start: imports and the model's build included), and the
machine with its load before and after. Timings on a shared machine are data, not pass/fail;
nothing here asserts.

    PYTHONPATH=. .venv/bin/python benchmarks/collect_scale.py [--cases tiny,small,medium-2x128,medium-8x512,dlrm-small,dlrm-medium] [--json OUT] [--keep DIR]

With `--keep DIR` each case's run folder is kept as DIR/CASE, so that `benchmarks/row_medians.py` can compare the
rows' latencies of two versions (A/B) and of one version with itself (A/A).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "tiny": ("nanogpt", {"size": "tiny"}),
    "small": ("nanogpt", {"size": "small"}),
    "medium-2x128": ("nanogpt", {"size": "medium", "batch_size": 2, "seq_len": 128}),
    "medium-8x512": ("nanogpt", {"size": "medium"}),
    "dlrm-small": ("dlrm", {"size": "small"}),
    "dlrm-medium": ("dlrm", {"size": "medium"}),
}

PLAIN_STEP = r"""
import json, resource, statistics, sys, time, torch
from cbsite.collector.providers import provide
torch.set_num_threads(1)
options = json.loads(sys.argv[2])
p = provide(sys.argv[1], options, batches=1)
model, inputs = p.model.train(), p.inputs[0]
opt = torch.optim.SGD([q for q in model.parameters() if q.requires_grad], lr=0.0)
times = []
for _ in range(3):
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    out = model(*inputs.args, **inputs.kwargs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    sum(o.float().mean() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad).backward()
    opt.step()
    del out, outs
    times.append(time.perf_counter() - t)
print(json.dumps({"peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "step_s": statistics.median(times)}))
"""


def _load() -> float:
    return os.getloadavg()[0]


def plain_step(provider: str, options: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PLAIN_STEP, provider, json.dumps(options)], capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def collection(provider: str, options: dict, extra: list[str], keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="cbsite-scale-") as runs:
        cmd = [sys.executable, "-m", "cbsite", "collect", provider, "--runs", runs, "--no-progress", *extra]
        for k, v in options.items():
            cmd += ["-o", f"{k}={v}"]
        started = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()
            return {"error": tail[-1] if tail else f"exit {done.returncode} (killed?)", "process_wall_s": wall}
        meta_file = next(Path(runs).rglob("run.json"))
        meta = json.loads(meta_file.read_text())
        first_blocks = _first_blocks(meta_file.parent)
        if keep is not None:  # the run's folder, for benchmarks/row_medians.py
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(meta_file.parent, keep)
    step_timed = 0.0
    for mode in ("train", "eval"):
        record = (meta.get("step") or {}).get(mode) or {}
        step_timed += sum(b.get("seconds", 0.0) * b.get("calls", 0) for b in record.get("blocks") or [])
    start = ((meta["device"].get("calibration") or {}).get("start") or {})
    return {
        "process_wall_s": wall, "wall_s": meta["wall_time_s"], "timed_s": meta["timed_s"], "step_timed_s": step_timed,
        "remeasure_timed_s": meta["breakdown_s"].get("hierarchy_remeasure_timed_blocks", 0.0),
        "calibration_start": {k: start.get(k) for k in ("started_early", "ran_beside_setup_s", "waited_for_s", "flops")},
        "peak_bytes": meta["memory"]["peak_rss_bytes"], "memory": meta["memory"], "breakdown_s": meta["breakdown_s"],
        "components": meta["components"], "counts": meta["counts"],
        # What the end of the run did about peaks (the peak check's seconds, rows re-calibrated on their shapes).
        "peak_check": _peak_check(meta["device"]), "warnings": meta.get("warnings") or [],
        "first_blocks": first_blocks, "step_warm_up_s": {m: ((meta.get("step") or {}).get(m) or {}).get("warm_up_s")
                                                         for m in ("train", "eval")},
    }


def _first_blocks(folder: Path) -> dict:
    """The sceptic's check on warm-up: per component and phase with at least 3 blocks, its first block against the
    median of the rest (a cold first block is slower), for twins (no counting or peak pass) and counted components."""
    import polars as pl

    samples = pl.read_parquet(folder / "samples.parquet").filter(pl.col("arm") == "run").sort("pair")
    rows = pl.read_parquet(folder / "components.parquet").select("path", "phase", "notes").to_dicts()
    twin = {(r["path"], r["phase"]) for r in rows if any("counted on its twin" in n for n in r["notes"] or [])}
    out: dict = {"twins": [], "counted": []}
    for (path, phase), group in samples.group_by(["path", "phase"]):
        secs = group["seconds_per_call"].to_list()
        if len(secs) >= 3:
            out["twins" if (path, phase) in twin else "counted"].append(secs[0] / statistics.median(secs[1:]))
    return {k: {"n": len(v), "first_over_5pct": sum(r > 1.05 for r in v), "median_ratio": statistics.median(v) if v else None,
                "worst": max(v) if v else None}
            for k, v in out.items()}


def _peak_check(device: dict) -> dict:
    cal = device.get("calibration") or {}
    shapes = cal.get("component_shapes") or {}
    return {"check_s": cal.get("check_s"), "components_recalibrated": len(shapes.get("components") or []),
            "peak_source": device.get("peak_source")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--extra", default="", help="extra `cbsite collect` arguments, e.g. '--budget 0.05'")
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", default=None, help="folder to keep each case's run in (KEEP/CASE), for benchmarks/row_medians.py")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {_load():.2f} at start",
          flush=True)
    results = {}
    for name in args.cases.split(","):
        provider, options = CASES[name]
        load0 = _load()
        plain = plain_step(provider, options)
        got = collection(provider, options, args.extra.split(), Path(args.keep) / name if args.keep else None)
        results[name] = {"plain": plain, "collection": got, "load": [load0, _load()]}
        print(json.dumps({name: results[name]}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    gib = 2**30
    print(f"\n{'case':14s} {'plain GiB':>9s} {'coll GiB':>9s} {'ratio':>6s} {'step s':>7s} {'wall s':>7s} {'timed s':>8s} "
          f"{'wall/timed':>10s} {'setup':>6s} {'capture':>8s} {'count':>6s} {'peaks':>6s} {'graphs':>6s} {'warm':>5s} {'sizing':>6s} "
          f"{'other':>7s} {'waits':>6s} {'keep':>5s} "
          f"{'calib':>6s} {'hier s':>7s} {'process s':>9s} {'load':>9s}")
    for name, r in results.items():
        p, c = r["plain"], r["collection"]
        if "error" in c or "error" in p:
            print(f"{name:14s} {c.get('error') or p.get('error')}")
            continue
        timed = c["timed_s"] + c["step_timed_s"] + c.get("remeasure_timed_s", 0.0)
        b = c["breakdown_s"]
        print(f"{name:14s} {p['peak_bytes'] / gib:9.2f} {c['peak_bytes'] / gib:9.2f} {c['peak_bytes'] / p['peak_bytes']:6.2f} "
              f"{p['step_s']:7.2f} {c['wall_s']:7.1f} {timed:8.1f} {c['wall_s'] / timed:10.2f} "
              f"{b.get('setup_and_capture', 0):6.1f} {b.get('components_capture', 0):8.1f} {b.get('components_counting', 0):6.1f} "
              f"{b.get('components_memory_peaks', 0):6.1f} {b.get('components_backward_graphs', 0):6.1f} "
              f"{b.get('components_warm_up', 0):5.1f} {b.get('components_block_sizing', 0):6.1f} "
              f"{b.get('components_other', 0):7.1f} {b.get('components_quiet_waits', 0):6.1f} "
              f"{b.get('preserve_model', 0):5.1f} "
              f"{b.get('calibration_start', 0) + b.get('calibration_end_and_peak_checks', 0):6.1f} "
              f"{b.get('hierarchy_remeasure', 0):7.1f} {c['process_wall_s']:9.1f} "
              f"{r['load'][0]:4.1f}-{r['load'][1]:4.1f}")
    print(f"load {_load():.2f} at the end")


if __name__ == "__main__":
    main()
