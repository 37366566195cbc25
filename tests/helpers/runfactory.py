"""Synthetic runs for tests: valid rows, Runs and archives from a small tree spec, and a hypothesis strategy.

    from tests.helpers.runfactory import make_rows, make_run, write_archive, trees

    spec = {"": {"a": {"a.x": None, "a.y": None}, "b": None}}   # full paths as keys; None marks a leaf
    run = make_run(spec, model="m", version="v1",
                   metrics={"a.x": {"flops": 1000, "call_count": 2},
                            "a": {"status": "measured", "latency_ms": 0.01}})
    write_archive(tmp_path / "runs", [run])          # -> [Path of the saved run]

What comes out
    Rows with every schema column, both phases (or `phases=`), pre-order `order`, `parent`/`name`/`depth`
    consistent, ratios filled by `cbsite.tree.derive_ratios`. `make_rows` asserts
    `cbsite.tree.self_check(build_tree(...))` on each phase before returning.

What `metrics` means: a component's OWN per-call values, in the forward phase
    * a leaf's values are its values; a leaf without values gets deterministic defaults from its path;
    * a container is `estimated` unless `"status": "measured"` is given: its additive metrics are its
      children's per-call x call_count sums (by `cbsite.tree.estimate_containers`, as the collector does),
      so it cannot take additive values of its own;
    * a measured container's number is its children's sums plus the own values given (its self share);
    * `param_bytes` of any container = its children's + own (default 0; unique params are never shared here);
      `peak_memory_bytes` of a measured container = largest child's + own; of an estimated one, largest child's;
    * `"status": "failed"` or `"skipped"` leaves the metrics null (param_bytes, static, stays).
    Keys: flops, latency_ms, bytes_moved, cpu_time_ms, param_bytes, peak_memory_bytes (own values);
    call_count (default 1), status, module_type, iqr (IQR width as a fraction of latency, default 0.1),
    samples, error.
    The backward phase takes the forward values x BACKWARD_FACTOR (flops, latency, bytes, cpu time) and
    x1.5 peak memory. `phase_metrics={"backward": {path: {...}}}` overrides any key in one phase only.

`trees()` draws a `SyntheticTree` (spec + metrics) with random shape, call counts, measured containers and
values; `.rows()` / `.run()` build it, and `.with_metrics()`, `.without()`, `.with_subtree()` derive a
modified copy (a head revision) without touching the original.

`run_id` defaults to a per-process counter (`20250101T00000NZ-00000n`), unique and sorted; pass
`run_id=` for anything golden.
"""

from __future__ import annotations

import copy
import itertools
import zlib
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

import polars as pl
import pyarrow as pa
from hypothesis import strategies as st

from cbsite import schema
from cbsite.archive import Run, rows_to_table
from cbsite.tree import Tree, build_tree, derive_ratios, estimate_containers, self_check

Spec = Mapping[str, Any]  # {path: None (leaf) | Spec (children)}

PEAK_FLOPS = 1e12  # denominators recorded in the synthetic run.json
PEAK_BANDWIDTH = 1e11
BACKWARD_FACTOR = 2
OWN_KEYS = ("flops", "latency_ms", "bytes_moved", "cpu_time_ms", "param_bytes", "peak_memory_bytes")
PER_CALL_KEYS = ("flops", "latency_ms", "bytes_moved", "cpu_time_ms")  # summed per call x calls
OTHER_KEYS = ("call_count", "status", "module_type", "iqr", "samples", "error")
LEAF_TYPE = "torch.nn.modules.linear.Linear"
CONTAINER_TYPE = "torch.nn.modules.container.Sequential"
ROOT_TYPE = "synthetic.Model"

_run_counter = itertools.count()


# --- spec helpers ------------------------------------------------------------------------------


def flatten(spec: Spec) -> list[tuple[str, list[str]]]:
    """(path, child paths) in pre-order; checks that every key is its parent's path plus one segment."""
    if list(spec) != [""]:
        raise ValueError(f"a tree spec has exactly one root key '', got {list(spec)}")
    out: list[tuple[str, list[str]]] = []

    def visit(path: str, children: Spec | None) -> None:
        kids = list(children or {})
        for kid in kids:
            expected = kid.rsplit(".", 1)[0] if "." in kid else ""
            if expected != path or "" in kid.split("."):
                raise ValueError(f"spec key {kid!r} is not a child path of {path!r}")
        out.append((path, kids))
        for kid in kids:
            visit(kid, (children or {})[kid])

    visit("", spec[""])
    return out


