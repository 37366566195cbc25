"""Study pages: a sweep's points, its configuration, and charts of the model and its parts against each axis.

A study is found from its runs (run.json `study`: name, point, options, axes; see cbsite/study.py) and,
where the archive has it, its record `_studies/<name>/study.json` (grid order, failed points and their
errors, the executor). Per point (its newest run), per series:

* the **model**: the root row's figures, its forward examples/s (batch / the root's forward latency) and, as
  the series "model: training step" and "model: eval forward", the step timing's examples/s of the whole
  training iteration (forward, backward, optimizer step) and of the eval forward;
* each **component class**: the model's direct children grouped by module type (a DLRM's SparseArch,
  DenseArch, InteractionArch, OverArch): latency and parameter bytes summed, peak memory the largest,
  MFU and bandwidth utilisation recomputed from the summed FLOPs and bytes over the summed latency
  (the run's peaks), examples/s = batch / forward latency.

One chart per axis and metric: the metric against the axis, one line per series; with other axes, one
panel per combination of their values (held fixed within a panel). Each chart comes linear and log.
Examples per second are two charts, never one: the whole model's training step and eval forward (what a
training or serving loop gets), and the forward alone of the model and of each component class (like with
like: the parts' throughput is forward-only, the training step's is forward + backward + update); each
series there says what it measures ("model: training step", "DenseArch: forward"), and so does the tooltip.

A point measured more than once carries its spread, drawn as a bar through the point and written in the tooltip
with the number of repeats: the min-max of its runs' figures where the point was run several times, else of its
run's rounds (`--rounds N`: each round's figures from that round's median per component, as the run's own
figures come from the median of those medians). Parameter bytes are static and have none; the step timing's
examples/s vary only between runs. A single-round point has no bar, and the page says how many there are.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import altair as alt
import polars as pl

from cbsite import format as fmt
from cbsite import study as cstudy
from cbsite import tree
from cbsite.archive import Run
from cbsite.generator.charts import MS_FORMAT, PERCENT_FORMAT, _finish, value_axis, vega_spec

METRICS = (
    ("latency_forward_ms", "Forward latency (ms)"),
    ("latency_backward_ms", "Backward latency (ms)"),
    ("step_examples_per_s", "Examples per second, whole model (step timing)"),
    ("examples_per_s", "Examples per second, forward only (batch / forward latency)"),
    ("mfu", "MFU (forward)"),
    ("bandwidth_util", "Bandwidth utilisation (forward)"),
    ("peak_memory_bytes", "Peak memory, forward (bytes)"),
    ("param_bytes", "Parameter bytes"),
)
MODEL = "model"
TRAIN, EVAL = "model: training step", "model: eval forward"  # the step timing's series (step_examples_per_s)
# What a value of a metric measures, for its tooltip; {series} is the series it belongs to.
MEASURES = {
    TRAIN: "the whole model's training step: zero_grad, forward, loss, backward, optimizer step (step timing)",
    EVAL: "the whole model's forward in eval mode under no_grad (step timing)",
    "examples_per_s": "the forward of {series} alone: batch / forward latency (component timing)",
}
# Colours fixed per series name, the same in every chart of a study: the model green, its step timing's
# training step green too and its eval forward purple, the component classes Vega's category colours in
# name order (as each chart drew them before: blue, orange, red, teal, ...).
PALETTE = ["#4c78a8", "#f58518", "#e45756", "#72b7b2", "#eeca3b", "#9d755d", "#ff9da6", "#bab0ac"]
MODEL_COLOUR, EVAL_COLOUR = "#54a24b", "#b279a2"
# The collector's rule for a round's median (collector/session/rounds.py): its uncontended blocks, or all of its
# blocks when fewer than this many are clean; the run's latency is the median of these round medians.
MIN_CLEAN_BLOCKS = 5
STATIC_METRICS = ("param_bytes",)  # the same in every repeat: no spread
# What a round re-measures: its timing and the figures made from it (memory and the step timing are measured once).
ROUND_METRICS = ("latency_forward_ms", "latency_backward_ms", "examples_per_s", "mfu", "bandwidth_util")
# What a round's figures read of the rows: _figures' columns and what tree.estimate_containers sums and writes.
ROUND_COLUMNS = ("path", "parent", "order", "depth", "phase", "status", "module_type", "call_count", "latency_ms",
                 "latency_p25_ms", "latency_p75_ms", "samples", "cpu_time_ms", "device_time_ms", "flops", "bytes_moved",
                 "tflops_per_s", "mfu", "bandwidth_gbps", "bandwidth_util", "arithmetic_intensity", "peak_memory_bytes",
                 "param_bytes", "unsupported_ops", "notes")


def study_url(name: str) -> str:
    return f"studies/{name}/"


@dataclass
class StudyView:
    name: str
    axes: list[dict[str, Any]]  # [{"key", "values"}], grid order
    points: list[dict[str, Any]]  # label, options, status, error, run (Run | None)
    record: dict[str, Any] | None = None
    series: list[str] = field(default_factory=list)
    repeats: dict[str, int] = field(default_factory=dict)  # points by what their spread is over: runs, rounds, single

    @property
    def provider(self) -> str:
        if self.record:
            return str(self.record.get("provider"))
        run = next((p["run"] for p in self.points if p["run"] is not None), None)
        return str(run.meta.get("provider", {}).get("name")) if run else "?"


def find_studies(runs: Sequence[Run]) -> list[StudyView]:
    """Every study with at least one run on the site, by name; its record read from the runs' archive."""
    by_name: dict[str, list[Run]] = {}
    for run in runs:
        study = run.meta.get("study")
        if isinstance(study, dict) and isinstance(study.get("name"), str) and isinstance(study.get("point"), str):
            by_name.setdefault(study["name"], []).append(run)
    views = []
    for name in sorted(by_name):
        members = sorted(by_name[name], key=lambda r: r.run_id)
        newest: dict[str, Run] = {}
        every: dict[str, list[Run]] = {}
        for run in members:
            newest[run.meta["study"]["point"]] = run  # the newest run of a point stands for it
            every.setdefault(run.meta["study"]["point"], []).append(run)
        root = members[0].path.parents[2] if members[0].path is not None else None
        record = cstudy.read_record(root, name) if root is not None else None
        view = _view(name, newest, record)
        for p in view.points:
            p["runs"] = every.get(p["label"], [])  # oldest first; the newest is p["run"]
        views.append(view)
    return views


