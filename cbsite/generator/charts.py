"""Vega-Lite specs built with Altair, and the offline Vega bundle that renders them in the browser.

Specs are written as JSON files and handed to vega-embed by `assets/charts.js`; Altair's own HTML would load
Vega from a CDN or paste ~900 KB into every page.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Sequence

import altair as alt
import vl_convert

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


def _finish(chart: alt.TopLevelMixin) -> dict[str, Any]:
    # Altair validates against the JSON schema on every to_dict (~6 ms a chart, seconds per 100 runs); the
    # specs are fixed shapes, validated once by the tests (test_generator_charts) and rendered by the browser tests.
    spec = chart.to_dict(validate=False)
    # vega-embed compares $schema with its own version and warns on a mismatch; Vega-Lite is its default mode.
    spec.pop("$schema", None)
    return spec


def trend_specs(versions: Sequence[str], runs: Sequence[Run], newest_ids: set[str],
                totals: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One chart per total across versions: a line through each version's newest run, a point per run."""
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
                records.append({
                    "version": run.version, "run_id": run.run_id, "phase": phase if metric != "param_bytes" else "static",
                    "metric": metric, "value": value, "newest": run.run_id in newest_ids,
                })
    specs: dict[str, dict[str, Any]] = {}
    for metric, title in TREND_METRICS:
        rows = [r for r in records if r["metric"] == metric]
        if not rows:
            continue
        base = alt.Chart(alt.Data(values=rows)).encode(
            x=alt.X("version:N", sort=list(versions), title="version"),
            y=alt.Y("value:Q", title=title, scale=alt.Scale(zero=True)),
            color=alt.Color("phase:N", title="phase"),
        )
        line = base.transform_filter("datum.newest").mark_line(point=True)
        points = base.mark_point(opacity=0.5, size=30).encode(
            tooltip=[alt.Tooltip("version:N"), alt.Tooltip("run_id:N", title="run"), alt.Tooltip("phase:N"),
                     alt.Tooltip("value:Q", format=".4~s")]
        )
        specs[metric] = _finish((line + points).properties(width="container", height=180, title=title))
    return specs


def _contributors_chart(rows: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """Horizontal bars of the largest per-component deltas, signed, biggest first (built with Altair)."""
    order = [r["label"] for r in rows]
    chart = alt.Chart(alt.Data(values=rows)).mark_bar().encode(
        y=alt.Y("label:N", sort=order, title=None, axis=alt.Axis(labelLimit=360)),
        x=alt.X("delta:Q", title=title),
        color=alt.condition("datum.delta > 0", alt.value("#d6604d"), alt.value("#4393c3")),
        tooltip=[alt.Tooltip("path:N"), alt.Tooltip("kind:N"), alt.Tooltip("delta:Q", format=".4~s"),
                 alt.Tooltip("share:Q", format=".1%", title="share of growth")],
    )
    return _finish(chart.properties(width="container", height=max(60, 22 * len(rows)), title=title))


@functools.lru_cache(maxsize=None)
def _contributors_template(title: str) -> str:
    """The chart for `title` with no rows, as JSON: Altair takes ~50 ms a chart (it validates its encodings
    even with validate=False), and only the data, the bar order and the height depend on the rows."""
    return json.dumps(_contributors_chart([], title))


def contributors_spec(rows: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """Horizontal bars of the largest per-component deltas, signed, biggest first.

    The same spec as `_contributors_chart`, byte for byte (tests/golden/diff_charts.json pins it), from a
    per-title template.
    """
    spec = json.loads(_contributors_template(title))
    spec["data"] = {"values": [dict(r) for r in rows]}
    spec["encoding"]["y"]["sort"] = [r["label"] for r in rows]
    spec["height"] = max(60, 22 * len(rows))
    return spec
