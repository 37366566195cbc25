"""Vega-Lite specs built with Altair, and the offline Vega bundle that renders them in the browser.

Specs are written as JSON files and handed to vega-embed by `assets/charts.js`; Altair's own HTML would load
Vega from a CDN or paste ~900 KB into every page.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Sequence
from urllib.parse import quote

import altair as alt
import vl_convert

from cbsite import throughput
from cbsite.archive import Run

TREND_METRICS = (
    ("latency_ms", "Latency per forward (ms)"),
    ("flops", "FLOPs per forward"),
    ("param_bytes", "Parameter bytes"),
    ("peak_memory_bytes", "Peak memory (bytes)"),
)


def _vl_version() -> str | None:
    """The Vega-Lite version Altair writes, if vl-convert bundles it (else its default, the newest)."""
    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    return major_minor if major_minor in vl_convert.get_vegalite_versions() else None


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega + Vega-Lite + vega-embed as one classic script, built once per process (it takes seconds).

    The bundle declares top-level names (`const n=...`): wrapped in a function they cannot collide with other
    scripts, and the guard makes loading it twice harmless. Only `window.cbsiteVegaEmbed` is exported.
    """
    body = vl_convert.javascript_bundle("window.cbsiteVegaEmbed = vegaEmbed;", vl_version=_vl_version())
    return "/* Vega, Vega-Lite and vega-embed, bundled by vl-convert-python. */\n(function () {\nif (window.cbsiteVegaEmbed) return;\n" + body + "\n})();\n"


def bundle_versions() -> list[str]:
    """What the Vega bundle depends on, for the build cache."""
    return [getattr(vl_convert, "__version__", ""), alt.SCHEMA_VERSION]


def _finish(chart: alt.TopLevelMixin) -> dict[str, Any]:
    # Altair validates against the JSON schema on every to_dict (~6 ms a chart, seconds per 100 runs); the
    # specs are fixed shapes, validated once by the tests (test_generator_charts) and rendered by the browser tests.
    spec = chart.to_dict(validate=False)
    # vega-embed compares $schema with its own version and warns on a mismatch; Vega-Lite is its default mode.
    spec.pop("$schema", None)
    return spec


# Axis number formats (d3-format): SI prefixes for counts and bytes (40M, not 40,000,000); milliseconds as
# plain decimals rounded to four significant digits ("r": 10, 0.25, 1,200; never exponent notation such as
# "1e+1", which "g" writes for a tick of 10 once Vega picks its precision from the tick step); the unit is in
# the title. Utilisations as percentages.
MS_FORMAT = ",.4~r"
PERCENT_FORMAT = ".2~%"
def value_axis(axis_format: str) -> alt.Axis:
    """A value axis in `axis_format`; zero reads "0", not "0M" (Vega gives every SI tick the largest one's prefix)."""
    if axis_format.endswith("s"):
        return alt.Axis(format=axis_format, labelExpr="datum.value == 0 ? '0' : datum.label")
    return alt.Axis(format=axis_format)


AXIS_FORMAT = {"latency_ms": MS_FORMAT, "flops": "~s", "param_bytes": "~s", "peak_memory_bytes": "~s", "bytes_moved": "~s"}


