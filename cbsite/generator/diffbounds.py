"""What bounds each component of a diff, on each side: the diff page's answer to "compute- or memory-bound?".

The labels are the run pages' (rundata.site_bounds over cbsite/bound.py): compute, memory or overhead from the
roofline, "suspect" for a row beyond a peak, and "communication" for a sharded run's communicating rows, never a
roofline bound. They are read from the same rounded values the run page reads, so the two pages agree. The page
shows the newer side's label, and "memory → compute" where the label changed.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from cbsite.archive import Run
from cbsite.diff.record import ComponentDelta
from cbsite.generator.rundata import compact_column, site_bounds

# The columns rundata.site_bounds reads (`kind` only in sharded runs).
BOUND_COLUMNS = ("mfu", "bandwidth_util", "latency_ms", "device_time_ms")
ARROW = " \u2192 "


def run_bounds(run: Run, phase: str) -> dict[str, str | None]:
    """path -> the bound of `run`'s row in `phase`, as its run page labels it (a path's last row wins, as there)."""
    rows = run.rows.filter(pl.col("phase") == phase).sort("order")
    cols: dict[str, list[Any]] = {
        c: compact_column(rows.get_column(c).to_list()) if c in rows.columns else [None] * rows.height
        for c in BOUND_COLUMNS}
    if "kind" in rows.columns:
        cols["kind"] = rows.get_column("kind").to_list()
    return dict(zip(rows.get_column("path").to_list(), site_bounds(cols)))


class DiffBounds:
    """Both sides' bounds of a diff's components, per phase, read once per side and phase."""

    def __init__(self, base: Run | None, head: Run | None) -> None:
        self.runs = {"base": base, "head": head}
        self._read: dict[tuple[str, str], dict[str, str | None]] = {}

    def side(self, side: str, phase: str) -> dict[str, str | None]:
        run = self.runs[side]
        if run is None:
            return {}
        if (side, phase) not in self._read:
            self._read[(side, phase)] = run_bounds(run, phase)
        return self._read[(side, phase)]

    def know(self, side: str, phase: str, bounds: dict[str, str | None]) -> None:
        """Take one side's bounds of `phase` from a caller that has them already (the diff's head columns)."""
        self._read[(side, phase)] = bounds

    def of(self, c: ComponentDelta) -> tuple[str | None, str | None]:
        """(base, head) bound of one component; None on a side where it is absent or has no label."""
        base = self.side("base", c.phase).get(c.base_path) if c.base_path is not None and c.kind != "added" else None
        head = self.side("head", c.phase).get(c.path) if c.kind != "removed" else None
        return base, head

    def row(self, c: ComponentDelta) -> dict[str, Any]:
        """What a listed component shows: `bound` (the newer side's, the older's for a removed component), `bound_was`
        (the older side's where it differs) and `bound_text` ("memory", "memory \u2192 compute")."""
        base, head = self.of(c)
        shown = head if c.kind != "removed" else base
        was = base if c.kind not in ("added", "removed") and base is not None and base != head else None
        return {"bound": shown, "bound_was": was, "bound_text": change_text(was, shown)}


def change_text(was: str | None, now: str | None) -> str | None:
    """"memory \u2192 compute" where the label changed, the label alone where not, None where there is none."""
    if was is not None:
        return was + ARROW + (now or "no label")
    return now
