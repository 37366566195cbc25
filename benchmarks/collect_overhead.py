"""What a cbsite collection costs, against the floor no collector can beat and against torch.profiler.

One run on the demo DLRM (`dlrm` provider, default size, 3 batches) measures:

1. cbsite's collector with the default budget (`CollectConfig` defaults, progress off):
   total wall time against `timed_s`, the seconds spent inside `torch.utils.benchmark.Timer`'s timed
   blocks (the floor: any collector that times each component for the budget pays at least that).
   The rest is split by timing cbsite's own functions from the outside (wrappers installed on the
   module globals for the duration of the run; cbsite's code is not changed): CPU calibration
   (in a clean worker at the start, never cached), the peak check (calibration again at the end,
   and on the shapes of any component that beats the peak), capture,
   counting passes (FLOPs, bytes, memory), warm-up, Timer's block-size estimation, the CPU-time loop,
   the rest of each component's measurement (input clones, in-place probe, backward graphs),
   metadata, and what is left (planning, rows, estimates).
2. The alternative a user would reach for: `torch.profiler.profile` (CPU activity) over N forward +
   backward iterations of the whole model, with per-module attribution from `record_function` labels
   pushed by forward pre/post hooks on every module, read back from `key_averages()`.
   The same iterations run without the profiler (and with the labels but no profiler), so the
   profiler's cost per recorded op comes out of the same run.

It prints tables of figures and ratios measured in this run and the machine they came from. It
asserts nothing: timings on a shared machine are data, not pass/fail.

    .venv/bin/python benchmarks/collect_overhead.py [--budget S] [--iterations N] [--threads T] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from cbsite.collector import measure as cb_measure
from cbsite.collector import profiler as cb_profiler
from cbsite.collector.collect import collect
from cbsite.collector.config import CollectConfig
from cbsite.collector.device import cpu_name
from cbsite.collector.pipeline import capture_plan as cb_capture_plan
from cbsite.collector.pipeline import components as cb_components
from cbsite.collector.pipeline import record as cb_record
from cbsite.collector.providers import provide
from cbsite.collector.request import CollectRequest
from cbsite.collector.timing import blocks as cb_blocks

PROVIDER, OPTIONS, BATCHES, SEED = "dlrm", {}, 3, 0
# Components compared between cbsite and the profiler: the root, every arch, and two leaves.
COMPARED = (
    "",
    "sparse_arch",
    "sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0",
    "dense_arch",
    "dense_arch.model._mlp.0._linear",
    "inter_arch",
    "over_arch",
    "over_arch.model.1",
)


# ---------------------------------------------------------------------------------------------
# The machine


def machine() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "torch_threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


# ---------------------------------------------------------------------------------------------
# cbsite's collector, with its time split from the outside


class Stopwatch:
    """Seconds spent inside named functions, accumulated over every call."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - t0)

        return timed


