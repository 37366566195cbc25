"""Vega-Lite specs built with Altair, and the offline bundles that draw them in the browser.

Specs are written as JSON files and drawn by `assets/charts.js`: the trend and study charts compiled to Vega at build
time, the diff page's contributors as Vega-Lite. Altair's own HTML would load Vega from a CDN or paste ~900 KB into
every page.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

import altair as alt
import vl_convert

from cbsite import throughput
from cbsite.archive import Run
from cbsite.generator import templating
from cbsite.generator.cache import user_cache_root

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


# The site's two offline bundles (assets/cbsite/). The model and study pages' charts are compiled to Vega at
# build time and drawn by the Vega runtime alone (a third less script, no Vega-Lite compile in the browser). The diff
# page's contributors charts stay Vega-Lite: compiling each diff's would cost build time per diff, and diffdata edits
# their spec after it is made; their bundle adds Vega-Lite and vega-embed, and only diff pages load it.
VEGA_BUNDLE = "vega.js"
VEGA_LITE_BUNDLE = "vega-lite.js"

# The bundles' runtime, imported by the URL vl-convert's bundler resolves offline (its `vega` name is not the module).
VEGA_MODULE = "https://cdn.jsdelivr.net/npm/vega@{version}/+esm"


def bundles() -> dict[str, str]:
    """The site's chart bundles, {file name: script}, each built once per process (it takes seconds)."""
    return {VEGA_BUNDLE: vega_bundle(), VEGA_LITE_BUNDLE: vega_lite_bundle()}


@functools.lru_cache(maxsize=1)
def vega_bundle() -> str:
    """The Vega runtime as one classic script, for the chart files compiled to Vega: `window.cbsiteVega`, {View, parse}."""
    runtime = VEGA_MODULE.format(version=vl_convert.get_vega_version())
    return _script("The Vega runtime", "cbsiteVega",
                   f'import {{View, parse}} from "{runtime}";\nwindow.cbsiteVega = {{View: View, parse: parse}};')


