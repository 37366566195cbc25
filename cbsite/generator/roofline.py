"""The roofline of a run page: what `assets/roofline.js` draws as SVG, written beside the page as roofline.json.

The page draws it itself (no Vega): the plot's log domains, the roofs and one point per leaf component and phase,
as columns, with the colour of each bound. A click on a point opens that component (`#component=<path>`).
"""

from __future__ import annotations

import math
from typing import Any

BOUND_COLOURS = {"compute": "#1f6fb4", "memory": "#d9730d", "overhead": "#7f7f7f"}  # also in rundata.js
SUSPECT_COLOUR = "#7b3294"  # a point above a peak (rundata.site_bounds); in the legend only where drawn
MAX_ROOFLINE_POINTS = 1500  # the slowest leaves per forward; a 10,000-component run keeps a small chart
POINT_COLUMNS = ("path", "phase", "bound", "ai", "flops_s", "mfu", "bw")


def roofline_data(comps: dict[str, Any]) -> dict[str, Any] | None:
    """The roofline of a run from its components.json data; None when nothing can be placed on it.

    `x` and `y` are the log domains (FLOP per byte, FLOP/s); `roof` the bandwidth roof from where it enters the
    plot to the ridge, then flat at peak FLOP/s to the right edge (null without peaks); `points` one column per
    field of POINT_COLUMNS, the costliest first; `bounds` the legend's colours, in order.
    """
    roof = comps.get("roofline") or {}
    peak, bw = roof.get("peak_flops"), roof.get("peak_bandwidth")
    rows = []
    for phase in comps["phases"]:
        cols = comps[phase]
        for i, path in enumerate(comps["path"]):
            ai, tflops, lat = cols["arithmetic_intensity"][i], cols["tflops_per_s"][i], cols["latency_ms"][i]
            if not comps["is_leaf"][i] or not ai or not tflops or not lat or ai <= 0 or tflops <= 0:
                continue
            rows.append({"path": path, "phase": phase, "bound": cols["bound"][i], "ai": ai,
                         "flops_s": float("%.4g" % (tflops * 1e12)), "mfu": cols["mfu"][i], "bw": cols["bandwidth_util"][i],
                         "cost": lat * max(comps["call_count"][i] or 0, 1)})
    if not rows:
        return None
    rows.sort(key=lambda r: (-r["cost"], r["path"], r["phase"]))
    rows = rows[:MAX_ROOFLINE_POINTS]
    ais, ys = [r["ai"] for r in rows], [r["flops_s"] for r in rows]
    out: dict[str, Any] = {"model": comps["model"], "peak_flops": None, "peak_bandwidth": None, "ridge": None, "roof": None}
    if peak and bw:
        ridge = peak / bw
        x = _log_domain(min(min(ais), ridge), max(max(ais), ridge))
        y = _log_domain(min(ys), max(max(ys), peak))
        # The bandwidth roof starts where it enters the plot: at the x domain's left end, or higher up where it
        # crosses the y domain's floor.
        start = max(x[0], y[0] / bw)
        out.update(peak_flops=peak, peak_bandwidth=bw, ridge=ridge,
                   roof=[[start, start * bw], [ridge, peak], [x[1], peak]])
    else:  # no peaks recorded: points only
        x, y = _log_domain(min(ais), max(ais)), _log_domain(min(ys), max(ys))
    bounds = dict(BOUND_COLOURS)
    if any(r["bound"] == "suspect" for r in rows):
        bounds["suspect"] = SUSPECT_COLOUR
    out.update(x=list(x), y=list(y), bounds=bounds, points={c: [r[c] for r in rows] for c in POINT_COLUMNS})
    return out


_STEPS = (1.0, 2.0, 5.0, 10.0)


def _log_domain(lo: float, hi: float, margin: float = 0.5) -> tuple[float, float]:
    """A log axis's domain for data from lo to hi: half a decade more on each side, widened to the next 1, 2 or 5
    times a power of ten (0.05, 100), so every point and the roofs' corner lie well inside and the data fill the
    plot (whole decades would leave most of it empty: 0.01 to 1000 for points from 0.2 to 25)."""
    lo, hi = lo / 10 ** margin, hi * 10 ** margin
    e = math.floor(math.log10(lo))
    low = max(s for s in _STEPS if s * 10 ** e <= lo * (1 + 1e-9)) * 10 ** e
    e = math.floor(math.log10(hi))
    high = min(s for s in _STEPS if s * 10 ** e >= hi * (1 - 1e-9)) * 10 ** e
    return float("%.6g" % low), float("%.6g" % high)