def _leaf_defaults(path: str) -> dict[str, Any]:
    """Plausible, deterministic numbers for a leaf that was given none."""
    h = zlib.crc32(path.encode())
    latency = 0.001 * (1 + h % 89)
    return {
        "flops": 1000 * (1 + h % 997),
        "latency_ms": latency,
        "bytes_moved": 64 * (1 + h % 509),
        "cpu_time_ms": latency,
        "param_bytes": 4 * (h % 4096),
        "peak_memory_bytes": 1024 * (1 + h % 300),
    }


# --- rows --------------------------------------------------------------------------------------


def make_rows(
    tree_spec: Spec,
    *,
    model: str = "m",
    version: str = "v1",
    run_id: str | None = None,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
    phase_metrics: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    phases: Iterable[str] = schema.PHASES,
) -> list[dict[str, Any]]:
    """Valid component rows for `tree_spec`, every phase in `phases` (see the module docstring)."""
    return _rows_and_table(tree_spec, model=model, version=version, run_id=run_id, metrics=metrics,
                           phase_metrics=phase_metrics, phases=phases)[0]


def _rows_and_table(
    tree_spec: Spec,
    *,
    model: str,
    version: str,
    run_id: str | None,
    metrics: Mapping[str, Mapping[str, Any]] | None,
    phase_metrics: Mapping[str, Mapping[str, Mapping[str, Any]]] | None,
    phases: Iterable[str],
) -> tuple[list[dict[str, Any]], pa.Table]:
    """`make_rows`'s rows and their Arrow table, made once: the table is the check that every column and type fits
    the contract, and `make_run`'s frame."""
    run_id = run_id or _next_run_id()
    metrics = metrics or {}
    phase_metrics = phase_metrics or {}
    nodes = flatten(tree_spec)
    known = {p for p, _ in nodes}
    for where, table in [("metrics", metrics)] + [(f"phase_metrics[{ph!r}]", t) for ph, t in phase_metrics.items()]:
        for path, values in table.items():
            if path not in known:
                raise ValueError(f"{where} names {path!r}, which is not in the tree spec")
            bad = sorted(set(values) - set(OWN_KEYS) - set(OTHER_KEYS))
            if bad:
                raise ValueError(f"{where}[{path!r}] has unknown keys {bad}")
    rows: list[dict[str, Any]] = []
    for phase in phases:
        if phase not in schema.PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        phase_rows = _phase_rows(nodes, model, version, run_id, phase, metrics, phase_metrics.get(phase, {}))
        self_check(build_tree(phase_rows))
        rows.extend(phase_rows)
    return rows, rows_to_table(rows)