def trend_specs(versions: Sequence[str], runs: Sequence[Run], newest_ids: set[str],
                totals: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One chart per total across versions: a line through each version's newest run, a point per run, and
    for latency the band between the newest runs' quartiles (p25-p75). None for a single version: one point
    is no trend (the model page says so)."""
    if len(versions) < 2:
        return {}
    records: list[dict[str, Any]] = []
    for run in runs:
        for phase, values in sorted(totals[run.run_id].items()):
            for metric, _ in TREND_METRICS:
                value = values.get(metric)
                if value is None:
                    continue
                # Parameter bytes are static: one series, not one per phase.
                if metric == "param_bytes" and phase != "forward":
                    continue
                record = {
                    "version": run.version, "run_id": run.run_id, "phase": phase if metric != "param_bytes" else "static",
                    "metric": metric, "value": value, "newest": run.run_id in newest_ids,
                }
                if metric == "latency_ms" and values.get("latency_p25_ms") is not None and values.get("latency_p75_ms") is not None:
                    record["lo"], record["hi"] = values["latency_p25_ms"], values["latency_p75_ms"]
                records.append(record)
    specs: dict[str, dict[str, Any]] = {}
    for metric, title in TREND_METRICS:
        rows = [r for r in records if r["metric"] == metric]
        if rows:
            specs[metric] = _trend_chart(rows, versions, title, AXIS_FORMAT[metric], "phase")
    return specs


# The whole model's step (run.json `step`, cbsite/throughput.py): per mode, ms per iteration and examples/s.
STEP_METRICS = (
    ("step_ms", "Step time per iteration (ms)"),
    ("examples_per_s", "Examples per second"),
)
STEP_MODES = {"train": "train step", "eval": "eval forward"}


def step_trend_specs(versions: Sequence[str], runs: Sequence[Run], newest_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The step throughput across versions, as `trend_specs` draws the totals: ms per training iteration and per
    inference forward (band: p25-p75 of the newest run), and examples per second; one series per mode.
    Empty for a single version or when no run measured its step."""
    if len(versions) < 2:
        return {}
    rows: dict[str, list[dict[str, Any]]] = {metric: [] for metric, _ in STEP_METRICS}
    for run in runs:
        for mode, label in STEP_MODES.items():
            record = throughput.mode_of(run.meta, mode)
            if record is None:
                continue
            common = {"version": run.version, "run_id": run.run_id, "phase": label, "newest": run.run_id in newest_ids}
            if _number(record.get("ms")):
                row = {**common, "metric": "step_ms", "value": record["ms"]}
                if _number(record.get("p25_ms")) and _number(record.get("p75_ms")):
                    row["lo"], row["hi"] = record["p25_ms"], record["p75_ms"]
                rows["step_ms"].append(row)
            if _number(record.get("examples_per_s")):
                rows["examples_per_s"].append({**common, "metric": "examples_per_s", "value": record["examples_per_s"]})
    return {metric: _trend_chart(rows[metric], versions, title, AXIS_FORMAT["latency_ms"] if metric == "step_ms" else "~s", "mode")
            for metric, title in STEP_METRICS if rows[metric]}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _trend_chart(rows: list[dict[str, Any]], versions: Sequence[str], title: str, axis_format: str,
                 series: str) -> dict[str, Any]:
    """A line through each version's newest run, a point per run, and the p25-p75 band where rows have one."""
    x = alt.X("version:N", sort=list(versions), title="version",
              axis=alt.Axis(labelAngle=-30 if len(versions) > 6 else 0, labelOverlap="greedy", labelLimit=120))
    base = alt.Chart(alt.Data(values=rows)).encode(
        x=x,
        y=alt.Y("value:Q", title=title, scale=alt.Scale(zero=True), axis=value_axis(axis_format)),
        color=alt.Color("phase:N", title=series),
    )
    line = base.transform_filter("datum.newest").mark_line(point=True)
    points = base.mark_point(opacity=0.5, size=30).encode(
        color=alt.Color("phase:N", title=series, legend=None),  # the legend is the line layer's
        tooltip=[alt.Tooltip("version:N"), alt.Tooltip("run_id:N", title="run"),
                 alt.Tooltip("phase:N", title=series) if series != "phase" else alt.Tooltip("phase:N"),
                 alt.Tooltip("value:Q", format=".4~s")]
    )
    layers = [line, points]
    if any("lo" in r for r in rows):
        band = alt.Chart(alt.Data(values=rows)).transform_filter("datum.newest && isValid(datum.lo)").mark_area(
            # The lines' colour scale (shared), but no legend of its own: its 18 % swatches were near-invisible in
            # the dark scheme; the legend is the line layer's (legends resolved per layer, below).
            opacity=0.18).encode(x=x, y=alt.Y("lo:Q"), y2=alt.Y2("hi:Q"), color=alt.Color("phase:N", title=series, legend=None))
        layers.insert(0, band)
    title_params = alt.TitleParams(title + (" (band: p25-p75 of the newest run)" if len(layers) == 3 else ""),
                                   anchor="start", limit=0, fontSize=12)
    return _finish(alt.layer(*layers).resolve_legend(color="independent")
                   .properties(width="container", height=180, title=title_params))


def _contributors_chart(rows: list[dict[str, Any]], title: str, axis_format: str = "~s") -> dict[str, Any]:
    """Horizontal bars of the largest per-component deltas, signed, biggest first (built with Altair)."""
    order = [r["label"] for r in rows]
    chart = alt.Chart(alt.Data(values=rows)).mark_bar().encode(
        y=alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=360)),
        x=alt.X("delta:Q", title=title, axis=alt.Axis(format=axis_format)),
        color=alt.condition("datum.delta > 0", alt.value("#d6604d"), alt.value("#4393c3")),
        tooltip=[alt.Tooltip("path:N"), alt.Tooltip("kind:N"), alt.Tooltip("delta:Q", format=".4~s"),
                 alt.Tooltip("share:Q", format=".1%", title="share of growth")],
    )
    return _finish(chart.properties(width="container", height=max(60, 22 * len(rows)),
                                    title=alt.TitleParams(title, anchor="start", limit=0, fontSize=12)))


