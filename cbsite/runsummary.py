"""A run in a few lines: `repr(run)` (text) and `run._repr_html_()` (a small table for notebooks), and the top
components that `cbsite show` lists too, so a notebook and a terminal read the same figures.

Every number goes through cbsite.format; the root row (path "") is shown with the model's name, as everywhere
(the Parquet keeps path ""). The HTML is a handful of escaped cells: a notebook repr has no template engine
(jinja2 belongs to the generator)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import polars as pl

from cbsite import format as fmt
from cbsite.diff.record import display_path, short_type

if TYPE_CHECKING:
    from cbsite.archive import Run

TOP = 5  # components listed besides the whole model
MAX_PATH = 60  # characters of a component path in the text summary; the middle of a longer one is elided
COLUMNS = ("component", "type", "calls", "fwd", "bwd", "FLOP fwd", "MFU fwd", "params")


def top_components(run: Run, top: int) -> list[dict[str, Any]]:
    """The `top` components (root apart) by forward time per forward of the model, in tree order, one dict per
    component with its forward and backward figures side by side."""
    rows = run.table()
    wide = rows.pivot(on="phase", index=["order", "path", "depth", "module_type", "status", "call_count", "param_bytes"],
                      values=["latency_ms", "flops", "mfu", "bandwidth_util"], aggregate_function="first")
    fwd_col = "latency_ms_forward" if "latency_ms_forward" in wide.columns else "latency_ms"
    wide = wide.filter(pl.col("path") != "").sort(pl.col(fwd_col).fill_null(0) * pl.col("call_count").clip(1),
                                                  descending=True).head(top)
    return wide.sort("order").to_dicts()


def _root(run: Run) -> dict[str, Any]:
    """The whole model's row in the shape `top_components` gives: `<phase>` suffixed figures."""
    out: dict[str, Any] = {}
    for row in run.rows.filter(pl.col("path") == "").to_dicts():
        out.update({k: row[k] for k in ("path", "depth", "module_type", "status", "call_count", "param_bytes")})
        for metric in ("latency_ms", "flops", "mfu", "bandwidth_util"):
            out[f"{metric}_{row['phase']}"] = row[metric]
    return out


def _cells(row: dict[str, Any], model: str) -> tuple[str, ...]:
    """One table row as text: the root named by the model, every figure as the site writes it."""
    path = display_path(row["path"], model) + (" (whole model)" if row["path"] == "" else "")
    return (path, short_type(row["module_type"]), str(row["call_count"]), fmt.fmt_time(row.get("latency_ms_forward")),
            fmt.fmt_time(row.get("latency_ms_backward")), fmt.fmt_flops(row.get("flops_forward")),
            fmt.fmt_pct(row.get("mfu_forward")), fmt.fmt_bytes(row.get("param_bytes")))


def _table(run: Run, root: dict[str, Any], top: int) -> list[tuple[str, ...]]:
    """The whole model's cells, then the top components'."""
    model = run.meta["model"]
    return [_cells(r, model) for r in ([root] if root else []) + top_components(run, top)]


def _device(meta: dict[str, Any]) -> str:
    """"AMD EPYC (cpu, 1 thread), float32, peak 112 GFLOP/s (calibrated)"."""
    dev = d if isinstance(d := meta.get("device"), dict) else {}
    peaks = dev.get("peak_flops")
    peak = next(iter(peaks.values()), None) if isinstance(peaks, dict) and peaks else None
    source = dev.get("peak_source")
    source = source.get("flops") if isinstance(source, dict) else source
    n = dev.get("num_threads")
    threads = f", {n} thread{'' if n == 1 else 's'}" if n else ""
    return (f"{dev.get('name', '?')} ({dev.get('kind', '?')}{threads}), {meta.get('dtype', '?')}, "
            f"peak {fmt.si(peak, 'FLOP/s')} ({source or 'unknown'})")


def _phases(root: dict[str, Any]) -> str:
    """The whole model per phase: "forward 52.1 µs, 67.6 kFLOP; backward 98 µs, 135 kFLOP"."""
    phases = [p for p in ("forward", "backward") if f"latency_ms_{p}" in root]
    return "; ".join(f"{p} {fmt.fmt_time(root[f'latency_ms_{p}'])}, {fmt.fmt_flops(root.get(f'flops_{p}'))}"
                     for p in phases)


def _short(path: str) -> str:
    if len(path) <= MAX_PATH:
        return path
    half = (MAX_PATH - 1) // 2
    return path[:half] + "\u2026" + path[-half:]


def run_text(run: Run, top: int = TOP) -> str:
    """`repr(run)`: model@version, run id, device, the whole model per phase, counts, the top components."""
    meta = run.meta
    model = meta["model"]
    root = _root(run)
    rows = [(_short(r[0]),) + r[1:] for r in _table(run, root, top)]
    widths = [max(len(c[i]) for c in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    table = ["  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip() for cells in [COLUMNS, *rows]]
    where = f"saved at {run.path}" if run.path else "not saved: run.save('runs') archives it"
    return "\n".join([
        f"<cbsite.Run {model}@{meta['version']} {meta['run_id']}>",
        f"device: {_device(meta)}",
        f"{model} (whole model): {_phases(root)}",
        f"components: {fmt.counts(meta)}",
        f"the whole model and its top {top} components by forward time (run.table() has every row):",
        *table,
        where,
    ])


def run_html(run: Run, top: int = TOP) -> str:
    """`run._repr_html_()`: the same summary as a small table; no links (a notebook may sit anywhere)."""
    meta = run.meta
    model = meta["model"]
    root = _root(run)
    rows = _table(run, root, top)
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>" for cells in rows)
    return (f"<div class=\"cbsite-run\"><p><b>{e(model)}@{e(meta['version'])}</b> run {e(meta['run_id'])}<br>"
            f"{e(_device(meta))}<br>{e(model)} (whole model): {e(_phases(root))}<br>"
            f"components: {e(fmt.counts(meta))}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")