def _phase_rows(
    nodes: list[tuple[str, list[str]]],
    model: str,
    version: str,
    run_id: str,
    phase: str,
    metrics: Mapping[str, Mapping[str, Any]],
    overrides: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    specs: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for order, (path, kids) in enumerate(nodes):
        leaf = not kids
        given = dict(metrics.get(path, {}))
        if phase == "backward":
            given = _backward(given)
        own = ({} if not leaf else (_backward(_leaf_defaults(path)) if phase == "backward" else _leaf_defaults(path)))
        own.update(given)
        own.update(overrides.get(path, {}))
        status = own.get("status", "measured" if leaf else "estimated")
        if status == "estimated" and any(k in own for k in PER_CALL_KEYS):
            raise ValueError(f"{path!r} is an estimated container: its additive metrics are its children's sums")
        specs[path] = own
        row = schema.empty_row()
        row.update(
            run_id=run_id,
            model=model,
            version=version,
            path=path,
            parent=None if path == "" else (path.rsplit(".", 1)[0] if "." in path else ""),
            name=path.rsplit(".", 1)[-1],
            depth=0 if path == "" else path.count(".") + 1,
            module_type=own.get("module_type", ROOT_TYPE if path == "" else (LEAF_TYPE if leaf else CONTAINER_TYPE)),
            is_leaf=leaf,
            order=order,
            call_count=int(own.get("call_count", 1)),
            phase=phase,
            status=status,
            error=own.get("error", {"failed": "synthetic failure", "skipped": "filtered out"}.get(status)),
            unsupported_ops=[],
            notes=[],
        )
        rows.append(row)

    tree = build_tree(rows)
    for node in reversed(list(tree)):  # children first
        own, row = specs[node.path], node.row
        kids = node.children
        row["param_bytes"] = sum(c["param_bytes"] for c in kids) + int(own.get("param_bytes", 0))
        row["param_count"] = row["param_bytes"] // 4
        if row["status"] in ("failed", "skipped"):
            continue  # no numbers: never a silent zero
        if row["status"] == "estimated":
            # Sums of the children, exactly as the collector estimates (the subtree's estimated
            # descendants are already final, so re-estimating them is a no-op).
            estimate_containers(Tree(root=node, by_path={}), PEAK_FLOPS, PEAK_BANDWIDTH)
            continue
        calls = max(row["call_count"], 1)
        for key in PER_CALL_KEYS:
            values = [(c[key], c["call_count"]) for c in kids if c[key] is not None]
            total = sum(v * max(n, 1) for v, n in values) / calls + own.get(key, 0)
            row[key] = int(round(total)) if key in ("flops", "bytes_moved") else float(total)
        row["peak_memory_bytes"] = max([c["peak_memory_bytes"] or 0 for c in kids], default=0) + int(
            own.get("peak_memory_bytes", 0)
        )
        iqr = float(own.get("iqr", 0.1))
        row["latency_p25_ms"] = row["latency_ms"] * (1 - iqr / 2)
        row["latency_p75_ms"] = row["latency_ms"] * (1 + iqr / 2)
        row["samples"] = int(own.get("samples", 50))
        derive_ratios(row, PEAK_FLOPS, PEAK_BANDWIDTH)
    return rows


def _backward(values: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key in PER_CALL_KEYS:
        if out.get(key) is not None:
            out[key] = out[key] * BACKWARD_FACTOR
    if out.get("peak_memory_bytes") is not None:
        out["peak_memory_bytes"] = int(out["peak_memory_bytes"] * 1.5)
    return out


# --- runs and archives -------------------------------------------------------------------------


def _next_run_id() -> str:
    n = next(_run_counter)
    when = datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=n)
    return when.strftime("%Y%m%dT%H%M%SZ") + f"-{n % 0xFFFFFF:06x}"


def make_run(
    tree_spec: Spec,
    *,
    model: str = "m",
    version: str = "v1",
    run_id: str | None = None,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
    phase_metrics: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    phases: Iterable[str] = schema.PHASES,
    device_name: str = "synthetic-cpu",
    dtype: str = "float32",
    config: Mapping[str, Any] | None = None,
    tags: Iterable[str] = (),
    notes: str = "",
) -> Run:
    """A complete `Run` (metadata with every required key) of synthetic rows; not yet saved."""
    run_id = run_id or _next_run_id()
    phases = list(phases)
    rows, table = _rows_and_table(
        tree_spec, model=model, version=version, run_id=run_id, metrics=metrics, phase_metrics=phase_metrics, phases=phases
    )
    created = datetime.strptime(run_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    statuses = [r["status"] for r in rows if r["phase"] == phases[0]]
    meta = {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": run_id,
        "model": model,
        "version": version,
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "versions": {"cbsite": "0.1.0", "python": "3.11", "torch": None, "torchrec": None, "fbgemm_gpu": None},
        "device": {
            "kind": "cpu",
            "name": device_name,
            "count": 1,
            "peak_flops": {dtype: PEAK_FLOPS},
            "peak_bandwidth": PEAK_BANDWIDTH,
            "peak_source": "given",
        },
        "dtype": dtype,
        "provider": {"name": "synthetic", "args": {}},
        "config": dict(config or {"depth": None, "phases": phases, "batch_size": 1}),
        "preprocessing": [],
        "inputs": {},
        "git": None,
        "tags": list(tags),
        "notes": notes,
        "wall_time_s": 0.0,
        "counts": {s: statuses.count(s) for s in schema.STATUSES},
    }
    schema.check_meta(meta)
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return Run(meta=meta, rows=frame)


def write_archive(root: str | Path, runs: Iterable[Run]) -> list[Path]:
    """Save each run into the archive at `root` with `Run.save`; return their folders."""
    return [run.save(root) for run in runs]


# --- random trees ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SyntheticTree:
    """A tree spec plus own metrics, as drawn by `trees()`; build it with `.rows()` or `.run()`."""

    spec: dict[str, Any]
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        return [p for p, _ in flatten(self.spec)]

    @property
    def leaves(self) -> list[str]:
        return [p for p, kids in flatten(self.spec) if not kids]

    @property
    def containers(self) -> list[str]:
        return [p for p, kids in flatten(self.spec) if kids]

    def subtree(self, path: str) -> list[str]:
        """`path` and every path below it."""
        return [p for p in self.paths if p == path or (p.startswith(path + ".") if path else True)]

    def rows(self, **kwargs: Any) -> list[dict[str, Any]]:
        return make_rows(self.spec, metrics=self.metrics, **kwargs)

    def run(self, **kwargs: Any) -> Run:
        return make_run(self.spec, metrics=self.metrics, **kwargs)

    def with_metrics(self, path: str, **values: Any) -> "SyntheticTree":
        """A copy where `path` has these own values (others kept)."""
        metrics = copy.deepcopy(self.metrics)
        metrics.setdefault(path, {}).update(values)
        return replace(self, metrics=metrics)

    def without(self, path: str) -> "SyntheticTree":
        """A copy without the subtree at `path` (not the root); a container left empty becomes a leaf."""
        if path == "":
            raise ValueError("the root cannot be removed")
        gone = set(self.subtree(path))
        spec = _prune(self.spec, gone)
        metrics = {p: dict(v) for p, v in self.metrics.items() if p not in gone}
        parent = path.rsplit(".", 1)[0] if "." in path else ""
        if _children(spec, parent) is None and metrics.get(parent, {}).get("status") == "estimated":
            # A container that lost its last child is a leaf now, and a leaf is measured.
            del metrics[parent]["status"]
        return SyntheticTree(spec=spec, metrics=metrics)

    def with_subtree(self, parent: str, sub: "SyntheticTree", name: str) -> "SyntheticTree":
        """A copy with `sub`'s tree grafted under container `parent` as child `name`."""
        if not _children(self.spec, parent):
            raise ValueError(f"{parent!r} is not a container")
        prefix = f"{parent}.{name}" if parent else name
        if prefix in self.paths:
            raise ValueError(f"{prefix!r} already exists")
        moved = _graft(sub.spec[""], prefix)
        spec = copy.deepcopy(self.spec)
        _children(spec, parent)[prefix] = moved
        metrics = copy.deepcopy(self.metrics)
        for p, v in sub.metrics.items():
            metrics[_join(prefix, p)] = dict(v)
        return SyntheticTree(spec=spec, metrics=metrics)


def _join(prefix: str, path: str) -> str:
    """`path` moved under `prefix`; either may be the root ""."""
    if path == "":
        return prefix
    return path if prefix == "" else f"{prefix}.{path}"


def _graft(children: Spec | None, prefix: str) -> dict[str, Any] | None:
    """A sub-spec's children with every (full-path) key moved under `prefix`."""
    if children is None:
        return None
    return {_join(prefix, k): _graft(v, prefix) for k, v in children.items()}


def _prune(spec: Spec, gone: set[str]) -> dict[str, Any]:
    def visit(children: Spec | None) -> dict[str, Any] | None:
        if children is None:
            return None
        kept = {k: visit(v) for k, v in children.items() if k not in gone}
        return kept or None

    return {"": visit(spec[""])}


def _children(spec: Spec, path: str) -> dict[str, Any] | None:
    """The (mutable) children dict of `path` in a spec; None for a leaf."""
    node: Any = spec[""]
    if path == "":
        return node
    parts = path.split(".")
    for i in range(len(parts)):
        node = node[".".join(parts[: i + 1])]
    return node


_NAMES = ["0", "1", "2", "3", "layers", "mlp", "emb", "proj", "norm", "blocks"]


@st.composite
def trees(
    draw: st.DrawFn,
    max_depth: int = 3,
    max_children: int = 3,
    measured_containers: bool = True,
    call_counts: bool = True,
    never_called: bool = True,
) -> SyntheticTree:
    """Random component trees with random own metrics; the root always has at least one child.

    `call_counts`: children run once or twice per call of their parent; `never_called`: some estimated
    containers have call_count 0 (ModuleList-like); `measured_containers`: some containers are measured
    with an own share.
    """
    metrics: dict[str, dict[str, Any]] = {}

    def grow(path: str, depth: int, parent_calls: int) -> dict[str, Any] | None:
        # Calls per forward of the whole model: a child runs once or twice per call of its parent
        # (a never-called container counts once), as in a real model.
        calls = 1 if depth == 0 else (max(parent_calls, 1) * draw(st.sampled_from([1, 2])) if call_counts else 1)
        is_container = depth == 0 or (depth < max_depth and draw(st.booleans()))
        if not is_container:
            metrics[path] = {**draw(leaf_metrics()), "call_count": calls}
            return None
        own: dict[str, Any] = {}
        if measured_containers and draw(st.integers(0, 2)) == 0:
            own = {"status": "measured", **draw(own_metrics())}
        elif never_called and depth > 0 and draw(st.integers(0, 3)) == 0:
            # A ModuleList-like container, never called itself (only estimated ones can be):
            # its children are called by its parent, as often as the parent decides.
            own["call_count"] = 0
        own.setdefault("call_count", calls)
        own["param_bytes"] = 4 * draw(st.integers(0, 1000))
        metrics[path] = own
        names = draw(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=max_children, unique=True))
        child_base = calls if own["call_count"] else max(parent_calls, 1)
        return {_join(path, n): grow(_join(path, n), depth + 1, child_base) for n in names}

    spec = {"": grow("", 0, 1)}
    return SyntheticTree(spec=spec, metrics=metrics)


def leaf_metrics() -> st.SearchStrategy[dict[str, Any]]:
    """Own metrics of a random leaf (everything but call_count)."""
    return st.fixed_dictionaries(
        {
            "flops": st.integers(0, 10**9),
            "latency_ms": st.floats(1e-3, 10, allow_nan=False),
            "bytes_moved": st.integers(0, 10**8),
            "param_bytes": st.integers(0, 10**7).map(lambda n: 4 * n),
            "peak_memory_bytes": st.integers(0, 10**9),
            "iqr": st.floats(0, 0.3),
        }
    )


def own_metrics() -> st.SearchStrategy[dict[str, Any]]:
    """The self share of a measured container: framework overhead, a bias add, and so on."""
    return st.fixed_dictionaries(
        {
            "flops": st.integers(0, 10**6),
            "latency_ms": st.floats(0, 1, allow_nan=False),
            "bytes_moved": st.integers(0, 10**6),
            "peak_memory_bytes": st.integers(0, 10**6),
            "iqr": st.floats(0, 0.3),
        }
    )


@st.composite
def revisions(draw: st.DrawFn) -> tuple[SyntheticTree, SyntheticTree]:
    """A random base tree and a head that changes leaves, removes a subtree and grafts a new one."""
    base = draw(trees())
    head = base
    for leaf in draw(st.lists(st.sampled_from(base.leaves), unique=True, max_size=3)):
        head = head.with_metrics(leaf, **draw(leaf_metrics()))
    removable = [p for p in head.paths if p != ""]
    if removable and draw(st.booleans()):
        head = head.without(draw(st.sampled_from(removable)))
    if head.containers and draw(st.booleans()):
        sub = draw(trees(max_depth=2))
        head = head.with_subtree(draw(st.sampled_from(head.containers)), sub, "new")
    for container in draw(st.lists(st.sampled_from(head.containers), unique=True, max_size=2)) if head.containers else []:
        if head.metrics[container].get("status") == "measured":
            head = head.with_metrics(container, flops=draw(st.integers(0, 10**6)))  # its own share changed
    return base, head


__all__ = [
    "BACKWARD_FACTOR",
    "PEAK_BANDWIDTH",
    "PEAK_FLOPS",
    "SyntheticTree",
    "flatten",
    "leaf_metrics",
    "own_metrics",
    "make_rows",
    "revisions",
    "make_run",
    "trees",
    "write_archive",
]