def _view(name: str, newest: dict[str, Run], record: dict[str, Any] | None) -> StudyView:
    if record is not None:
        axes = [{"key": a["key"], "values": list(a["values"])} for a in record.get("grid", [])]
        points = [{"label": p["label"], "options": p.get("options", {}), "status": p.get("status"),
                   "error": p.get("error"), "run": newest.get(p["label"])} for p in record.get("points", [])]
        listed = {p["label"] for p in points}
        points += [_point(label, run) for label, run in sorted(newest.items()) if label not in listed]
    else:
        points = [_point(label, run) for label, run in sorted(newest.items(), key=lambda kv: kv[1].meta["study"].get("index", 0))]
        keys: list[str] = []
        for p in points:
            keys += [k for k in p["run"].meta["study"].get("axes", list(p["options"])) if k not in keys]
        axes = []
        for k in keys:
            values: list[Any] = []
            for p in points:
                if k in p["options"] and p["options"][k] not in values:
                    values.append(p["options"][k])
            axes.append({"key": k, "values": values})
    for p in points:
        if p["run"] is not None and p["status"] not in ("done",):
            p["status"] = "done"  # a run in the archive is a done point, whatever an older record said
    return StudyView(name, axes, points, record)


def _point(label: str, run: Run) -> dict[str, Any]:
    return {"label": label, "options": dict(run.meta["study"].get("options") or {}), "status": "done", "error": None, "run": run}


# --- figures per point and series ----------------------------------------------------------------------


def _peak(meta: dict[str, Any], key: str) -> float | None:
    device = meta.get("device") or {}
    value = device.get(key)
    if isinstance(value, dict):
        value = next(iter(value.values()), None)
    return value if isinstance(value, (int, float)) and value > 0 else None


def point_figures(run: Run) -> dict[str, dict[str, Any]]:
    """series -> metric -> value for one run (see the module docstring)."""
    return _figures(run.rows, run.meta)