@contextmanager
def instrumented(watch: Stopwatch) -> Iterator[None]:
    """Time cbsite's collector functions by replacing the module globals it calls, then restore them.

    Nothing is added inside Timer's timed blocks: the wrappers sit around whole functions called a
    few hundred times per collection (about a microsecond each).
    """
    patches: list[tuple[Any, str, Any]] = []

    def patch(module: Any, name: str, new: Any) -> None:
        patches.append((module, name, getattr(module, name)))
        setattr(module, name, new)

    def timed(method: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                watch.add("blocked_autorange", time.perf_counter() - t0)

        return wrapper

    # time_fn adds blocks with timeit() when blocked_autorange gave too few for quartiles: both count.
    class TimedTimer(cb_blocks.Timer):  # type: ignore[misc, valid-type]
        blocked_autorange = timed(cb_blocks.Timer.blocked_autorange)
        timeit = timed(cb_blocks.Timer.timeit)

    # time_fn brackets its CPU-time loop with two time.process_time() calls: note when they happen.
    stamps: list[float] = []

    def process_time() -> float:
        stamps.append(time.perf_counter())
        return time.process_time()

    shim = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
    shim.process_time = process_time

    patch(cb_capture_plan, "capture", watch.wrap("capture", cb_capture_plan.capture))
    patch(cb_components, "measure_component", watch.wrap("measure_component", cb_components.measure_component))
    patch(cb_record, "git_state", watch.wrap("metadata", cb_record.git_state))
    patch(cb_record, "package_versions", watch.wrap("metadata", cb_record.package_versions))
    patch(cb_profiler, "describe_device", watch.wrap("describe_device", cb_profiler.describe_device))
    patch(cb_profiler, "check_peaks", watch.wrap("check_peaks", cb_profiler.check_peaks))
    patch(cb_measure, "count", watch.wrap("count", cb_measure.count))
    patch(cb_measure, "time_fn", watch.wrap("time_fn", cb_measure.time_fn))
    patch(cb_blocks, "Timer", TimedTimer)
    patch(cb_blocks, "time", shim)
    try:
        yield
    finally:
        for module, name, old in reversed(patches):
            setattr(module, name, old)
        if len(stamps) % 2 == 0:
            watch.seconds["cpu_time_loop"] = sum(stamps[i + 1] - stamps[i] for i in range(0, len(stamps), 2))
            watch.calls["cpu_time_loop"] = len(stamps) // 2


def run_cbsite(budget: float, threads: int | None) -> dict[str, Any]:
    watch = Stopwatch()
    config = CollectConfig(min_run_time=budget, progress=False, num_threads=threads)
    request = CollectRequest(provider=PROVIDER, options=dict(OPTIONS), batches=BATCHES, seed=SEED, config=config)
    t0 = time.perf_counter()
    with instrumented(watch):
        run = collect(request)
    end_to_end_s = time.perf_counter() - t0
    meta = run.meta
    wall, timed = meta["wall_time_s"], meta["timed_s"]
    s = watch.seconds
    timer_outside = s.get("time_fn", 0.0) - s.get("blocked_autorange", 0.0) - s.get("cpu_time_loop", 0.0)
    split = {
        "timed (inside Timer's blocks: the floor)": timed,
        "Timer block-size estimation": s.get("blocked_autorange", 0.0) - timed,
        "warm-up (time_fn before Timer)": timer_outside,
        "CPU-time loop (time_fn after Timer)": s.get("cpu_time_loop", 0.0),
        "counting passes (FLOPs, bytes, memory)": s.get("count", 0.0),
        "rest of each component (clones, in-place probe, backward graphs)": s.get("measure_component", 0.0)
        - s.get("time_fn", 0.0)
        - s.get("count", 0.0),
        "capture (one hooked forward per batch)": s.get("capture", 0.0),
        "device description (start calibration, clean worker)": s.get("describe_device", 0.0),
        "peak check (end calibration, component shapes)": s.get("check_peaks", 0.0),
        "metadata (git state, package versions)": s.get("metadata", 0.0),
    }
    split["planning, rows, estimates (wall minus the above)"] = wall - sum(split.values())
    table = run.table()
    forward = {
        r["path"]: r
        for r in table.filter(table["phase"] == "forward").select("path", "latency_ms", "latency_p25_ms", "latency_p75_ms", "samples", "call_count", "status").to_dicts()
    }
    backward = {
        r["path"]: r
        for r in table.filter(table["phase"] == "backward").select("path", "latency_ms", "samples", "status").to_dicts()
    }
    return {
        "calibration_s": s.get("describe_device", 0.0) + s.get("check_peaks", 0.0),  # inside the wall
        "wall_time_s": wall,
        "timed_s": timed,
        "end_to_end_s": end_to_end_s,  # collect(): provider build + profile_model + the table
        "split_s": split,
        "calls": watch.calls,
        "counts": meta["counts"],
        "components": len(forward),
        "num_threads": meta["config"]["num_threads"],
        "load_average": meta["device"].get("load_average"),
        "forward": forward,
        "backward": backward,
    }


# ---------------------------------------------------------------------------------------------
# The alternative: torch.profiler with per-module labels


def label(path: str) -> str:
    return f"module: {path or '<root>'}"


def add_labels(model: nn.Module) -> list[Any]:
    """record_function ranges around every module's forward, named by its FQN."""
    handles = []
    for path, module in model.named_modules():
        stack: list[record_function] = []

        def pre(mod: nn.Module, args: Any, name: str = label(path), stack: list = stack) -> None:
            rf = record_function(name)
            rf.__enter__()
            stack.append(rf)

        def post(mod: nn.Module, args: Any, out: Any, stack: list = stack) -> None:
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    return handles


def run_profiler(iterations: int, warmup: int) -> dict[str, Any]:
    provided = provide(PROVIDER, dict(OPTIONS), batches=BATCHES, seed=SEED)  # the model cbsite profiled
    model, batches = provided.model, provided.inputs
    gen = torch.Generator().manual_seed(0)
    grads: list[torch.Tensor] = []

    def step(i: int, times: list[tuple[float, float]] | None = None) -> None:
        batch = batches[i % len(batches)]  # rotate the batches, as cbsite does
        t0 = time.perf_counter()
        out = model(*batch.args, **batch.kwargs)
        t1 = time.perf_counter()
        if len(grads) <= i % len(batches):
            grads.append(torch.randn(out.shape, generator=gen))
        torch.autograd.backward(out, grads[i % len(batches)])
        model.zero_grad(set_to_none=True)
        if times is not None:
            times.append((t1 - t0, time.perf_counter() - t1))

    def loop(n: int) -> list[tuple[float, float]]:
        times: list[tuple[float, float]] = []
        for i in range(n):
            step(i, times)
        return times

    for i in range(warmup):
        step(i)
    plain = loop(iterations)
    handles = add_labels(model)
    try:
        for i in range(warmup):
            step(i)
        labelled = loop(iterations)
        t0 = time.perf_counter()
        prof = profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
        t1 = time.perf_counter()
        profiled = loop(iterations)
        t2 = time.perf_counter()
        prof.__exit__(None, None, None)
        t3 = time.perf_counter()
        averages = prof.key_averages()
        t4 = time.perf_counter()
    finally:
        for h in handles:
            h.remove()
    plain += loop(iterations)  # plain again after, so a change of load shows in the spread

    events = prof.events()
    labels = [e for e in events if e.name.startswith("module: ")]
    aten = [e for e in events if e.name.startswith("aten::")]
    per_module = {}
    for avg in averages:
        if avg.key.startswith("module: "):
            path = avg.key[len("module: "):]
            per_module["" if path == "<root>" else path] = {
                "calls": avg.count,
                "total_ms_per_call": avg.cpu_time_total / avg.count / 1e3,  # mean, µs -> ms
                "self_ms_per_call": avg.self_cpu_time_total / avg.count / 1e3,
            }

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def summary(times: list[tuple[float, float]]) -> dict[str, float]:
        return {
            "forward_ms": med([f for f, _ in times]) * 1e3,
            "backward_ms": med([b for _, b in times]) * 1e3,
            "iteration_ms": med([f + b for f, b in times]) * 1e3,
            "iteration_min_ms": min(f + b for f, b in times) * 1e3,
            "iteration_max_ms": max(f + b for f, b in times) * 1e3,
        }

    return {
        "iterations": iterations,
        "warmup": warmup,
        "plain": summary(plain),
        "labelled": summary(labelled),
        "profiled": summary(profiled),
        "wall_s": {
            "start": t1 - t0,
            "iterations": t2 - t1,
            "stop (event post-processing)": t3 - t2,
            "key_averages (parses the events: lazy in torch)": t4 - t3,
            "total": t4 - t0,
        },
        "events_per_iteration": len(events) / iterations,
        "aten_ops_per_iteration": len(aten) / iterations,
        "labels_per_iteration": len(labels) / iterations,
        "per_module": per_module,
    }


# ---------------------------------------------------------------------------------------------
# Report


def report(result: dict[str, Any]) -> None:
    cb, pr, m0, m1 = result["cbsite"], result["profiler"], result["machine"], result["machine_after"]
    print()
    print(f"machine: {m0['cpu']}, {m0['cores']} cores ({m0['usable_cores']} usable), torch threads {m0['torch_threads']}"
          f" (collector: {cb['num_threads']}), torch {m0['torch']}, python {m0['python']}")
    print(f"load average (1, 5, 15 min): before {m0['load_average']}, after {m1['load_average']}")
    print(f"model: {PROVIDER} default size, {BATCHES} batches rotated; {cb['components']} components, "
          f"{cb['counts']}; budget {result['budget']} s per component and phase")

    print("\n## cbsite collection\n")
    wall, timed, cal = cb["wall_time_s"], cb["timed_s"], cb["calibration_s"]
    print("| part | seconds | share of wall |")
    print("|---|---:|---:|")
    for name, sec in cb["split_s"].items():
        print(f"| {name} | {sec:.2f} | {sec / wall:.0%} |")
    print(f"| **collection wall (run.json wall_time_s, calibrations included)** | **{wall:.2f}** | 100% |")
    print(f"| collection wall without the calibrations | {wall - cal:.2f} | |")
    print(f"| collect() end to end (provider build + collection + table) | {cb['end_to_end_s']:.2f} | |")

    p, lab, q = pr["plain"], pr["labelled"], pr["profiled"]
    it = pr["iterations"]
    print("\n## torch.profiler alternative (CPU activity, per-module record_function labels)\n")
    print("| per fwd+bwd iteration (median) | forward ms | backward ms | iteration ms (min–max) |")
    print("|---|---:|---:|---:|")
    for name, s in (("plain", p), ("labels only (hooks, no profiler)", lab), ("under torch.profiler + labels", q)):
        print(f"| {name} | {s['forward_ms']:.2f} | {s['backward_ms']:.2f} | "
              f"{s['iteration_ms']:.2f} ({s['iteration_min_ms']:.2f}–{s['iteration_max_ms']:.2f}) |")
    w = pr["wall_s"]
    print(f"\nrecorded per iteration: {pr['events_per_iteration']:.0f} events, of which "
          f"{pr['aten_ops_per_iteration']:.0f} aten ops and {pr['labels_per_iteration']:.0f} module labels")
    print(f"profiler wall for {it} iterations: {w['total']:.2f} s (start {w['start']:.2f}, iterations "
          f"{w['iterations']:.2f}, stop/post-processing {w['stop (event post-processing)']:.2f}, "
          f"key_averages, which parses the events {w['key_averages (parses the events: lazy in torch)']:.2f})")

    print("\n## Per-module forward latency, per call (ms)\n")
    print("| component | cbsite median [p25–p75] | profiler total (mean of calls) | profiler self | profiler / cbsite |")
    print("|---|---:|---:|---:|---:|")
    for path in COMPARED:
        c, f = cb["forward"].get(path), pr["per_module"].get(path)
        if not c or c["latency_ms"] is None or not f:
            continue
        print(f"| {path or '<root>'} | {c['latency_ms']:.3f} [{c['latency_p25_ms']:.3f}–{c['latency_p75_ms']:.3f}] | "
              f"{f['total_ms_per_call']:.3f} | {f['self_ms_per_call']:.3f} | {f['total_ms_per_call'] / c['latency_ms']:.2f}× |")

    print("\n## Ratios measured in this run\n")
    extra_ms = q["iteration_ms"] - p["iteration_ms"]
    prof_only_ms = q["iteration_ms"] - lab["iteration_ms"]
    root_bwd = cb["backward"].get("", {}).get("latency_ms")
    rows = [
        ("collection wall / timed floor", f"{wall / timed:.2f}×" if timed else "n/a"),
        ("collection wall without the calibrations / timed floor", f"{(wall - cal) / timed:.2f}×" if timed else "n/a"),
        ("timed floor / collection wall", f"{timed / wall:.0%}"),
        ("profiler fwd+bwd per iteration / plain", f"{q['iteration_ms'] / p['iteration_ms']:.2f}×"),
        ("labels only fwd+bwd per iteration / plain", f"{lab['iteration_ms'] / p['iteration_ms']:.2f}×"),
        ("profiler + labels overhead per recorded event", f"{extra_ms * 1e3 / pr['events_per_iteration']:.1f} µs"),
        ("profiler + labels overhead per aten op", f"{extra_ms * 1e3 / pr['aten_ops_per_iteration']:.1f} µs"),
        ("profiler alone (vs labels only) per recorded event", f"{prof_only_ms * 1e3 / pr['events_per_iteration']:.1f} µs"),
        (f"collection wall / profiler wall ({it} iterations)", f"{wall / w['total']:.1f}×"),
        ("cbsite root forward / plain forward", f"{cb['forward'][''].get('latency_ms', float('nan')) / p['forward_ms']:.2f}×"),
        ("cbsite root backward / plain backward", f"{root_bwd / p['backward_ms']:.2f}×" if root_bwd else "n/a"),
    ]
    print("| figure | value |")
    print("|---|---:|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=CollectConfig().min_run_time,
                        help="timed seconds per component and phase (CollectConfig.min_run_time; default %(default)s)")
    parser.add_argument("--iterations", type=int, default=20,
                        help="forward+backward iterations of the whole model, per variant (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations before each variant (default %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both (default: torch's default, as the collector uses)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.budget <= 0 or args.iterations < 1 or args.warmup < 0:
        parser.error("--budget must be positive, --iterations at least 1, --warmup not negative")
    if args.threads:
        torch.set_num_threads(args.threads)

    result: dict[str, Any] = {"budget": args.budget, "threads": args.threads, "command": " ".join(sys.argv)}
    result["machine"] = machine()
    # Build the model once before timing anything: the first build imports torchrec (seconds).
    provide(PROVIDER, dict(OPTIONS), batches=1, seed=SEED)
    result["cbsite"] = run_cbsite(args.budget, args.threads)
    result["profiler"] = run_profiler(args.iterations, args.warmup)
    result["machine_after"] = machine()
    report(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