@functools.lru_cache(maxsize=None)
def _contributors_template(title: str, axis_format: str) -> str:
    """The chart for `title` with no rows, as JSON: Altair takes ~50 ms a chart (it validates its encodings
    even with validate=False), and only the data, the bar order and the height depend on the rows."""
    return json.dumps(_contributors_chart([], title, axis_format))


def contributors_spec(rows: list[dict[str, Any]], title: str, axis_format: str = "~s") -> dict[str, Any]:
    """Horizontal bars of the largest per-component deltas, signed, biggest first.

    The same spec as `_contributors_chart`, byte for byte (tests/golden/diff_charts.json pins it), from a
    per-title template.
    """
    spec = json.loads(_contributors_template(title, axis_format))
    spec["data"] = {"values": [dict(r) for r in rows]}
    spec["encoding"]["y"]["sort"] = [r["label"] for r in rows]
    spec["height"] = max(60, 22 * len(rows))
    return spec


# --- the roofline of a run ------------------------------------------------------------------------

BOUND_COLOURS = {"compute": "#1f6fb4", "memory": "#d9730d", "overhead": "#7f7f7f"}  # also in runpage.js
SUSPECT_COLOUR = "#7b3294"  # a point above a peak (rundata.site_bounds); in the legend only where drawn
MAX_ROOFLINE_POINTS = 1500  # the slowest leaves per forward; a 10,000-component run keeps a small chart


def _roofline_chart() -> dict[str, Any]:
    """Arithmetic intensity vs achieved FLOP/s on log axes: the roofs, the ridge and one point per leaf and
    phase coloured by what bounds it (cbsite/bound.py); a click on a point opens that component."""
    log = alt.Scale(type="log")
    roof = alt.Chart(alt.Data(values=[])).mark_line(color="#555555", strokeDash=[4, 3]).encode(
        x=alt.X("ai:Q", scale=log), y=alt.Y("flops_s:Q", scale=log))
    ridge = alt.Chart(alt.Data(values=[])).mark_rule(color="#555555", strokeDash=[2, 2]).encode(
        x=alt.X("ai:Q", scale=log), tooltip=[alt.Tooltip("label:N", title="ridge")])
    points = alt.Chart(alt.Data(values=[])).mark_point(filled=True, size=60, opacity=0.85, cursor="pointer").encode(
        # Plain decimals for FLOP per byte ("0.01", "0.2", "20"): SI prefixes read "10m" and "200m" here.
        x=alt.X("ai:Q", title="arithmetic intensity (FLOP per byte moved)", scale=alt.Scale(type="log"),
                axis=alt.Axis(format="~r")),
        y=alt.Y("flops_s:Q", title="achieved FLOP/s (per call)", scale=alt.Scale(type="log"), axis=alt.Axis(format="~s")),
        color=alt.Color("bound:N", title="bound by", scale=alt.Scale(domain=list(BOUND_COLOURS), range=list(BOUND_COLOURS.values()))),
        shape=alt.Shape("phase:N", title="phase"),
        href=alt.Href("href:N"),
        tooltip=[alt.Tooltip("path:N", title="component"), alt.Tooltip("phase:N"), alt.Tooltip("bound:N", title="bound by"),
                 alt.Tooltip("ai:Q", title="FLOP/byte", format=".3~s"), alt.Tooltip("flops_s:Q", title="FLOP/s", format=".3~s"),
                 alt.Tooltip("mfu:Q", title="MFU", format=".1%"), alt.Tooltip("bw:Q", title="bandwidth utilisation", format=".1%")],
    )
    chart = alt.layer(roof, ridge, points).properties(width="container", height=320, title="Roofline")
    return _finish(chart)


