"""How far can a latency verdict be trusted? False alarms and detection on the demo DLRM, measured.

Arms: A (the demo DLRM), A' (an identical copy) and A+ (real extra matmul work planted in one named
Linear, forward and backward: benchmarks/planted.py). The slowdown A+ causes in every component is
measured here (over all processes) and printed, not assumed.

1. interleaved: N worker processes (default 12) each load the three arms and time every component and
   phase in random A/A'/A+ block triples (the session's worker and scheduler, unchanged); the unit is the
   per-process median log ratio.
2. abba: N processes per comparison, one arm each, in A B B A order (A vs A', then A vs A+); the unit is
   a neighbour pair of processes.

Then many random subsets of `--subset` processes (default 6, what `cbsite compare` uses) are judged
with cbsite.stats at the default gate (alpha 1 %, 5 % floor): the false-alarm rate is the share of
(component, phase, subset) comparisons of A vs A' called regressed; the detection rate the share of A vs
A+ comparisons called regressed, over the components whose measured slowdown is at least
`--effect-min` (default 8 %) and whose latency is at least 50 us. It prints the spread of the paired log
ratio per component, both rates for both layouts, the wall time of each session, and the load.

    PYTHONPATH=. .venv/bin/python benchmarks/noise.py            # about 10-15 minutes on 2 quiet cores
    PYTHONPATH=. .venv/bin/python benchmarks/noise.py --quick    # 4 processes, 6 subsets: a smoke run
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl

from cbsite import stats
from cbsite.collector import CollectConfig
from cbsite.collector.collect import collect
from cbsite.collector.request import CollectRequest
from cbsite.collector.session.scheduler import plan_jobs, run_jobs
from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task
from cbsite.diff.comparison import paired_units

PROVIDER = "benchmarks.planted:dlrm"


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def _request(extra: float, component: str, threads: int) -> CollectRequest:
    cfg = CollectConfig(min_run_time=0.02, warmup=2, progress=False, num_threads=threads, calibrate=False,
                        peak_flops=1e11, peak_bandwidth=1e10)
    options = {"extra": extra, "component": component}
    return CollectRequest(provider=PROVIDER, options=options, model_name="dlrm-planted", version="a", batches=1,
                          config=cfg)


def _units(samples: pl.DataFrame, layout: str, base: str, head: str) -> dict[tuple[str, str], list[float]]:
    """Units of the base/head comparison inside a session's samples (other arms left out)."""
    two = samples.filter(pl.col("arm").is_in([base, head])).with_columns(
        pl.when(pl.col("arm") == base).then(pl.lit("base")).otherwise(pl.lit("head")).alias("arm"))
    return paired_units(two, layout)


def _session(arms: list[ArmSpec], tasks: list[Task], processes: int, layout: str, threads: int, seed: int) -> tuple[pl.DataFrame, float]:
    template = ProcessJob(session_id=f"noise-{layout}-{seed}", process=0, arms=(), tasks=(), threads=threads,
                          pairs=8, block_s=0.01, warmup=2, seed=seed, max_task_s=20.0)
    jobs = plan_jobs(template.session_id, arms, tasks, processes, layout, template)
    started = time.perf_counter()
    session = run_jobs(jobs, layout, on_done=lambda d, t, e: print(f"  process {d}/{t} done at {e:.0f} s (load {_load()})", flush=True))
    if session.died:
        print(f"  died: {session.died}")
    frame = pl.DataFrame(session.samples)
    return frame, time.perf_counter() - started


