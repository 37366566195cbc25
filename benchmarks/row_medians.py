"""Do two collections agree, row by row? The per-row latency ratios of two runs of the same cases.

A change to how the collector times (fewer untimed calls before the first block, say) must not move the medians
it reports. Comparing wall times says nothing about that; comparing every row's median latency does. Run the
same cases twice with each version, keeping the runs (`collect_scale.py --keep DIR`), then compare:

    PYTHONPATH=. .venv/bin/python benchmarks/row_medians.py A1 A2     # A/A: how far one version moves by itself
    PYTHONPATH=. .venv/bin/python benchmarks/row_medians.py A1 B1     # A/B: the change, to be read against A/A

For every case folder present in both, and every (component, phase) measured in both, it takes the ratio of the
second run's median latency to the first's, and prints per case and phase: the rows, the median ratio and its
quartiles, and how many rows moved more than 5 % either way. It prints the long rows (a statement of 5 ms or more,
one call per timed block) apart, and the twins (rows counted on an identical component) apart from the rest.
Nothing here asserts: the figures are read against an A/A of the same session.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first", help="a folder of kept runs (collect_scale.py --keep), one subfolder per case")
    ap.add_argument("second", help="the same cases, the other run")
    args = ap.parse_args()
    first, second = Path(args.first), Path(args.second)
    cases = sorted(p.name for p in first.iterdir() if (p / "components.parquet").exists()
                   and (second / p.name / "components.parquet").exists())
    print(f"second / first median latency per row: {second} / {first}")
    print(f"  {'case, phase, rows':28s} {'rows':>5s} {'median':>8s} {'p25':>8s} {'p75':>8s} {'>+5%':>7s} {'<-5%':>7s}")
    for case in cases:
        a, b = _rows(first / case), _rows(second / case)
        both = sorted(set(a) & set(b))
        for phase in sorted({k[1] for k in both}):
            keys = [k for k in both if k[1] == phase]
            ratio = {k: b[k][0] / a[k][0] for k in keys}
            long = [k for k in keys if a[k][0] >= LONG_MS]
            print(_line(f"{case} {phase} all", list(ratio.values())))
            print(_line(f"{case} {phase} long", [ratio[k] for k in long]))
            print(_line(f"{case} {phase} long twins", [ratio[k] for k in long if a[k][1]]))
            print(_line(f"{case} {phase} long others", [ratio[k] for k in long if not a[k][1]]))


if __name__ == "__main__":
    main()
