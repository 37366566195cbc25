"""What lockstep costs, and how two ranks on one machine disturb each other, for a sharded DLRM on CPU.

1. **Lockstep cost.** A 2-rank collection (torchrun, gloo) of `dlrm -o sharding=...`: per rank, the wall
   seconds of the lockstep stage against the seconds inside its timed blocks, and the seconds spent in
   the agreement collectives themselves (broadcasts of rank 0's decisions, schedule hashes, barriers), from
   run.json's `distributed.ranks`.
2. **Neighbour disturbance.** The compute components both runs share (dense, interaction and over arch:
   identical shapes, rank 0's batches) measured (a) by one process alone, unsharded, and (b) by each of the
   two ranks while the other rank measures its own components on the same machine, for 1 and 2 intra-op
   threads per rank: the latency ratio (b)/(a) per component and the share of blocks that waited for a CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/distributed.py        # about 4 minutes on 2 loaded cores

The machine's load is printed before and after: on a shared machine these figures measure the neighbours too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import polars as pl  # noqa: E402

from cbsite import archive  # noqa: E402

SHARED = ("dense_arch", "inter_arch", "over_arch")


def _common(args: argparse.Namespace, threads: int, runs: Path, version: str) -> list[str]:
    return ["dlrm", "-o", f"size={args.size}", "--budget", str(args.budget), "--max-depth", "2", "--no-progress",
            "--no-step", "--peak-flops", "1e11", "--peak-bandwidth", "1e10", "--threads", str(threads),
            "--runs", str(runs), "--model", "bench", "--version", version]


def _sharded(args: argparse.Namespace, threads: int, runs: Path) -> archive.Run:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "cbsite", "collect",
           *_common(args, threads, runs, f"sharded-t{threads}"), "-o", f"sharding={args.sharding}", "--distributed"]
    _run(cmd)
    return archive.read_run(archive.resolve_run(f"bench@sharded-t{threads}", runs).path)


def _single(args: argparse.Namespace, threads: int, runs: Path) -> archive.Run:
    _run([sys.executable, "-m", "cbsite", "collect", *_common(args, threads, runs, f"single-t{threads}")])
    return archive.read_run(archive.resolve_run(f"bench@single-t{threads}", runs).path)


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{done.stderr[-3000:]}")


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) {five:.2f} (5 min) on {os.cpu_count()} cores"


def _contended(run: archive.Run, paths: tuple[str, ...], rank: int | None = None) -> float:
    """Share of the timed blocks behind `paths` that waited for a CPU (samples of the merged run's rows)."""
    if run.samples is None:
        return float("nan")
    s = run.samples.filter(pl.col("path").is_in(list(paths)))
    return float(s["contended"].mean()) if s.height else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--sharding", default="row_wise")
    ap.add_argument("--budget", type=float, default=0.05)
    ap.add_argument("--threads", default="1,2", help="intra-op threads per rank to compare")
    args = ap.parse_args()
    print(f"before: {_load()}")
    started = time.time()
    with tempfile.TemporaryDirectory() as folder:
        runs = Path(folder)
        for threads in [int(t) for t in args.threads.split(",")]:
            sharded, single = _sharded(args, threads, runs), _single(args, threads, runs)
            print(f"\n== {threads} intra-op thread(s) per rank, dlrm size={args.size}, sharding={args.sharding}, "
                  f"budget {args.budget} s ==")
            print("lockstep cost per rank: wall s | in timed blocks s | agreement collectives s | wall / timed")
            for rec in sharded.meta["distributed"]["ranks"]:
                wall, timed = rec["lockstep_wall_s"], rec["lockstep_timed_s"]
                print(f"  rank {rec['rank']}: {wall:7.2f} | {timed:7.2f} | {rec['lockstep_agreement_s']:7.2f} | "
                      f"x{wall / max(timed, 1e-9):.1f}   (whole rank: {rec['wall_s']:.1f} s)")
            print("neighbour disturbance (forward, backward): sharded rank latency / single process latency")
            ranks = sharded.ranks
            base = {(r["path"], r["phase"]): r["latency_ms"] for r in single.rows.to_dicts()}
            ratios = []
            for path in SHARED:
                for phase in ("forward", "backward"):
                    alone = base.get((path, phase))
                    mine = ranks.filter((pl.col("path") == path) & (pl.col("phase") == phase)).sort("rank")
                    if not alone or mine.is_empty():
                        continue
                    per = [f"rank {r}: x{lat / alone:.2f}" for r, lat in zip(mine["rank"], mine["latency_ms"]) if lat]
                    ratios += [lat / alone for lat in mine["latency_ms"] if lat]
                    print(f"  {path:10s} {phase:8s} alone {alone:8.4f} ms  " + "  ".join(per))
            if ratios:
                print(f"  median ratio x{statistics.median(ratios):.2f}, max x{max(ratios):.2f}; blocks that waited for a "
                      f"CPU: sharded {_contended(sharded, SHARED):.0%}, single {_contended(single, SHARED):.0%}")
            comm = sharded.rows.filter((pl.col("kind") == "communication") & (pl.col("status") == "measured"))
            print(f"  communication rows: {comm.height}, median imbalance x{comm['imbalance'].drop_nulls().median() or 0:.2f}")
    print(f"\nafter: {_load()}; {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
