"""One RunDiff -> what its page shows: totals with ratios, top contributors, and columnar JSON for the table
and for the icicle of the newer run coloured by delta.

Shares are given only where they mean something: an additive metric's own change that is a change (never
for a latency change within noise, or one whose verdict is unchanged or inconclusive), and never for peak
memory, whose values are maxima: a peak's own change is the part no child explains, and such parts do not
add up to the model's change (cbsite/diff.py), so they are shown as amounts, not as shares.
Latency follows its verdicts when the diff has evidence (cbsite/generator/latencydata.py).
"""

from __future__ import annotations

from typing import Any

from cbsite import diff as cdiff
from cbsite.generator import charts
from cbsite.generator.latencydata import Judged, latency_changed, latency_columns
from cbsite.generator.rundata import compact_column

TOP_N = 10
# Metrics with a contributors chart, in the order the page shows them.
CHART_METRICS = ("flops", "param_bytes", "peak_memory_bytes", "latency_ms")
NO_SHARE = frozenset({"peak_memory_bytes"})  # maxima: own changes do not add up to the model's


def totals_rows(rd: cdiff.RunDiff, judged: Judged | None = None) -> list[dict[str, Any]]:
    """One row per (phase, metric) for the totals table, with the ratio already in words.

    With latency evidence, a latency row's direction is its root verdict's (regressed up, improved down,
    anything else no change) and the row carries that verdict."""
    rows = []
    for phase, metrics in rd.totals.items():
        for metric in cdiff.DIFF_METRICS:
            t = metrics[metric]
            direction = 0 if not t.delta or t.noise else (1 if t.delta > 0 else -1)
            verdict = None
            if metric == "latency_ms" and judged is not None and judged.judged:
                v = judged.get("", phase)
                verdict = v.to_dict() if v is not None else None
                direction = {"regressed": 1, "improved": -1}.get(v.verdict if v is not None else "", 0)
            rows.append({
                "phase": phase, "metric": metric, "label": cdiff.LABELS[metric],
                "base": None if t.base is None else cdiff.format_amount(metric, t.base),
                "head": None if t.head is None else cdiff.format_amount(metric, t.head),
                "delta": cdiff.format_delta(metric, t.delta), "ratio": cdiff.format_ratio(t),
                "noise": t.noise, "complete": t.complete, "direction": direction, "verdict": verdict,
            })
    return rows


def _changes(rd: cdiff.RunDiff, metric: str, phase: str, judged: Judged | None) -> list[cdiff.ComponentDelta]:
    """The components with an own change of `metric` that counts, largest first (as `RunDiff.top` orders
    them); latency with evidence counts only components whose verdict is a change."""
    if metric != "latency_ms" or judged is None or not judged.judged:
        return rd.top(metric, phase, len(rd.components))
    rows = [(i, c) for i, c in enumerate(rd.for_phase(phase))
            if c.self_delta[metric] not in (None, 0) and latency_changed(c, judged)]
    rows.sort(key=lambda ic: (-abs(ic[1].self_delta[metric]), -ic[1].depth, ic[0]))
    return [c for _, c in rows]


def _change_word(c: cdiff.ComponentDelta, value: float) -> str:
    """What happened to the metric itself: a component classified `increased` by its FLOPs may have got
    faster, so the word follows the sign of this metric's change, not the component's kind."""
    if c.kind in ("added", "removed", "moved"):
        return c.kind
    return "grew" if value > 0 else "shrank"


def top_rows(rd: cdiff.RunDiff, model: str, judged: Judged | None = None) -> dict[str, list[dict[str, Any]]]:
    """The deepest components that explain each metric's change in the main phase."""
    phase = "forward" if "forward" in rd.totals else (rd.phases[0] if rd.phases else None)
    if phase is None:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for metric in CHART_METRICS:
        rows = []
        for c in _changes(rd, metric, phase, judged)[:TOP_N]:
            value = c.self_delta[metric]
            rows.append({
                "path": cdiff.display_path(c.path, model), "label": cdiff.display_path(c.path, model),
                "module_type": c.module_type, "kind": c.kind, "delta": value, "change": _change_word(c, value),
                "share": None if metric in NO_SHARE else c.share[metric],
                "delta_text": cdiff.format_delta(metric, value),
            })
        if rows:
            out[metric] = rows
    return out


