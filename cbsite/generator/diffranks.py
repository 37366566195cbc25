"""A sharded diff's own changes that would mix ranks, and each rank's own change in their place.

In a sharded run's components.parquet each row is its own slowest rank (rankdata.py), so a component's own share,
its time minus its children's, can subtract rows of different ranks: the children, each on its slowest rank, may
add up past their parent on another, leaving the parent an own time that no rank has. An own share is believed
where some rank's own rows (ranks.parquet) give the same number; a diff of two such shares is shown. Elsewhere the
diff page shows no own change for the component but each rank's: that rank's own share in head minus in base.
Only metrics whose values differ between ranks can mix them, so a component's FLOPs may be believed where its
latency is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbsite.archive import Run
from cbsite.diff import rundiff as cdiff
from cbsite.diff.record import ADDITIVE_METRICS, DIFF_METRICS
from cbsite.diff.sides import Side, sides

METRICS = tuple(m for m in DIFF_METRICS if m in ADDITIVE_METRICS)  # own = total - children's (cbsite/diff/rundiff.py)
TOLERANCE = 1e-9  # relative: the same rows give the same sums; anything further is another rank's number


@dataclass(frozen=True)
class MixedOwn:
    """One component's own changes that mix ranks: the metrics, and per metric each rank's own change (None where
    that rank's own share is unknown on a side; ranks present on one side only are left out)."""

    metrics: tuple[str, ...]
    per_rank: dict[str, dict[int, float | None]]


class _Ranked:
    """One run's all-ranks phases and each rank's, as the diff reads them (cbsite/diff/sides.py)."""

    def __init__(self, run: Run, label: str) -> None:
        self.all = sides(run.rows, label, run.meta)
        self.ranks: dict[int, dict[str, Side]] = {}
        if run.ranks is not None and run.ranks.height:
            for (rank,), rows in sorted(run.ranks.partition_by("rank", as_dict=True).items()):
                if rank is not None:
                    self.ranks[int(rank)] = sides(rows, label, run.meta)

    def own(self, phase: str, path: str, metric: str, rank: int | None = None) -> float | None:
        side = (self.all if rank is None else self.ranks[rank]).get(phase)
        i = side.index.get(path) if side is not None else None
        return None if side is None or i is None else side.own[metric][i]

    def believed(self, phase: str, path: str, metric: str) -> bool:
        """The all-ranks own share is some rank's own share (or unknown, or the run has no ranks)."""
        value = self.own(phase, path, metric)
        if value is None or not self.ranks:
            return True
        for rank in self.ranks:
            theirs = self.own(phase, path, metric, rank)
            if theirs is not None and abs(value - theirs) <= TOLERANCE * max(abs(value), abs(theirs)):
                return True
        return False


def mixed_owns(rd: cdiff.RunDiff, base: Run, head: Run) -> dict[tuple[str, str], MixedOwn]:
    """(path, phase) -> the own changes of that component that mix ranks; empty unless a side is sharded."""
    if (base.ranks is None or not base.ranks.height) and (head.ranks is None or not head.ranks.height):
        return {}
    ranked = {"base": _Ranked(base, "base"), "head": _Ranked(head, "head")}
    out: dict[tuple[str, str], MixedOwn] = {}
    for c in rd.components:
        at = {"base": c.base_path if c.kind != "added" else None, "head": c.path if c.kind != "removed" else None}
        mixed = tuple(m for m in METRICS if c.self_delta[m] is not None and any(
            path is not None and not ranked[side].believed(c.phase, path, m) for side, path in at.items()))
        if not mixed:
            continue
        both = sorted(set(ranked["base"].ranks) & set(ranked["head"].ranks))
        per_rank: dict[str, dict[int, float | None]] = {}
        for m in mixed:
            per_rank[m] = {}
            for rank in both:
                owns = [0 if path is None else ranked[side].own(c.phase, path, m, rank) for side, path in at.items()]
                per_rank[m][rank] = None if owns[0] is None or owns[1] is None else owns[1] - owns[0]
        out[(c.path, c.phase)] = MixedOwn(mixed, per_rank)
    return out

