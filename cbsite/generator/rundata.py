"""One run -> the data its page needs: a summary context for the template and JSON/CSV files for the browser.

The table, the icicle and the component details all read one columnar `components.json` per run (columns,
not row objects, because a 10,000-component run must stay a few MB), fetched by the page, never inlined.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import polars as pl

from cbsite import archive, artifacts, bound, schema
from cbsite.archive import Run

# Per-phase columns the browser needs; the rest of the schema is in the Parquet/CSV downloads.
PHASE_COLUMNS = (
    "status", "error", "latency_ms", "latency_p25_ms", "latency_p75_ms", "samples", "cpu_time_ms",
    "device_time_ms", "flops", "tflops_per_s", "mfu", "bytes_moved", "bandwidth_gbps", "bandwidth_util",
    "arithmetic_intensity", "peak_memory_bytes", "unsupported_ops", "notes", "input_shapes",
    "trace_file", "memory_file", "log_file",
)
LINK_COLUMNS = ("trace_file", "memory_file", "log_file")
# Plugin columns (compile, numerics, any plugin's metrics): sent only when some row of the run has a value.
OPTIONAL_COLUMNS = tuple(f.name for f in getattr(schema, "PLUGIN_FIELDS", []))
TOP_COMPONENTS = 15  # listed in the page's HTML so that search finds a run by its hottest paths


def _compact(value: Any) -> Any:
    """Round floats to 4 significant digits for display data (the downloads keep full precision)."""
    if type(value) is float:  # the common case first: this runs once per number of every run
        if value != value or value in (_INF, -_INF):
            return None  # JSON has no NaN/inf; a missing number is shown as a dash
        return float("%.4g" % value)
    if isinstance(value, list):
        return [_compact(v) for v in value]
    return value


_INF = math.inf
_isfinite = math.isfinite


def compact_column(values: list[Any], digits: int = 4) -> list[Any]:
    """`[_compact(v) for v in values]`, the same values in a fraction of the time: a column without floats or
    lists is copied as is, and every float of a column is formatted in one `%` operation and parsed back with
    `map(float, ...)` instead of one Python call per number. Floats keep `digits` significant digits."""
    types = set(map(type, values))
    if float not in types:
        if not any(issubclass(t, list) for t in types):
            return list(values)
        return [_compact(v) if isinstance(v, list) else v for v in values]
    floats = values if len(types) == 1 else [v for v in values if type(v) is float]
    rounded: list[Any] = list(map(float, (f"%.{digits}g " * len(floats) % tuple(floats)).split()))
    if not all(map(_isfinite, rounded)):
        rounded = [r if _isfinite(r) else None for r in rounded]
    if len(floats) == len(values):
        return rounded
    it = iter(rounded)
    return [next(it) if type(v) is float else _compact(v) if isinstance(v, list) else v for v in values]


@dataclass
class RunData:
    """What a run page shows, ready for the template, and the files it writes beside the page."""

    run: Run
    totals: dict[str, dict[str, Any]]  # phase -> metric -> per-forward total of the whole model
    top: list[dict[str, Any]]  # hottest leaves by forward latency per forward
    phases: list[str]
    has_ops: bool
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> status -> components
    facts: dict[str, Any] = field(default_factory=dict)  # key_facts: slowest per phase, bounds, notes, compile
    paths: list[str] = field(default_factory=list)  # every component path, for the search entries (searchpaths.py)
    roofline: bool = False  # a roofline.json was written beside the page
    warnings: list[str] = field(default_factory=list)


SUSPECT = "suspect"  # the bound of a row that beats a peak


def site_bounds(cols: dict[str, list[Any]]) -> list[str | None]:
    """What bounds each row's time (cbsite/bound.py: compute, memory or overhead), or "suspect" where its MFU or
    its bandwidth utilisation is above 100 %: a row that beats a peak is a counting or timing suspect (bytes
    served from a cache, counted once per rank; a peak the run could not confirm), never the best of a roof.
    A sharded run's communicating rows (a `kind` column, rankdata.py) are "communication" (bound.with_kind)."""
    over = bound.above_a_peak(cols["mfu"], cols["bandwidth_util"])
    labels = bound.classify_columns(cols["mfu"], cols["bandwidth_util"], cols["latency_ms"], cols["device_time_ms"])
    out = [SUSPECT if o else b for o, b in zip(over, labels)]
    return bound.with_kind(out, cols["kind"]) if "kind" in cols else out


