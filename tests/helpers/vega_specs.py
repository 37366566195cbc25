"""Reading the chart files the site ships as Vega (compiled from Vega-Lite at build time, charts.py): their data rows,
marks, scales, axes, tooltips and facet order, for tests that check what a chart draws."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator


def rows(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's inline data rows (one copy of each distinct row)."""
    found = [r for data in spec["data"] for r in data.get("values", [])]
    return list({json.dumps(r, sort_keys=True): r for r in found}.values())


def marks(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every mark of the chart, groups and what they hold, in the order they are drawn."""
    for mark in spec.get("marks", []):
        yield mark
        yield from marks(mark)


def drawn(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The marks that draw data (lines, points, areas, rules, bars), not the groups that hold them."""
    return [m for m in marks(spec) if m["type"] != "group"]


def encoding(mark: dict[str, Any]) -> dict[str, Any]:
    return mark.get("encode", {}).get("update", {})


def scale(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in spec["scales"] if s["name"] == name)


def value_axes(spec: dict[str, Any], scale_name: str) -> list[dict[str, Any]]:
    """The axes of `scale_name` that write labels (Vega-Lite also compiles a grid-only axis per scale)."""
    return [a for group in (spec, *marks(spec)) for a in group.get("axes", [])
            if a["scale"] == scale_name and a.get("labels", True)]


def tooltip_keys(mark: dict[str, Any]) -> list[str]:
    """The rows of the mark's tooltip, in order: the keys of its `{"key": expr, ...}` signal."""
    return re.findall(r'(?:^\{|, )"([^"]+)": ', encoding(mark)["tooltip"]["signal"])


def facet_order(spec: dict[str, Any]) -> list[str]:
    """A faceted chart's panels in the order they are laid out: the values its sort index formula numbers."""
    formula = next(t["expr"] for d in spec["data"] for t in d.get("transform", [])
                   if re.fullmatch(r"facet_\w+_sort_index", str(t.get("as"))))
    return [value for value, _ in sorted(re.findall(r'==="([^"]+)" \? (\d+)', formula), key=lambda m: int(m[1]))]
