"""The regressions index: every judged latency regression in the archive, newest first, one page.

A diff's components judged "regressed" (latencydata: on a comparison record of a `cbsite compare` session, else
on both runs' rounds) are listed with their ratio, interval and per-forward milliseconds; a diff without evidence
is counted as not judged and lists nothing, since a difference of two single measurements is no verdict.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from cbsite.diff import rundiff as cdiff
from cbsite.diff.record import display_path
from cbsite.generator.latencydata import Judged


def diff_regressions(judged: Judged, rd: cdiff.RunDiff, model: str) -> list[dict[str, Any]]:
    """One diff's regressed components (the diff job's part of the index), largest ratio first."""
    if not judged.judged:
        return []
    deltas = {(c.path, c.phase): c for c in rd.components}
    rows = []
    for (path, phase), v in judged.verdicts.items():
        if v.verdict != "regressed" or phase not in rd.phases:
            continue
        c = deltas.get((path, phase))
        rows.append({"path": path, "label": display_path(path, model), "phase": phase, "ratio": v.ratio,
                     "ci_low": v.ci_low, "ci_high": v.ci_high,
                     "base_ms": c.base.get("latency_ms") if c is not None else None,
                     "head_ms": c.head.get("latency_ms") if c is not None else None})
    rows.sort(key=lambda r: (-(r["ratio"] if isinstance(r["ratio"], float) and math.isfinite(r["ratio"]) else 0.0),
                             r["phase"], r["path"]))
    return rows


def index(entries: Iterable[Any]) -> dict[str, Any]:
    """The page's context from the build's diff entries (build._DiffEntry): per judged diff with a regression, its
    rows, newest head run first; and how many diffs were judged, not judged, or could not be computed."""
    groups, judged, unjudged, failed = [], 0, 0, 0
    for e in entries:
        if e.error:
            failed += 1
            continue
        if e.context.get("latency", {}).get("kind", "none") == "none":
            unjudged += 1
            continue
        judged += 1
        rows = e.context.get("regressions") or []
        if rows:
            groups.append({"entry": e, "rows": rows, "source": e.context["latency"].get("describe")})
    groups.sort(key=lambda g: (g["entry"].head.run_id, g["entry"].base.run_id, g["entry"].url), reverse=True)
    return {"groups": groups, "judged": judged, "unjudged": unjudged, "failed": failed,
            "count": sum(len(g["rows"]) for g in groups)}