def search_terms(path: str) -> list[str]:
    """Every tail of `path` that starts after a `.` or a `_`, longest first: "mlp.1._linear", "bag_collection",
    "cat_3" of their paths. Search matches the start of a word (Material's lunr adds a trailing wildcard) and its
    separator keeps a path one word, so a query for the middle of a path matches the start of one of these."""
    return list(dict.fromkeys(path[i + 1:] for i, ch in enumerate(path) if ch in "._" and path[i + 1:]))


def _safe_link(run: Run, link: str | None, warnings: list[str], published: frozenset[str] = frozenset()) -> str | None:
    """A run-relative link to an artifact the site publishes (`artifacts.is_publishable_link`: inside the run's
    artifacts folder, a real file of a known type); anything else is dropped with a warning. `published`: the
    run's publishable files (`artifacts.publishable`, one walk of the folder), a quick yes for most links."""
    if not link:
        return None
    rel = PurePosixPath(link)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        warnings.append(f"run {run.run_id}: ignored link {link!r} that points outside the run folder")
        return None
    if link in published and not any(part.startswith(".") for part in rel.parts):
        return rel.as_posix()
    assert run.path is not None
    if not (run.path / rel).is_file():
        warnings.append(f"run {run.run_id}: ignored link {link!r}: the file is missing")
        return None
    if not artifacts.is_publishable_link(run.path, link):
        warnings.append(f"run {run.run_id}: ignored link {link!r}: not an artifact the site publishes")
        return None
    return rel.as_posix()


def _has_values(column: pl.Series) -> bool:
    """`any(v not in (None, []) for v in column)`, in polars: a value that is not null (nor an empty list)."""
    if isinstance(column.dtype, pl.List):
        return bool((column.list.len() > 0).any())
    return column.null_count() < column.len()


def _struct_list(dtype: Any) -> bool:
    """A column of lists of structs (plugin_metrics), whose values to_list gives as lists of dicts."""
    return isinstance(dtype, pl.List) and isinstance(dtype.inner, pl.Struct)


def components_json(run: Run, warnings: list[str],
                    publishable: tuple[list[Any], list[str]] | None = None) -> dict[str, Any]:
    """The columnar per-component data of a run: identity once, then each phase's metrics.

    Built from columns, not row dicts: each column is read once and compacted in one pass (`compact_column`).
    `publishable`: artifacts.publishable of the run's folder, when the caller has it already.
    """
    rows = run.rows.sort(["order", "phase"])
    if publishable is None and run.path is not None:
        publishable = artifacts.publishable(run.path)
    published = frozenset(f"{archive.ARTIFACTS_DIR}/{name}" for _, name in publishable[0]) \
        if publishable is not None else frozenset()
    # A path's identity comes from its first row (in order, then phase); a phase's values from its last row.
    first = rows.unique("path", keep="first", maintain_order=True)
    paths: list[str] = first.get_column("path").to_list()
    index = {p: i for i, p in enumerate(paths)}
    phase_rows = {p: rows.filter(pl.col("phase") == p).unique("path", keep="last", maintain_order=True)
                  for p in schema.PHASES}
    data: dict[str, Any] = {
        "model": run.model,
        "version": run.version,
        "run_id": run.run_id,
        "phases": [p for p in schema.PHASES if phase_rows[p].height],
        "path": paths,
        # Parent as an index into these arrays (-1 for the root); pre-order, so a parent precedes its children.
        "parent": [index.get(pp, -1) if pp is not None else -1 for pp in first.get_column("parent").to_list()],
    }
    for col in ("name", "depth", "module_type", "call_count", "is_leaf", "param_bytes", "param_count"):
        data[col] = compact_column(first.get_column(col).to_list())
    n = len(paths)
    for phase in data["phases"]:
        prows = phase_rows[phase]
        # Row position in `paths` of each of the phase's rows; the other positions have no row (all None).
        where = [index[p] for p in prows.get_column("path").to_list()]
        has_row = [False] * n
        for i in where:
            has_row[i] = True

        def aligned(values: list[Any]) -> list[Any]:  # used within this iteration only
            if len(where) == n and where == list(range(n)):  # noqa: B023
                return values
            out: list[Any] = [None] * n
            for i, v in zip(where, values):  # noqa: B023
                out[i] = v
            return out

        present = [c for c in OPTIONAL_COLUMNS if c in prows.columns and _has_values(prows.get_column(c))]
        raw = {c: prows.get_column(c).to_list() for c in (*PHASE_COLUMNS, *present) if c in prows.columns}
        cols: dict[str, list[Any]] = {}
        for col in (*PHASE_COLUMNS, *present):
            values = aligned(raw[col]) if col in raw else [None] * n
            if col in LINK_COLUMNS:
                values = [_safe_link(run, v, warnings, published) if ok and v else None for v, ok in zip(values, has_row)]
            elif col in raw and _struct_list(prows.schema[col]):
                # plugin_metrics: [{name, value}] -> ["name=value"], as the details panel lists it
                values = [[f"{m.get('name')}={_compact(m.get('value'))}" for m in v]
                          if isinstance(v, list) and v and isinstance(v[0], dict) else v for v in values]
            cols[col] = compact_column(values)
        cols["bound"] = site_bounds(cols)
        data[phase] = cols
    data["optional"] = sorted({c for p in data["phases"] for c in OPTIONAL_COLUMNS if c in data[p]})
    peak_flops, peak_bw = bound.peaks(run.meta)
    data["roofline"] = {"peak_flops": peak_flops, "peak_bandwidth": peak_bw, "ridge": bound.ridge(run.meta)}
    return data


