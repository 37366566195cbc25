"""Do a collection's medians depend on how it warmed up? Two checks on kept runs (`collect_scale.py --keep DIR`).

A change to how the collector times (fewer untimed calls before the first block, say) must not move the medians
it reports; comparing wall times says nothing about that.

1. **In the run** (every folder given): for every row with at least five timed blocks and a median of 5 ms or more
   (one call per block), its median over all blocks against its median without the first block. A cold first block
   that moved the median shows here, whatever the machine's speed did between runs. Printed per case: rows, the
   median, mean, 90th percentile and largest of that ratio.
2. **Between runs** (the second folder onwards, against the first): every (component, phase) measured in both, the
   ratio of its median latency, per case and phase: rows, the median ratio and its quartiles, rows that moved more
   than 5 % either way; long rows (5 ms or more) and twins (counted on an identical component) apart. Read it
   against an A/A of the same session: on a shared virtual machine whole runs move together (the drift warnings of
   the calibration say by how much), and then this check says little.

    PYTHONPATH=. .venv/bin/python benchmarks/row_medians.py A1 B1 A2 B2

Nothing here asserts.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

LONG_MS = 5.0  # a statement this long fills a block at the default budget: one call per block


def _rows(folder: Path) -> dict[tuple[str, str], tuple[float, bool]]:
    import polars as pl

    frame = pl.read_parquet(folder / "components.parquet").filter(pl.col("status") == "measured")
    out = {}
    for r in frame.select("path", "phase", "latency_ms", "notes").to_dicts():
        if r["latency_ms"]:
            twin = any("counted on its twin" in n for n in r["notes"] or [])
            out[(r["path"], r["phase"])] = (r["latency_ms"], twin)
    return out


def _line(label: str, ratios: list[float]) -> str:
    if not ratios:
        return f"  {label:28s} {0:5d}"
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) >= 2 else [ratios[0]] * 3
    up = sum(r > 1.05 for r in ratios)
    down = sum(r < 1 / 1.05 for r in ratios)
    return (f"  {label:28s} {len(ratios):5d} {statistics.median(ratios):8.4f} {q[0]:8.4f} {q[2]:8.4f} "
            f"{up:7d} {down:7d}")


def _first_block_effect(folder: Path) -> list[float]:
    """Per long row with five blocks or more: median of its uncontended blocks / the same without the first block."""
    import polars as pl

    samples = pl.read_parquet(folder / "samples.parquet").filter((pl.col("arm") == "run") & ~pl.col("contended"))
    ratios = []
    for _, group in samples.sort("pair").group_by(["path", "phase"]):
        secs = group["seconds_per_call"].to_list()
        if len(secs) >= 5 and statistics.median(secs) * 1e3 >= LONG_MS:
            ratios.append(statistics.median(secs) / statistics.median(secs[1:]))
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", help="folders of kept runs (collect_scale.py --keep), one subfolder per case")
    args = ap.parse_args()
    folders = [Path(f) for f in args.folders]
    print("1. median of all blocks / median without the first, rows with 5+ blocks of 5 ms or more")
    print(f"  {'folder, case':40s} {'rows':>5s} {'median':>8s} {'mean':>8s} {'p90':>8s} {'max':>8s}")
    for folder in folders:
        for case in sorted(p for p in folder.iterdir() if (p / "samples.parquet").exists()):
            r = _first_block_effect(case)
            if len(r) >= 2:
                print(f"  {folder.name + ' ' + case.name:40s} {len(r):5d} {statistics.median(r):8.4f} "
                      f"{statistics.mean(r):8.4f} {statistics.quantiles(r, n=10)[-1]:8.4f} {max(r):8.4f}")
    first = folders[0]
    for second in folders[1:]:
        cases = sorted(p.name for p in first.iterdir() if (p / "components.parquet").exists()
                       and (second / p.name / "components.parquet").exists())
        print(f"2. median latency per row, {second.name} / {first.name}")
        print(f"  {'case, phase, rows':28s} {'rows':>5s} {'median':>8s} {'p25':>8s} {'p75':>8s} {'>+5%':>7s} {'<-5%':>7s}")
        for case in cases:
            a, b = _rows(first / case), _rows(second / case)
            both = sorted(set(a) & set(b))
            for phase in sorted({k[1] for k in both}):
                keys = [k for k in both if k[1] == phase]
                ratio = {k: b[k][0] / a[k][0] for k in keys}
                long = [k for k in keys if a[k][0] >= LONG_MS]
                print(_line(f"{case} {phase} all", list(ratio.values())))
                print(_line(f"{case} {phase} long twins", [ratio[k] for k in long if a[k][1]]))
                print(_line(f"{case} {phase} long others", [ratio[k] for k in long if not a[k][1]]))


if __name__ == "__main__":
    main()