@functools.lru_cache(maxsize=1)
def vega_lite_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one classic script, for the Vega-Lite chart files (the diff page's):
    `window.cbsiteVegaLite`, {embed}."""
    return _script("Vega, Vega-Lite and vega-embed", "cbsiteVegaLite", "window.cbsiteVegaLite = {embed: vegaEmbed};")


def _script(what: str, name: str, snippet: str) -> str:
    """`snippet` bundled with what it imports. The bundle declares top-level names (`const n=...`): wrapped in a
    function they cannot collide with other scripts, and the guard on `window[name]` makes loading it twice harmless.
    Bundling takes seconds and depends only on vl-convert and the snippet, so the result is kept in the user's cache
    directory (bundle_path) and read back by later builds and processes."""
    head = f"/* {what}, bundled by vl-convert-python. */\n(function () {{\nif (window.{name}) return;\n"
    tail = "\n})();\n"
    path = bundle_path(name, snippet)
    try:
        kept = path.read_text(encoding="utf-8")
        if kept.startswith(head) and kept.endswith(tail):  # whole, as written (a rename puts it in place)
            return kept
    except (OSError, UnicodeDecodeError):
        pass
    script = head + vl_convert.javascript_bundle(snippet, vl_version=_vl_version()) + tail
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        part.write_text(script, encoding="utf-8")
        os.replace(part, path)
    except OSError:
        pass  # a cache directory that cannot be written: bundled again next time
    return script


def bundle_path(name: str, snippet: str) -> Path:
    """Where the bundle of `snippet` is kept: named by everything its text depends on (vl-convert's and Vega's
    versions, the Vega-Lite version asked for, the snippet)."""
    key = json.dumps([*bundle_versions(), _vl_version(), name, snippet])
    return user_cache_root() / "bundles" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.js"


def bundle_versions() -> list[str]:
    """What the bundles depend on, for the build cache."""
    return [getattr(vl_convert, "__version__", ""), vl_convert.get_vega_version(), alt.SCHEMA_VERSION,
            VEGA_BUNDLE, VEGA_LITE_BUNDLE]


def vega_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """A Vega-Lite spec compiled to the Vega spec the page draws: the browser then runs neither Vega-Lite's compiler
    nor vega-embed. `usermeta.height` is the height its box holds until it is drawn (charts.js `reserve`)."""
    out: dict[str, Any] = vl_convert.vegalite_to_vega(spec, vl_version=_vl_version())
    out.pop("$schema", None)  # the page's runtime is the bundle's; nothing reads it
    height = reserved_height(spec)
    if height is not None:
        out["usermeta"] = {"height": height}
    return out


def reserved_height(spec: dict[str, Any]) -> int | None:
    """The height in px a chart's box holds before it is drawn: its plot, title and axes; a faceted chart's rows of
    panels, each the inner plot and its facet header. None where the spec says no height."""
    if isinstance(spec.get("height"), (int, float)):
        return int(spec["height"]) + 70
    inner, facet = spec.get("spec"), spec.get("facet")
    if not isinstance(inner, dict) or not isinstance(inner.get("height"), (int, float)) or not facet:
        return None
    panels = len(facet["sort"]) if isinstance(facet.get("sort"), list) else 1
    columns = spec["columns"] if isinstance(spec.get("columns"), int) and spec["columns"] > 0 else panels
    return -(-panels // columns) * (int(inner["height"]) + 20) + 70


def _finish(chart: alt.TopLevelMixin) -> dict[str, Any]:
    # Altair validates against the JSON schema on every to_dict (~6 ms a chart, seconds per 100 runs); the
    # specs are fixed shapes, validated once by the tests (test_generator_golden) and rendered by the browser tests.
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
    """`trend_charts` as the model page's trends.json holds them: compiled to Vega."""
    return {metric: vega_spec(spec) for metric, spec in trend_charts(versions, runs, newest_ids, totals).items()}


def trend_charts(versions: Sequence[str], runs: Sequence[Run], newest_ids: set[str],
                 totals: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The Vega-Lite of the trends, one chart per total across versions: a line through each version's newest run,
    a point per run, and for latency the band between the newest runs' quartiles (p25-p75). None for a single
    version: one point is no trend (the model page says so)."""
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
                    "metric": metric, "value": value, "newest": run.run_id in newest_ids, "href": _run_href(run),
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
    """`step_trend_charts` as the model page's trends.json holds them: compiled to Vega."""
    return {metric: vega_spec(spec) for metric, spec in step_trend_charts(versions, runs, newest_ids).items()}


def step_trend_charts(versions: Sequence[str], runs: Sequence[Run], newest_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The Vega-Lite of the step throughput across versions, as `trend_specs` draws the totals: ms per training iteration and per
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
            common = {"version": run.version, "run_id": run.run_id, "phase": label, "newest": run.run_id in newest_ids,
                      "href": _run_href(run)}
            if _number(record.get("ms")):
                row = {**common, "metric": "step_ms", "value": record["ms"]}
                if _number(record.get("p25_ms")) and _number(record.get("p75_ms")):
                    row["lo"], row["hi"] = record["p25_ms"], record["p75_ms"]
                rows["step_ms"].append(row)
            if _number(record.get("examples_per_s")):
                rows["examples_per_s"].append({**common, "metric": "examples_per_s", "value": record["examples_per_s"]})
    return {metric: _trend_chart(rows[metric], versions, title, AXIS_FORMAT["latency_ms"] if metric == "step_ms" else "~s",
                                 "mode")
            for metric, title in STEP_METRICS if rows[metric]}


def _run_href(run: Run) -> str:
    """The run's page from the model page, whose trends.json these charts are: a click on a point opens it."""
    return "../../" + templating.run_url(run)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _trend_chart(rows: list[dict[str, Any]], versions: Sequence[str], title: str, axis_format: str,
                 series: str) -> dict[str, Any]:
    """A line through each version's newest run, a point per run, and the p25-p75 band where rows have one.

    Altair copies every value of inline data as it writes a spec (a quarter of a second for a chart of 200
    versions): the chart is made with one row standing for them (one with a band where any has one, the only
    thing of the rows the chart's shape depends on), and the rows are put in its place after. The same Vega-Lite
    as Altair's with every row (tests/test_generator_charts.py)."""
    if not rows:
        return _trend_chart_of(rows, versions, title, axis_format, series)
    stand_in = [dict(next((r for r in rows if "lo" in r), rows[0]))]
    spec = _trend_chart_of(stand_in, versions, title, axis_format, series)
    _put_rows(spec, stand_in, rows)
    return spec


def _put_rows(node: Any, stand_in: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Every inline `values` of the spec that holds the stand-in row, given the rows instead."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "values" and value == stand_in:
                node[key] = rows
            else:
                _put_rows(value, stand_in, rows)
    elif isinstance(node, list):
        for item in node:
            _put_rows(item, stand_in, rows)


def _trend_chart_of(rows: list[dict[str, Any]], versions: Sequence[str], title: str, axis_format: str,
                    series: str) -> dict[str, Any]:
    x = alt.X("version:N", sort=list(versions), title="version",
              axis=alt.Axis(labelAngle=-30 if len(versions) > 6 else 0, labelOverlap="greedy", labelLimit=120))
    base = alt.Chart(alt.Data(values=rows)).encode(
        x=x,
        y=alt.Y("value:Q", title=title, scale=alt.Scale(zero=True), axis=value_axis(axis_format)),
        color=alt.Color("phase:N", title=series),
    )
    line = base.transform_filter("datum.newest").mark_line(point=True)
    points = base.mark_point(opacity=0.5, size=30, cursor="pointer").encode(
        color=alt.Color("phase:N", title=series, legend=None),  # the legend is the line layer's
        href=alt.Href("href:N"),
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
    per-title template. Vega-Lite (the diff page draws it with vega-embed): its caller sets its axes after.
    """
    spec = json.loads(_contributors_template(title, axis_format))
    spec["data"] = {"values": [dict(r) for r in rows]}
    spec["encoding"]["y"]["sort"] = [r["label"] for r in rows]
    spec["height"] = max(60, 22 * len(rows))
    return spec