def ties(tops: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    """Per metric, how many of the top rows share the first row's own change exactly (a tie is named as one)."""
    out = {}
    for metric, rows in tops.items():
        n = sum(1 for r in rows if r["delta"] == rows[0]["delta"])
        if n > 1:
            out[metric] = n
    return out


def chart_specs(tops: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        metric: charts.contributors_spec(rows, f"Own change: {cdiff.LABELS[metric]}" + (" (ms)" if metric == "latency_ms" else ""),
                                         charts.AXIS_FORMAT[metric])
        for metric, rows in tops.items()
    }


def _shares(comps: list[cdiff.ComponentDelta], metric: str, judged: Judged | None) -> list[float | None]:
    if metric in NO_SHARE:
        return [None] * len(comps)
    if metric == "latency_ms":
        judged = judged or Judged(None, None)
        return [c.share[metric] if latency_changed(c, judged) else None for c in comps]
    return [c.share[metric] for c in comps]


def _floats(values: list[Any]) -> list[Any]:
    """Integers (FLOPs, bytes) as floats, so that they are rounded too; whole results are written as integers."""
    return [float(v) if type(v) is int else v for v in values]


def _whole(values: list[Any]) -> list[Any]:
    """Whole floats written as integers ("344000000000", not "344000000000.0")."""
    return [int(v) if type(v) is float and v.is_integer() and abs(v) < 2 ** 53 else v for v in values]


# What the diff page reads (assets/diffpage.js), and no more: a 10,000-component diff must stay small.
# Base and head values only for latency (the icicle's tooltip); other metrics' values are on the runs' pages.
SIDE_METRICS = ("latency_ms",)
DIGITS = 3  # deltas and shares as the one formatter prints them (pages.py: 3 significant digits)


def diff_json(rd: cdiff.RunDiff, judged: Judged | None = None) -> dict[str, Any]:
    """Columnar per-phase component deltas, only what the page reads: a 10,000-component diff stays small.

    `base_path` is null where the component kept its path. `latency` (per phase, only when the diff has
    evidence): the verdict columns of latencydata; `judged` at the top says which (false: latency not
    judged, the IQR rule marks noise)."""
    judged = judged or Judged(None, None)
    out: dict[str, Any] = {"metrics": list(cdiff.DIFF_METRICS), "phases": rd.phases, "judged": judged.judged}
    for phase in rd.phases:
        comps = rd.for_phase(phase)
        cols: dict[str, Any] = {
            "path": [c.path for c in comps],
            "base_path": [c.base_path if c.base_path != c.path else None for c in comps],
            "module_type": [c.module_type for c in comps],
            "depth": [c.depth for c in comps],
            "kind": [c.kind for c in comps],
            "missing": [list(c.missing) for c in comps],
        }
        for key in ("base", "head", "self_delta"):
            dicts = [getattr(c, key) for c in comps]
            cols[key] = {m: compact_column([d[m] for d in dicts]) for m in SIDE_METRICS}
        deltas = [c.delta for c in comps]
        cols["delta"] = {m: _whole(compact_column(_floats([d[m] for d in deltas]), DIGITS)) for m in cdiff.DIFF_METRICS}
        cols["share"] = {m: compact_column(_shares(comps, m, judged), DIGITS) for m in cdiff.DIFF_METRICS}
        noise = [c.noise for c in comps]
        cols["noise"] = {m: [d[m] for d in noise] for m in cdiff.DIFF_METRICS}
        latency = latency_columns(judged, comps)
        if latency is not None:
            cols["latency"] = latency
        out[phase] = cols
    return out