def _figures(rows: pl.DataFrame, meta: dict[str, Any], with_step: bool = True) -> dict[str, dict[str, Any]]:
    """series -> metric -> value of one run's rows (the run's, or one round's); the step timing's with_step."""
    per = lambda col: pl.col(col) * pl.col("call_count").clip(1)  # noqa: E731 - per forward
    batch = (meta.get("config") or {}).get("batch_size")
    peak_flops, peak_bw = _peak(meta, "peak_flops"), _peak(meta, "peak_bandwidth")
    out: dict[str, dict[str, Any]] = {}
    root = {r["phase"]: r for r in rows.filter(pl.col("path") == "").to_dicts()}
    fwd, bwd = root.get("forward", {}), root.get("backward", {})
    step = st if with_step and isinstance(st := meta.get("step"), dict) else {}
    train = t if isinstance(t := step.get("train"), dict) else {}
    fwd_ms = fwd.get("latency_ms")
    model = {
        "latency_forward_ms": fwd_ms, "latency_backward_ms": bwd.get("latency_ms"),
        "examples_per_s": batch / (fwd_ms / 1e3) if batch and fwd_ms else None,
        "mfu": fwd.get("mfu"), "bandwidth_util": fwd.get("bandwidth_util"),
        "peak_memory_bytes": fwd.get("peak_memory_bytes"), "param_bytes": fwd.get("param_bytes"),
    }
    out[MODEL] = model
    ev = e if isinstance(e := step.get("eval"), dict) else {}
    for name, record in ((TRAIN, train), (EVAL, ev)):
        if record.get("status") == "measured":
            out[name] = {"step_examples_per_s": record.get("examples_per_s")}
    children = rows.filter(pl.col("depth") == 1)
    if children.is_empty():
        return out
    short = pl.col("module_type").str.split(".").list.last().alias("group")
    grouped = (children.with_columns(short, per("latency_ms").alias("lat"), per("flops").alias("fl"),
                                     per("bytes_moved").alias("by"))
               .group_by(["group", "phase"])
               .agg(pl.col("lat").sum(), pl.col("lat").null_count().alias("lat_missing"), pl.col("fl").sum(),
                    pl.col("by").sum(), pl.col("peak_memory_bytes").max(), pl.col("param_bytes").sum()))
    for g in grouped.sort(["group", "phase"]).to_dicts():
        series = out.setdefault(g["group"], {})
        lat = g["lat"] if not g["lat_missing"] else None
        if g["phase"] == "forward":
            seconds = lat / 1e3 if lat else None
            series.update(
                latency_forward_ms=lat, param_bytes=g["param_bytes"], peak_memory_bytes=g["peak_memory_bytes"],
                examples_per_s=batch / seconds if batch and seconds else None,
                mfu=g["fl"] / seconds / peak_flops if seconds and g["fl"] and peak_flops else None,
                bandwidth_util=g["by"] / seconds / peak_bw if seconds and g["by"] and peak_bw else None,
            )
        elif g["phase"] == "backward":
            series["latency_backward_ms"] = lat
    return out


def round_medians(samples: pl.DataFrame | None) -> pl.DataFrame | None:
    """(path, phase, round, ms): each round's median ms per call of each timed component, by the collector's rule
    (MIN_CLEAN_BLOCKS); None unless the samples hold two rounds or more."""
    if samples is None or samples.is_empty() or samples["round"].n_unique() < 2:
        return None
    clean = ~pl.col("contended")
    per_round = samples.group_by(["path", "phase", "round"]).agg(
        pl.col("seconds_per_call").filter(clean).median().alias("clean_s"),
        pl.col("seconds_per_call").median().alias("all_s"),
        clean.sum().alias("n_clean"), pl.len().alias("n"))
    flagged = pl.col("n_clean") < pl.min_horizontal(pl.lit(MIN_CLEAN_BLOCKS), pl.col("n"))
    ms = pl.when(flagged).then(pl.col("all_s")).otherwise(pl.col("clean_s")) * 1e3
    return per_round.select("path", "phase", "round", ms.alias("ms")).sort(["round", "path", "phase"])


def round_figures(run: Run) -> list[dict[str, dict[str, Any]]]:
    """The figures of each round of a run collected with rounds (empty for one round): every measured row's
    latency that round's median (its ratios scaled with it), estimated containers summed again from their
    children. Only rounds that timed every component the run timed count: a sum over part of a tree is no
    figure of it."""
    medians = round_medians(run.samples)
    if medians is None:
        return []
    timed = medians.select("path", "phase").unique().height
    peak_flops, peak_bw = _peak(run.meta, "peak_flops"), _peak(run.meta, "peak_bandwidth")
    frame = run.rows.select([c for c in run.rows.columns if c in ROUND_COLUMNS])
    rows = frame.to_dicts()
    out = []
    for (_,), round_ms in medians.group_by(["round"], maintain_order=True):
        if round_ms.height < timed:
            continue
        ms = {(r["path"], r["phase"]): r["ms"] for r in round_ms.iter_rows(named=True)}
        copies = [dict(r) for r in rows]
        for row in copies:
            new = ms.get((row["path"], row["phase"]))
            old = row["latency_ms"]
            if row["status"] != "measured" or new is None or not old or new <= 0:
                continue
            row["latency_ms"] = new
            for ratio in ("tflops_per_s", "mfu", "bandwidth_gbps", "bandwidth_util"):
                if row[ratio] is not None:
                    row[ratio] *= old / new  # the run's own ratio, at this round's latency
        for phase in {r["phase"] for r in copies}:
            tree.estimate_containers(tree.build_tree(r for r in copies if r["phase"] == phase), peak_flops, peak_bw)
        out.append(_figures(pl.DataFrame(copies, schema=frame.schema), run.meta, with_step=False))
    return out