def ops_json(run: Run) -> dict[str, Any] | None:
    """Top ops per component and phase, grouped for lazy lookup; None when the run has no ops.parquet.

    The ops table's columns are the collector's; only `path` and `phase` are required here.
    """
    ops = run.ops
    if ops is None or ops.is_empty() or not {"path", "phase"} <= set(ops.columns):
        return None
    keep = [c for c in ops.columns if c not in ("run_id", "model", "version", "path", "phase")]
    grouped: dict[str, dict[str, list[list[Any]]]] = {}
    order = [c for c in ("path", "phase", "rank") if c in ops.columns]
    for row in ops.sort(order, maintain_order=True).iter_rows(named=True):
        grouped.setdefault(row["path"], {}).setdefault(row["phase"], []).append([_compact(row[c]) for c in keep])
    return {"columns": keep, "components": grouped}


def totals(run: Run) -> dict[str, dict[str, Any]]:
    """Whole-model figures per phase from the root row (per forward: the root is called once)."""
    out: dict[str, dict[str, Any]] = {}
    for row in run.rows.filter(pl.col("path") == "").sort("phase").to_dicts():
        calls = max(row["call_count"] or 1, 1)
        out[row["phase"]] = {
            "status": row["status"],
            "latency_ms": row["latency_ms"] * calls if row["latency_ms"] is not None else None,
            "latency_p25_ms": row["latency_p25_ms"],
            "latency_p75_ms": row["latency_p75_ms"],
            "flops": row["flops"] * calls if row["flops"] is not None else None,
            "tflops_per_s": row["tflops_per_s"],
            "mfu": row["mfu"],
            "bytes_moved": row["bytes_moved"],
            "bandwidth_util": row["bandwidth_util"],
            "param_bytes": row["param_bytes"],
            "param_count": row["param_count"],
            "peak_memory_bytes": row["peak_memory_bytes"],
        }
    return out


def hottest(run: Run, n: int = TOP_COMPONENTS) -> list[dict[str, Any]]:
    """Leaves with the largest forward latency per forward of the model."""
    fwd = run.rows.filter((pl.col("phase") == "forward") & pl.col("is_leaf") & pl.col("latency_ms").is_not_null())
    fwd = fwd.with_columns((pl.col("latency_ms") * pl.col("call_count")).alias("latency_per_forward"))
    fwd = fwd.sort(["latency_per_forward", "order"], descending=[True, False]).head(n)
    return fwd.select(["path", "module_type", "call_count", "latency_per_forward", "status"]).to_dicts()


ROUTINE_NOTES = ("container: never called on its own", "estimated: sum of children")  # said by the status already
SLOWEST_N = 8
COMPILE_N = 3
OWN_MIN_SHARE = 0.02  # a container's own time listed among the slowest from 2 % of the phase
NEST_SLACK = 0.05  # a child up to 5 % over its parent still nests (two independent timings of the same work)