@functools.lru_cache(maxsize=1)
def _roofline_template() -> str:
    return json.dumps(_roofline_chart())


def roofline_spec(comps: dict[str, Any]) -> dict[str, Any] | None:
    """The roofline chart of a run from its components.json data; None when nothing can be placed on it."""
    roof = comps.get("roofline") or {}
    peak, bw = roof.get("peak_flops"), roof.get("peak_bandwidth")
    rows = []
    for phase in comps["phases"]:
        cols = comps[phase]
        for i, path in enumerate(comps["path"]):
            ai, tflops, lat = cols["arithmetic_intensity"][i], cols["tflops_per_s"][i], cols["latency_ms"][i]
            if not comps["is_leaf"][i] or not ai or not tflops or not lat or ai <= 0 or tflops <= 0:
                continue
            rows.append({"path": path or comps["model"], "phase": phase, "bound": cols["bound"][i], "ai": ai,
                         "flops_s": float("%.4g" % (tflops * 1e12)), "mfu": cols["mfu"][i], "bw": cols["bandwidth_util"][i],
                         "href": "#component=" + quote(path, safe=""),
                         "_cost": lat * max(comps["call_count"][i] or 0, 1)})
    if not rows:
        return None
    rows.sort(key=lambda r: (-r["_cost"], r["path"], r["phase"]))
    rows = rows[:MAX_ROOFLINE_POINTS]
    for r in rows:
        del r["_cost"]
    spec = json.loads(_roofline_template())
    ais, ys = [r["ai"] for r in rows], [r["flops_s"] for r in rows]
    if peak and bw:
        ridge = peak / bw
        x = _log_domain(min(min(ais), ridge), max(max(ais), ridge))
        y = _log_domain(min(ys), max(max(ys), peak))
        # The bandwidth roof starts where it enters the plot: at the x domain's left end, or higher up where it
        # crosses the y domain's floor; it ends at the right end, flat at peak FLOP/s from the ridge on.
        start = max(x[0], y[0] / bw)
        spec["layer"][0]["data"] = {"values": [{"ai": start, "flops_s": start * bw}, {"ai": ridge, "flops_s": peak},
                                               {"ai": x[1], "flops_s": peak}]}
        spec["layer"][1]["data"] = {"values": [{"ai": ridge, "label": f"{ridge:.3g} FLOP/byte: peak {peak:.3g} FLOP/s, {bw:.3g} B/s"}]}
    else:  # no peaks recorded: points only
        x, y = _log_domain(min(ais), max(ais)), _log_domain(min(ys), max(ys))
        spec["layer"] = spec["layer"][2:]
    for layer in spec["layer"]:  # one domain for every layer: the data's, never Vega's whole decades
        for channel, domain in (("x", x), ("y", y)):
            if channel in layer["encoding"]:
                layer["encoding"][channel]["scale"].update(domain=list(domain), nice=False)
    spec["layer"][-1]["data"] = {"values": rows}
    if any(r["bound"] == "suspect" for r in rows):
        scale = spec["layer"][-1]["encoding"]["color"]["scale"]
        scale["domain"], scale["range"] = [*scale["domain"], "suspect"], [*scale["range"], SUSPECT_COLOUR]
    return spec


_STEPS = (1.0, 2.0, 5.0, 10.0)


def _log_domain(lo: float, hi: float, margin: float = 0.5) -> tuple[float, float]:
    """A log axis's domain for data from lo to hi: half a decade more on each side, widened to the next 1, 2 or 5
    times a power of ten (0.05, 100), so every point and the roofs' corner lie well inside and the data fill the
    plot. Vega's own "nice" rounds to whole decades: 0.01 to 1000 for points from 0.2 to 25."""
    lo, hi = lo / 10 ** margin, hi * 10 ** margin
    e = math.floor(math.log10(lo))
    low = max(s for s in _STEPS if s * 10 ** e <= lo * (1 + 1e-9)) * 10 ** e
    e = math.floor(math.log10(hi))
    high = min(s for s in _STEPS if s * 10 ** e >= hi * (1 - 1e-9)) * 10 ** e
    return float("%.6g" % low), float("%.6g" % high)