def _rates(units: dict[tuple[str, str], list[float]], keys: list[tuple[str, str]], size: int, subsets: int,
           rng: random.Random) -> tuple[float, dict[tuple[str, str], float]]:
    """Share of (key, subset) judged regressed at the default gate, overall and per key."""
    per_key: dict[tuple[str, str], float] = {}
    total = called = 0
    for key in keys:
        u = [x for x in units.get(key, []) if x is not None and math.isfinite(x)]
        if len(u) < size:
            continue
        combos = list(itertools.combinations(range(len(u)), size))
        chosen = combos if len(combos) <= subsets else rng.sample(combos, subsets)
        verdicts = stats.paired_many([[u[i] for i in c] for c in chosen])
        hits = sum(v.verdict == "regressed" for v in verdicts)
        per_key[key] = hits / len(chosen)
        total += len(chosen)
        called += hits
    return (called / total if total else float("nan")), per_key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--subset", type=int, default=6, help="processes per simulated compare session")
    ap.add_argument("--subsets", type=int, default=200, help="random subsets judged per component")
    ap.add_argument("--extra", type=float, default=0.5, help="extra output rows planted, as a fraction")
    ap.add_argument("--component", default="over_arch.model.0._mlp.0._linear")
    ap.add_argument("--effect-min", type=float, default=0.08)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layouts", default="interleaved,abba")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.processes, args.subset, args.subsets = 4, 3, 6
    rng = random.Random(0)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; load at start {_load()}")
    t0 = time.perf_counter()
    reference = collect(_request(0.0, args.component, args.threads))  # which components are measured
    print(f"reference collection of the demo DLRM: {time.perf_counter() - t0:.1f} s")
    latency = {(r["path"], r["phase"]): r["latency_ms"] for r in reference.rows.iter_rows(named=True)
               if r["status"] == "measured"}
    tasks = [Task(key=p, phase=ph, paths=(("A", p), ("A2", p), ("Aplus", p))) for (p, ph) in latency]
    arms = {name: ArmSpec(arm=name, request=_request(extra, args.component, args.threads))
            for name, extra in (("A", 0.0), ("A2", 0.0), ("Aplus", args.extra))}
    print(f"{len(tasks)} component phases; arms A, A' (identical copy), A+ ({args.extra:.0%} extra rows in {args.component})")

    results = {}
    for layout in args.layouts.split(","):
        if layout == "interleaved":
            print(f"interleaved: {args.processes} processes with the three arms ...", flush=True)
            samples, wall = _session(list(arms.values()), tasks, args.processes, "interleaved", args.threads, 1)
            aa, ab = _units(samples, "interleaved", "A", "A2"), _units(samples, "interleaved", "A", "Aplus")
            per_session = wall / args.processes * args.subset
        else:
            print(f"abba: {args.processes} processes for A vs A', {args.processes} for A vs A+ ...", flush=True)
            two = lambda a, b: [t.__class__(t.key, t.phase, ((a, t.key), (b, t.key))) for t in tasks]  # noqa: E731
            s1, w1 = _session([arms["A"], arms["A2"]], two("A", "A2"), args.processes, "abba", args.threads, 2)
            s2, w2 = _session([arms["A"], arms["Aplus"]], two("A", "Aplus"), args.processes, "abba", args.threads, 3)
            aa, ab = _units(s1, "abba", "A", "A2"), _units(s2, "abba", "A", "Aplus")
            wall = w1 + w2
            per_session = w1 / args.processes * args.subset
        results[layout] = (aa, ab, wall, per_session)

    for layout, (aa, ab, wall, per_session) in results.items():
        size = args.subset if layout == "interleaved" else args.subset // 2
        effect = {k: math.exp(statistics.fmean(v)) - 1 for k, v in ab.items() if v and all(math.isfinite(x) for x in v)}
        spread = {k: statistics.stdev(v) for k, v in aa.items() if len(v) >= 2 and all(math.isfinite(x) for x in v)}
        targets = [k for k, e in effect.items() if e >= args.effect_min and latency.get(k, 0) >= 0.05]
        small_targets = [k for k, e in effect.items() if e >= args.effect_min and latency.get(k, 0) < 0.05]
        fa, _ = _rates(aa, list(aa), size, args.subsets, rng)
        det, det_per = _rates(ab, targets, size, args.subsets, rng)
        det_small, det_small_per = _rates(ab, small_targets, size, args.subsets, rng)
        print(f"\n== {layout}: {len(next(iter(aa.values()), []))} units, subsets of {size} unit(s) "
              f"({args.subset} processes); session {wall:.0f} s, a {args.subset}-process compare session ~{per_session:.0f} s of workers")
        print(f"{'component':62s} {'phase':8s} {'ms':>8s} {'A/A spread':>10s} {'A+ effect':>9s} {'detected':>8s}")
        for key in sorted(latency, key=lambda k: (-effect.get(k, 0), k)):
            if key not in spread:
                continue
            hit = det_per.get(key, det_small_per.get(key))
            print(f"{key[0] or '<root>':62s} {key[1]:8s} {latency[key]:8.4f} {spread[key]:10.2%} "
                  f"{effect.get(key, float('nan')):+9.1%} {'' if hit is None else f'{hit:8.0%}'}")
        spreads = sorted(spread.values())
        print(f"A/A spread of the paired log ratio: median {statistics.median(spreads):.2%}, "
              f"p90 {spreads[int(0.9 * (len(spreads) - 1))]:.2%}, max {spreads[-1]:.2%}")
        print(f"false alarms (A vs A', regressed at alpha 1 %, floor 5 %): {fa:.2%} of component comparisons")
        print(f"detection (A vs A+, components >= 50 us with a measured slowdown >= {args.effect_min:.0%}, "
              f"{len(targets)} of them): {det:.1%}")
        if small_targets:
            print(f"detection on slowed components under 50 us ({len(small_targets)}): {det_small:.1%}")
    print(f"\nload at the end {_load()}; total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