def own_time(comps: dict[str, Any], phase: str, calls: list[int]) -> dict[int, float]:
    """Per measured container of `phase`: its latency per forward that none of its children covers (ms), where
    positive; sizes as the icicle lays them out (a child without a latency counts as the sum of its own). Only
    where the numbers nest: the container and its ancestors each within their parent (+5 %), and none of its
    children smaller than the children under it (an under-measured child would inflate its parent's own time);
    elsewhere independent timings disagree and a difference of them is no one's own time."""
    n, parent, cols = len(comps["path"]), comps["parent"], comps[phase]
    size, kids_sum = [0.0] * n, [0.0] * n
    kids: list[list[int]] = [[] for _ in range(n)]
    for i in range(n - 1, -1, -1):  # pre-order: children after their parent
        v = cols["latency_ms"][i]
        size[i] = v * calls[i] if v is not None and v >= 0 else kids_sum[i]
        if parent[i] >= 0:
            kids_sum[parent[i]] += size[i]
            kids[parent[i]].append(i)
    nests = [True] * n
    for i in range(n):
        p = parent[i]
        nests[i] = p < 0 or (nests[p] and size[i] <= size[p] * (1 + NEST_SLACK))
    overflow = [kids_sum[i] > size[i] * (1 + NEST_SLACK) for i in range(n)]
    return {i: size[i] - kids_sum[i] for i in range(n)
            if kids[i] and cols["status"][i] == "measured" and cols["latency_ms"][i] is not None
            and size[i] - kids_sum[i] > 0 and nests[i] and not any(overflow[k] for k in kids[i])}


def key_facts(comps: dict[str, Any]) -> dict[str, Any]:
    """What a reader should see first, per phase: the slowest leaves (with their share of the phase and what
    bounds them) and the measured containers' own time (`own_time`: the part no child covers, the icicle's
    self share) ranked with them, where the leaves' time goes by bound (cbsite/bound.py) and the leaves' share
    of the phase, the components' notes grouped by text, the compile plugin's whole-model speed-up with its
    best and worst components, and the rows whose bandwidth utilisation is above 100 %."""
    n = len(comps["path"])
    leaves = [i for i in range(n) if comps["is_leaf"][i]]
    calls = [max(c or 0, 1) for c in comps["call_count"]]
    label = lambda i: comps["path"][i] or comps["model"]  # noqa: E731
    out: dict[str, Any] = {"slowest": {}, "bounds": {}, "leaf_share": {}, "notes": [], "compile": {},
                           "bandwidth_over_peak": {}}
    notes: dict[str, list[str]] = {}
    for phase in comps["phases"]:
        cols = comps[phase]
        per_forward = {i: cols["latency_ms"][i] * calls[i] for i in leaves if cols["latency_ms"][i] is not None}
        total = comps[phase]["latency_ms"][0] if n and comps["path"][0] == "" else None
        total = total * calls[0] if total is not None else sum(per_forward.values())
        own = own_time(comps, phase, calls)
        if total:  # a container's own time is named when it is a real part of the phase, not timing noise
            own = {i: t for i, t in own.items() if t >= OWN_MIN_SHARE * total}
        ranked = sorted([(t, i, False) for i, t in per_forward.items()] + [(t, i, True) for i, t in own.items()],
                        key=lambda e: (-e[0], e[1]))[:SLOWEST_N]
        out["slowest"][phase] = [{"path": label(i), "module_type": comps["module_type"][i], "latency": t,
                                  "calls": calls[i], "share": t / total if total else None,
                                  "bound": None if is_own else cols["bound"][i], "own": is_own}
                                 for t, i, is_own in ranked]
        leaf_time = sum(per_forward.values())
        if total and leaf_time > 0:
            out["leaf_share"][phase] = leaf_time / total
        if leaf_time > 0:
            by: dict[str, float] = {}
            for i, t in per_forward.items():
                key = cols["bound"][i] or "no label"
                by[key] = by.get(key, 0.0) + t
            out["bounds"][phase] = [{"bound": b, "share": by[b] / leaf_time}
                                    for b in (*bound.BOUNDS, SUSPECT, bound.COMMUNICATION, "no label") if by.get(b)]
        # Rows that read more bytes per second than the device's peak: named in the page's warnings.
        over = sorted((-v, i) for i, v in enumerate(cols["bandwidth_util"]) if isinstance(v, (int, float)) and v > 1)
        if over:
            out["bandwidth_over_peak"][phase] = {"count": len(over),
                                                 "top": [{"path": label(i), "util": -v} for v, i in over[:3]]}
        for i in range(n):
            for note in cols["notes"][i] or []:
                if not note.startswith(ROUTINE_NOTES):
                    where = f"{label(i)} ({phase})"
                    notes.setdefault(note, []).append(where)
        if "compile_speedup" in cols:
            sp = [(cols["compile_speedup"][i], i) for i in range(n) if cols["compile_speedup"][i] is not None]
            if sp:
                root = cols["compile_speedup"][0] if comps["path"][0] == "" else None
                ordered = sorted(sp, key=lambda t: (-t[0], t[1]))
                pick = lambda items: [{"path": label(i), "speedup": v, "compiled_ms": cols["compiled_latency_ms"][i]}  # noqa: E731, B023
                                      for v, i in items if i != 0]
                out["compile"][phase] = {"model": root, "best": pick(ordered[:COMPILE_N + 1])[:COMPILE_N],
                                         "worst": pick(ordered[::-1][:COMPILE_N + 1])[:COMPILE_N]}
    merged = merge_notes(notes)
    out["notes"] = [{"note": k, "where": v[:4], "more": max(0, len(v) - 4)}
                    for k, v in sorted(merged.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:6]]
    return out