def point_spread(runs: Sequence[Run]) -> tuple[str, dict[tuple[str, str], tuple[float, float, int]]]:
    """What a point's spread is over ("runs", "rounds" or "single") and (series, metric) -> (min, max, repeats)
    for every value measured at least twice: its runs' figures where it has several runs, else its rounds'."""
    if len(runs) >= 2:
        over, repeats, varied = "runs", [point_figures(r) for r in runs], {m for m, _ in METRICS} - set(STATIC_METRICS)
    else:
        over, repeats, varied = "rounds", round_figures(runs[0]) if runs else [], set(ROUND_METRICS)
    spread: dict[tuple[str, str], tuple[float, float, int]] = {}
    for series in sorted({s for figures in repeats for s in figures}):
        for metric in sorted({m for figures in repeats for m in figures.get(series, {})} & varied):
            values = [float(v) for figures in repeats if fmt.finite(v := figures.get(series, {}).get(metric))]
            if len(values) >= 2:
                spread[(series, metric)] = (min(values), max(values), len(values))
    return (over if spread else "single"), spread


def chart_records(view: StudyView) -> list[dict[str, Any]]:
    """Long rows: one per point, series and metric, with the point's options as columns, and the point's spread
    (lo, hi, repeats, over) where it has one."""
    records = []
    view.repeats = {"runs": 0, "rounds": 0, "single": 0}
    for p in view.points:
        if p["run"] is None:
            continue
        over, spread = point_spread(p.get("runs") or [p["run"]])
        view.repeats[over] += 1
        for series, metrics in point_figures(p["run"]).items():
            for metric, value in metrics.items():
                if value is None or (isinstance(value, float) and not math.isfinite(value)):
                    continue
                record = {"label": p["label"], "series": series, "metric": metric, "value": value,
                          **{f"axis:{k}": v for k, v in p["options"].items()}}
                if (series, metric) in spread:
                    lo, hi, n = spread[(series, metric)]
                    record.update(lo=lo, hi=hi, repeats=n, over=over)
                records.append(record)
    view.series = sorted({r["series"] for r in records}, key=lambda s: (s != MODEL, not s.startswith(MODEL), s))
    return records


def interval_text(metric: str, lo: float, hi: float, repeats: int, over: str) -> str:
    """A spread as its tooltip writes it, in the unit of the chart's value: "0.31–0.35 ms, min–max of 5 rounds"."""
    if metric.endswith("_ms"):
        span = fmt.fmt_ms_range(lo, hi)
    elif metric.endswith("examples_per_s"):
        span = f"{fmt.rate(lo)}\u2013{fmt.rate(hi)} examples/s"
    elif metric in ("mfu", "bandwidth_util"):
        span = f"{fmt.fmt_pct(lo)}\u2013{fmt.fmt_pct(hi)}"
    else:
        span = f"{fmt.fmt_bytes(lo)}\u2013{fmt.fmt_bytes(hi)}"
    return f"{span}, min\u2013max of {repeats} {over}"


NO_SPREAD = "none: measured once"  # on a chart with bars, the tooltip of a point without one


