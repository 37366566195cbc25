"""One RunDiff -> what its page shows: totals with ratios, top contributors, and columnar JSON for the table
and for the icicle of the newer run coloured by delta."""

from __future__ import annotations

from typing import Any

from cbsite import diff as cdiff
from cbsite.generator import charts
from cbsite.generator.rundata import compact_column

TOP_N = 10
# Metrics with a contributors chart, in the order the page shows them.
CHART_METRICS = ("flops", "param_bytes", "peak_memory_bytes", "latency_ms")


def totals_rows(rd: cdiff.RunDiff) -> list[dict[str, Any]]:
    """One row per (phase, metric) for the totals table, with the ratio already in words."""
    rows = []
    for phase, metrics in rd.totals.items():
        for metric in cdiff.DIFF_METRICS:
            t = metrics[metric]
            rows.append({
                "phase": phase, "metric": metric, "label": cdiff.LABELS[metric],
                "base": None if t.base is None else cdiff.format_amount(metric, t.base),
                "head": None if t.head is None else cdiff.format_amount(metric, t.head),
                "delta": cdiff.format_delta(metric, t.delta), "ratio": cdiff.format_ratio(t),
                "noise": t.noise, "complete": t.complete,
                "direction": 0 if not t.delta or t.noise else (1 if t.delta > 0 else -1),
            })
    return rows


def top_rows(rd: cdiff.RunDiff, model: str) -> dict[str, list[dict[str, Any]]]:
    """The deepest components that explain each metric's change in the main phase."""
    phase = "forward" if "forward" in rd.totals else (rd.phases[0] if rd.phases else None)
    if phase is None:
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for metric in CHART_METRICS:
        rows = []
        for c in rd.top(metric, phase, TOP_N):
            rows.append({
                "path": cdiff.display_path(c.path, model), "label": cdiff.display_path(c.path, model),
                "module_type": c.module_type, "kind": c.kind, "delta": c.self_delta[metric],
                "share": c.share[metric], "delta_text": cdiff.format_delta(metric, c.self_delta[metric]),
            })
        if rows:
            out[metric] = rows
    return out


def chart_specs(tops: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        metric: charts.contributors_spec(rows, f"Own change: {cdiff.LABELS[metric]}")
        for metric, rows in tops.items()
    }


def diff_json(rd: cdiff.RunDiff) -> dict[str, Any]:
    """Columnar per-phase component deltas (a 10,000-component diff stays a few MB)."""
    out: dict[str, Any] = {"metrics": list(cdiff.DIFF_METRICS), "phases": rd.phases}
    for phase in rd.phases:
        comps = rd.for_phase(phase)
        cols: dict[str, Any] = {
            "path": [c.path for c in comps],
            "base_path": [c.base_path for c in comps],
            "module_type": [c.module_type for c in comps],
            "depth": [c.depth for c in comps],
            "kind": [c.kind for c in comps],
            "status_base": [c.status_base for c in comps],
            "status_head": [c.status_head for c in comps],
            "missing": [list(c.missing) for c in comps],
        }
        for key in ("base", "head", "delta", "self_delta", "share"):
            dicts = [getattr(c, key) for c in comps]
            cols[key] = {m: compact_column([d[m] for d in dicts]) for m in cdiff.DIFF_METRICS}
        noise = [c.noise for c in comps]
        cols["noise"] = {m: [d[m] for d in noise] for m in cdiff.DIFF_METRICS}
        out[phase] = cols
    return out