NUMBER = re.compile(r"\d+(?:\.\d+)?")


def merge_notes(notes: dict[str, list[str]]) -> dict[str, list[str]]:
    """Notes that differ only in their numbers as one note, each differing number written as its range
    ("run-to-run spread 0.4-83.9% over 7 rounds", once six lines of one spread each and the 83.9 % cut off by
    the six); its places the largest first by the last number that differs, each with that number
    ("dlrm (forward) 83.9%"), so the outlier is named first."""
    groups: dict[str, list[str]] = {}
    for note in notes:
        groups.setdefault(NUMBER.sub("#", note), []).append(note)
    out: dict[str, list[str]] = {}
    for texts in groups.values():
        if len(texts) == 1:
            out[texts[0]] = notes[texts[0]]
            continue
        numbers = [NUMBER.findall(t) for t in texts]
        columns = list(zip(*numbers))
        pieces = NUMBER.split(texts[0])
        text, last = pieces[0], None
        for k, (col, piece) in enumerate(zip(columns, pieces[1:])):
            lo, hi = min(col, key=float), max(col, key=float)
            if float(lo) == float(hi):
                text += lo
            else:
                text += f"{lo}\u2013{hi}"
                last = k
            text += piece
        unit = "%" if last is not None and pieces[last + 1].startswith("%") else ""
        places = [(-float(nums[last]) if last is not None else 0.0, j, f"{w} {nums[last]}{unit}" if last is not None else w)
                  for j, (t, nums) in enumerate(zip(texts, numbers)) for w in notes[t]]
        out[text] = [w for _, _, w in sorted(places, key=lambda e: (e[0], e[1]))]
    return out


def write_run_files(run: Run, folder: Path, data: dict[str, Any], ops: dict[str, Any] | None, dump) -> None:
    """Write the run's data files for the browser and its downloads into `folder` (in the docs tree)."""
    assert run.path is not None
    folder.mkdir(parents=True, exist_ok=True)
    dump(data, folder / "components.json")
    if ops is not None:
        dump(ops, folder / "ops.json")
    shutil.copyfile(run.path / archive.COMPONENTS_FILE, folder / "components.parquet")
    run.flat_table().write_csv(folder / "components.csv")


def copy_artifacts(run: Run, folder: Path, warnings: list[str] | None = None) -> int:
    """Publish the run's artifacts into the built site (after mkdocs, which would take a `.md` artifact for a
    page): only known types from real files inside the run, cleaned (see cbsite/artifacts.py). Written, not
    linked: editing the site never edits the archive. Files that cannot be published are named in `warnings`
    (refused entries are already reported by `runpagedata.run_data`)."""
    assert run.path is not None
    files, _ = artifacts.publishable(run.path)
    count, problems = artifacts.publish(files, folder / archive.ARTIFACTS_DIR)
    if warnings is not None:
        warnings.extend(f"run {run.run_id}: {p}" for p in problems)
    return count