def _axis_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def chart_specs(view: StudyView, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """"<axis>|<metric>" -> {"linear": spec, "log": spec} for every axis and metric with values."""
    specs: dict[str, dict[str, Any]] = {}
    for axis in view.axes:
        key = axis["key"]
        others = [a["key"] for a in view.axes if a["key"] != key]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in axis["values"])
        order = [_axis_text(v) for v in axis["values"]]
        for metric, title in METRICS:
            rows = []
            for r in records:
                if r["metric"] != metric or f"axis:{key}" not in r:
                    continue
                held = ", ".join(f"{o}={_axis_text(r.get(f'axis:{o}'))}" for o in others) or "all points"
                row = {"x": r[f"axis:{key}"] if numeric else _axis_text(r[f"axis:{key}"]), "value": r["value"],
                       "series": series_label(r["series"], metric), "label": r["label"], "held": held}
                what = measures(r["series"], metric)
                if what:
                    row["measures"] = what
                if "lo" in r:
                    row.update(lo=r["lo"], hi=r["hi"], interval=interval_text(metric, r["lo"], r["hi"], r["repeats"], r["over"]))
                rows.append(row)
            if not rows:
                continue
            if any("lo" in r for r in rows):  # on a chart with bars, every tooltip says whether its point has one
                for r in rows:
                    r.setdefault("interval", NO_SPREAD)
            # Panels in the grid's order of the other axes' values (sparse_features=4 before 16), not as text.
            grid = [", ".join(f"{o}={_axis_text(v)}" for o, v in zip(others, combo)) or "all points"
                    for combo in itertools.product(*[a["values"] for a in view.axes if a["key"] != key])]
            held_all = {r["held"] for r in rows}
            panels = [h for h in grid if h in held_all] + sorted(held_all - set(grid))
            colours = series_colours(view.series, metric)
            specs[f"{key}|{metric}"] = {scale: vega_spec(_spec(rows, key, metric, title, numeric, order, panels, scale == "log", colours))
                                        for scale in ("linear", "log")}
    return specs


def series_label(series: str, metric: str) -> str:
    """A series as a chart's legend names it: on the forward examples/s chart with what it measures ("DenseArch:
    forward", "model: forward"), so that it never reads as the training step's; elsewhere its name."""
    return f"{series}: forward" if metric == "examples_per_s" else series


def measures(series: str, metric: str) -> str | None:
    """What a value of `series` on `metric`'s chart measures (its tooltip's line); None where the title says it."""
    text = MEASURES.get(series) or MEASURES.get(metric)
    return text.format(series=series) if text else None


def series_colours(series: list[str], metric: str) -> tuple[list[str], list[str]]:
    """(legend labels, colours) of a study's series on `metric`'s chart, the same colour for a series in every chart."""
    classes = [s for s in series if s not in (MODEL, TRAIN, EVAL)]
    colour = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(sorted(classes))}
    colour.update({MODEL: MODEL_COLOUR, TRAIN: MODEL_COLOUR, EVAL: EVAL_COLOUR})
    names = [s for s in (MODEL, TRAIN, EVAL) if s in series] + sorted(classes)
    return [series_label(s, metric) for s in names], [colour[s] for s in names]


# The tooltip's name of a value, per metric (also the value axis's title where the chart's title is long).
UNIT = {"latency_forward_ms": "forward ms", "latency_backward_ms": "backward ms", "step_examples_per_s": "examples/s",
        "examples_per_s": "examples/s", "mfu": "MFU", "bandwidth_util": "bandwidth utilisation",
        "peak_memory_bytes": "peak memory (bytes)", "param_bytes": "parameter bytes"}


def _tip_format(metric: str) -> str:
    """d3-format of a tooltip's value: utilisations as percentages, milliseconds as decimals, the rest SI (4 digits)."""
    if metric in ("mfu", "bandwidth_util"):
        return ".3~%"
    return ".4~r" if metric.endswith("_ms") else ".4~s"


def _axis_format(metric: str) -> str:
    """d3-format of a metric's axis (charts.py's): never exponent notation, never 100,000,000."""
    if metric.endswith("_ms"):
        return MS_FORMAT
    return PERCENT_FORMAT if metric in ("mfu", "bandwidth_util") else "~s"


