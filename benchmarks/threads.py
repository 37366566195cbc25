"""Which intra-op thread count gives honest latencies on a shared machine? 1 vs all cores, measured.

For each thread count, the demo DLRM is collected (a) on the quiet machine with `--rounds 3`, giving the
run-to-run spread beside the within-run spread, and (b) with two busy neighbour processes spinning on
the cores for the whole collection. It prints, per thread count: the within-run spread (IQR / median),
the run-to-run spread (std of the rounds' log medians), the share of blocks that waited for a CPU, and
under the neighbours the latency ratio to the quiet run (median, p90, max), the rows over 3x, and how many
of those were flagged. The README's choice of default comes from this table.

    PYTHONPATH=. .venv/bin/python benchmarks/threads.py          # about 5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbsite.collector import CollectConfig
from cbsite.collector.collect import collect
from cbsite.collector.request import CollectRequest


def _config(threads: int, rounds: int) -> CollectConfig:
    return CollectConfig(min_run_time=0.05, num_threads=threads, rounds=rounds, progress=False, calibrate=False,
                         peak_flops=1e11, peak_bandwidth=1e10, step=False)


def _collect(provider: str, threads: int, rounds: int):
    return collect(CollectRequest(provider=provider, version="threads", config=_config(threads, rounds), batches=3))


def _spin(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass"])


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", default="dlrm")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}")
    ap.add_argument("--neighbours", type=int, default=2)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"load at start {os.getloadavg()[0]:.2f}")
    header = (f"{'threads':>7} {'within-run IQR/med':>18} {'run-to-run':>10} {'contended':>9} | "
              f"{'busy/quiet median':>17} {'p90':>6} {'max':>7} {'rows >3x':>8} {'flagged of those':>16} {'flagged all':>11}")
    lines = []
    for threads in [int(t) for t in args.threads.split(",")]:
        t0 = time.perf_counter()
        quiet = _collect(args.provider, threads, rounds=3)
        rows = [r for r in quiet.rows.iter_rows(named=True) if r["status"] == "measured"]
        iqr = statistics.median((r["latency_p75_ms"] - r["latency_p25_ms"]) / r["latency_ms"] for r in rows)
        spread = quiet.meta["noise"]["round_spread_median"]
        waited = quiet.samples["contended"].mean()
        baseline = {(r["path"], r["phase"]): r["latency_ms"] for r in rows}
        spinners = [_spin(600) for _ in range(args.neighbours)]
        try:
            time.sleep(0.5)
            busy = _collect(args.provider, threads, rounds=1)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        ratios, over, over_flagged, flagged = [], 0, 0, 0
        for r in busy.rows.iter_rows(named=True):
            q = baseline.get((r["path"], r["phase"]))
            if r["status"] != "measured" or not q:
                continue
            ratio = r["latency_ms"] / q
            ratios.append(ratio)
            is_flagged = any("contended" in n for n in (r["notes"] or []))
            flagged += is_flagged
            if ratio > 3:
                over += 1
                over_flagged += is_flagged
        lines.append(f"{threads:>7} {iqr:>18.1%} {spread:>10.1%} {waited:>9.0%} | {statistics.median(ratios):>17.2f} "
                     f"{_quantile(ratios, 0.9):>6.2f} {max(ratios):>7.1f} {over:>8} {over_flagged:>16} {flagged:>11}")
        print(f"threads {threads}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    print(header)
    print("\n".join(lines))
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
