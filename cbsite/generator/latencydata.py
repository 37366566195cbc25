"""Latency verdicts for a diff page: how latency was judged, the session's noise, and a verdict per component.

The evidence is `cbsite.diff.comparison`'s (the rules are there and in `cbsite.stats`): a comparison record of a
paired `cbsite compare` session, else both runs' rounds (`--rounds N`), else none: latency is then *not
judged*. This module only turns that evidence into what the page and its data file show:

* `latency_context`: the page's section (how it was judged, verdict counts, median noise and smallest
  detectable change per phase and over all, the components a reader should look at: regressed, improved,
  inconclusive, largest changes first, as the PR comment lists them), and the root's verdict per phase
  for the totals table;
* `latency_columns`: per phase, columns aligned with the diff's components for the table, the icicle
  and its tooltip (verdict, ratio, 95 % interval, units, spread, detectable, needed, reason);
* `latency_changed`: whether a component's latency counts as a change on the page: a verdict of
  regressed or improved (or a component present on one side only); unchanged, inconclusive and untimed
  components are never drawn as a change. Without evidence the diff's within-run IQR rule stays, and the
  page says the latency is not judged.

A comparison record is judged with its own level and floor (`alpha`, `floor` in comparison.json), so the
page agrees with what `cbsite compare` printed; rounds use the defaults of `cbsite.stats`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Mapping

from cbsite import gate, stats
from cbsite.archive import Run
from cbsite.diff import comparison
from cbsite.diff import rundiff as cdiff
from cbsite.diff.record import ComponentDelta, display_path

LISTED = ("regressed", "improved", "inconclusive")  # what a reader acts on; unchanged ones are counted
MAX_LISTED = 40


class Judged:
    """Evidence for one diff and the verdicts made from it (None when latency is not judged)."""

    def __init__(self, evidence: comparison.LatencyEvidence | None, record: Mapping[str, Any] | None) -> None:
        self.evidence = evidence
        self.record = record if evidence is not None and evidence.paired else None
        # A comparison's own level and floor (comparison.from_record), else the defaults.
        self.alpha = evidence.alpha if evidence is not None else stats.ALPHA
        self.floor = evidence.floor if evidence is not None else stats.FLOOR
        self.verdicts: dict[tuple[str, str], stats.Verdict] = evidence.verdicts() if evidence is not None else {}

    @property
    def judged(self) -> bool:
        return self.evidence is not None

    def get(self, path: str, phase: str) -> stats.Verdict | None:
        return self.verdicts.get((path, phase))


def judge(record: Mapping[str, Any] | None, base: Run, head: Run, rd: cdiff.RunDiff) -> Judged:
    """The best evidence for this diff, as `comparison.evidence_for` finds it: the comparison record of
    these two runs (given here, read once by the catalog), else both runs' rounds, else none."""
    head_to_base = {c.path: c.base_path for c in rd.components if c.base_path}
    ev = comparison.evidence_for(None, base, head, head_to_base, records=[record] if record is not None else [])
    return Judged(ev, record)


def root_verdicts(judged: Judged, rd: cdiff.RunDiff) -> dict[str, str] | None:
    """phase -> the whole model's latency verdict, for `RunDiff.summary` (None when latency is not judged)."""
    return gate.root_verdicts(judged.evidence, rd)  # the PR comment's rule, so page and comment agree


def latency_changed(c: ComponentDelta, judged: Judged) -> bool:
    """Does this component's latency count as a change on the page? (gate.latency_changed: one rule for
    the page, its summary and the PR comment.)"""
    return gate.latency_changed(c, judged.verdicts if judged.judged else None)


def latency_counts(judged: Judged) -> Callable[[ComponentDelta], bool] | None:
    """`latency_changed` bound to `judged`, for RunDiff.summary (None where latency is not judged: the noise rule)."""
    return (lambda c: latency_changed(c, judged)) if judged.judged else None


def _verdict_row(v: stats.Verdict) -> dict[str, Any]:
    d = v.to_dict()
    return {k: d[k] for k in ("verdict", "ratio", "ci_low", "ci_high", "n", "spread", "detectable", "needed", "reason")}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _stats(verdicts: list[stats.Verdict]) -> dict[str, Any]:
    counts = {name: sum(v.verdict == name for v in verdicts) for name in stats.VERDICTS}
    return {
        "counts": {k: n for k, n in counts.items() if n},
        "noise": _median([v.spread for v in verdicts if v.spread is not None and math.isfinite(v.spread)]),
        "detectable": _median([v.detectable for v in verdicts if v.detectable is not None and math.isfinite(v.detectable)]),
        "n": max((v.n for v in verdicts), default=0),
    }


def latency_context(judged: Judged, rd: cdiff.RunDiff, model: str) -> dict[str, Any]:
    """What the diff page's latency section and totals table show (plain data; the template words it)."""
    ev = judged.evidence
    out: dict[str, Any] = {"kind": "none" if ev is None else ev.kind, "hint": comparison.NOT_JUDGED_HINT,
                           "alpha": judged.alpha, "floor": judged.floor, "root": {}}
    if ev is None:
        return out
    out["describe"] = ev.describe()
    out["source"] = ev.source
    out["unit"] = "processes" if ev.paired else "rounds per run"
    rec = judged.record or {}
    out["comparison"] = ({k: rec.get(k) for k in ("comparison_id", "layout", "processes", "threads", "pairs", "block_s")}
                         if ev.paired else None)
    compared = set(rd.phases)
    mine = {k: v for k, v in judged.verdicts.items() if k[1] in compared}
    out.update(_stats(list(mine.values())))
    out["phases"] = {ph: _stats([v for (p, q), v in mine.items() if q == ph]) for ph in rd.phases}
    out["root"] = {ph: _verdict_row(v) for (p, ph), v in mine.items() if p == ""}
    order = {(c.path, c.phase): i for i, c in enumerate(rd.components)}
    rank = {v: i for i, v in enumerate(LISTED)}
    rows = [(ph, p, v) for (p, ph), v in mine.items() if v.verdict in LISTED]
    # As the PR comment orders them (cbsite/review.py latency_rows): verdict, then the largest change.
    rows.sort(key=lambda r: (rank[r[2].verdict], -abs(math.log(r[2].ratio)) if r[2].ratio else 0,
                             order.get((r[1], r[0]), 0)))
    out["listed"] = [{"phase": ph, "path": p, "label": display_path(p, model), **_verdict_row(v)}
                     for ph, p, v in rows[:MAX_LISTED]]
    out["more"] = max(0, len(rows) - MAX_LISTED)
    out["flagged"] = [f"{display_path(p, model)} ({ph})" for (p, ph) in sorted(ev.flagged) if ph in compared]
    return out


def latency_columns(judged: Judged, comps: list[ComponentDelta]) -> dict[str, Any] | None:
    """Per-component verdict columns of one phase, aligned with `comps` (None when latency is not judged)."""
    if not judged.judged:
        return None
    rows = [judged.get(c.path, c.phase) if c.kind != "removed" else None for c in comps]
    cols: dict[str, list[Any]] = {k: [] for k in ("verdict", "ratio", "ci_low", "ci_high", "n", "spread",
                                                   "detectable", "needed", "reason")}
    for v in rows:
        d = _verdict_row(v) if v is not None else dict.fromkeys(cols)
        for k in cols:
            value = d[k]
            cols[k].append(float(f"{value:.6g}") if isinstance(value, float) else value)
    return cols