def _spec(rows: list[dict[str, Any]], key: str, metric: str, title: str, numeric: bool, order: list[str], panels: list[str],
          log: bool, colours: tuple[list[str], list[str]]) -> dict[str, Any]:
    positive = all(r["value"] > 0 for r in rows)
    present = {r["series"] for r in rows}  # a series with no value on this chart gets no legend entry
    y_scale = alt.Scale(type="log") if log and positive else alt.Scale(zero=not log)
    if numeric:
        xs = [r["x"] for r in rows]
        x = alt.X("x:Q", title=key, scale=alt.Scale(type="log") if log and min(xs) > 0 else alt.Scale(zero=False))
    else:
        x = alt.X("x:O", title=key, sort=order)
    y_title = "examples per second" if metric.endswith("examples_per_s") else title  # the chart's title says which
    shown = [(s, c) for s, c in zip(*colours) if s in present]
    colour = alt.Color("series:N", title="series", legend=alt.Legend(labelLimit=260),
                       scale=alt.Scale(domain=[s for s, _ in shown], range=[c for _, c in shown]))
    spread = any("lo" in r for r in rows)
    tooltip = [alt.Tooltip("label:N", title="point"), alt.Tooltip("series:N"),
               *([alt.Tooltip("measures:N", title="measures")] if any(r.get("measures") for r in rows) else []),
               alt.Tooltip("value:Q", title=UNIT.get(metric, "value"), format=_tip_format(metric)),
               *([alt.Tooltip("interval:N", title="spread")] if spread else [])]
    y = alt.Y("value:Q", title=y_title, scale=y_scale, axis=value_axis(_axis_format(metric)))
    data = alt.Data(values=rows)
    line = alt.Chart(alt.Undefined if spread else data).mark_line(point=True).encode(x=x, y=y, color=colour, tooltip=tooltip)
    base: Any = line
    if spread:
        # A bar from the lowest to the highest repeat through each point that has them, in its series' colour;
        # the same y title, so that Vega-Lite does not join "value, lo" into the axis's.
        bars = alt.Chart().transform_filter("isValid(datum.lo)").mark_rule(strokeWidth=2).encode(
            x=x, y=alt.Y("lo:Q", title=y_title, scale=y_scale), y2=alt.Y2("hi:Q"), color=colour, tooltip=tooltip)
        base = alt.layer(line, bars, data=data)
    if len(panels) > 1:
        chart = base.properties(width=260, height=180).facet(
            facet=alt.Facet("held:N", title=None, sort=panels), columns=3).properties(title=title)
    else:
        chart = base.properties(width="container", height=220, title=title)
    return _finish(chart)


def point_rows(view: StudyView) -> list[dict[str, Any]]:
    """The points table: label, options, status, error, the run and its headline figures."""
    out = []
    for p in view.points:
        run = p["run"]
        figures = point_figures(run) if run is not None else {}
        model = figures.get(MODEL, {})
        train_eps = figures.get(TRAIN, {}).get("step_examples_per_s")
        eval_eps = figures.get(EVAL, {}).get("step_examples_per_s")
        out.append({"label": p["label"], "options": [p["options"].get(a["key"]) for a in view.axes],
                    "status": p["status"], "error": p["error"], "run": run,
                    "latency_forward_ms": model.get("latency_forward_ms"), "train_eps": train_eps,
                    "eval_eps": eval_eps, "param_bytes": model.get("param_bytes"), "mfu": model.get("mfu")})
    return out


def config_rows(config: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A study record as (key, value) rows, nested keys dotted ("settings.request.config.max_depth", 2), in key
    order: a list of scalars is one value, the grid one row per axis ("grid.dense_features", [64, 512]), any
    other list of objects one row per item and key ("x.0.y"); an empty object or list is one row, empty."""
    if isinstance(config, dict):
        if not config:
            return [(prefix, None)] if prefix else []
        rows: list[tuple[str, Any]] = []
        for k in sorted(config, key=str):
            rows += config_rows(config[k], f"{prefix}.{k}" if prefix else str(k))
        return rows
    if isinstance(config, (list, tuple)):
        if prefix == "grid" and all(isinstance(a, dict) and set(a) == {"key", "values"} for a in config):
            return [(f"grid.{a['key']}", list(a["values"])) for a in config]
        if any(isinstance(v, (dict, list, tuple)) for v in config):
            return [r for i, v in enumerate(config) for r in config_rows(v, f"{prefix}.{i}")]
        return [(prefix, list(config) or None)]
    return [(prefix, config)]


def render(views: list[StudyView], docs: Path, writer: Any, dump_json: Any) -> list[dict[str, str]]:
    """Write every study page and its charts.json; returns the nav entries."""
    nav = []
    for view in views:
        url = study_url(view.name)
        records = chart_records(view)
        specs = chart_specs(view, records)
        dump_json(specs, docs / url / "charts.json")
        charts = [{"key": k, "axis": k.split("|")[0], "title": dict(METRICS)[k.split("|")[1]]} for k in specs]
        config = {k: v for k, v in (view.record or {}).items() if k != "points"}
        if isinstance(config.get("executor"), dict):
            config["executor"] = {k: v for k, v in config["executor"].items() if k != "folder"}  # a local path
        writer.page(url, "pages/study.md.j2", study=view, charts=charts, rows=point_rows(view),
                    config=config_rows(config), repeats=view.repeats)
        nav.append({view.name: f"{url}index.md"})
    return nav
