"""Archives for the site tests: synthetic runs written with the real archive writer, the golden archive and a
hostile run. benchmarks/build_scale.py uses `synthetic_run` too."""

from __future__ import annotations

import gzip
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from cbsite import archive, schema
from cbsite.tree import build_tree, derive_ratios, estimate_containers, self_check

PEAK_FLOPS = 2.0e11
PEAK_BW = 2.0e10
BASE_TIME = datetime(2025, 1, 6, 12, 0, 0, tzinfo=timezone.utc)


def _meta(model: str, version: str, run_id: str, created: datetime, notes: str, tags: list[str]) -> dict[str, Any]:
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": run_id,
        "model": model,
        "version": version,
        "created_at": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {"cbsite": "0.1.0", "python": "3.11.2", "torch": "2.13.0+cpu", "torchrec": "1.8.0", "fbgemm_gpu": None},
        "device": {
            "kind": "cpu", "name": "Synthetic CPU", "count": 1, "peak_flops": {"float32": PEAK_FLOPS},
            "peak_bandwidth": PEAK_BW, "peak_source": {"flops": "calibrated", "bandwidth": "calibrated"}, "num_threads": 2,
        },
        "dtype": "float32",
        "provider": {"name": "synthetic", "args": {"layers": 3}},
        "config": {"depth": None, "phases": ["forward", "backward"], "batch_size": 64},
        "preprocessing": [{"step": "eval", "params": {}}],
        "inputs": {"x": {"shape": [64, 128], "dtype": "float32"}},
        "git": {"commit": "0123456789abcdef", "dirty": False},
        "tags": tags,
        "notes": notes,
        "wall_time_s": 12.5,
        "counts": {},
    }


def _shape(n: int, branching: int, rng: random.Random) -> list[tuple[str, str]]:
    """(path, module_type) in pre-order for a tree of about n nodes."""
    nodes: list[tuple[str, str]] = [("", "synthetic.Model")]
    frontier = [""]
    while len(nodes) < n and frontier:
        nxt = []
        for parent in frontier:
            for k in range(branching):
                if len(nodes) >= n:
                    break
                kind = rng.choice(["block", "layers", "proj", "emb"])
                name = f"{kind}_{k}" if kind != "layers" else str(k)
                path = f"{parent}.{name}" if parent else name
                nodes.append((path, f"torch.nn.{kind.capitalize()}Module"))
                nxt.append(path)
        frontier = nxt
    nodes.sort(key=lambda pt: [(0, int(s)) if s.isdigit() else (1, s) for s in pt[0].split(".")] if pt[0] else [])
    return nodes


def synthetic_rows(
    model: str, version: str, run_id: str, n: int = 40, seed: int = 0, scale: float = 1.0,
    failed: bool = True, trace_every: int = 0, branching: int = 4, shape_seed: int | None = None,
) -> list[dict[str, Any]]:
    """Rows for both phases of a synthetic component tree, aggregated with the real tree rules. The tree is drawn from
    `shape_seed` where given (versions of one model with the same paths, as a real model's keep theirs), else from
    `seed`, which draws the numbers."""
    rng = random.Random(seed if shape_seed is None else shape_seed)
    shape = _shape(n, branching, rng)
    paths = {p for p, _ in shape}
    has_child = {p.rsplit(".", 1)[0] if "." in p else "" for p, _ in shape if p}
    rows: list[dict[str, Any]] = []
    for phase in schema.PHASES:
        prng = random.Random(f"{seed}-{phase}")
        phase_rows = []
        for order, (path, mtype) in enumerate(shape):
            leaf = path not in has_child
            row = schema.empty_row()
            parent = None if path == "" else (path.rsplit(".", 1)[0] if "." in path else "")
            row.update(
                run_id=run_id, model=model, version=version, path=path, parent=parent,
                name=path.rsplit(".", 1)[-1], depth=0 if path == "" else path.count(".") + 1,
                module_type=mtype, is_leaf=leaf, order=order, call_count=1, phase=phase,
                status="measured",
            )
            if leaf:
                lat = prng.uniform(0.05, 2.0) * scale * (2.0 if phase == "backward" else 1.0)
                row.update(
                    latency_ms=lat, latency_p25_ms=lat * 0.97, latency_p75_ms=lat * 1.03, samples=50,
                    cpu_time_ms=lat * 0.9, device_time_ms=None, flops=int(lat * 1e8 * prng.uniform(0.5, 2)),
                    bytes_moved=int(lat * 1e7), param_bytes=int(prng.uniform(1e3, 1e6) * scale) // 4 * 4,
                    peak_memory_bytes=int(prng.uniform(1e5, 1e7)), unsupported_ops=[], notes=[],
                    input_shapes="[64, 128]",
                )
                row["param_count"] = row["param_bytes"] // 4
                if trace_every and order % trace_every == 0:
                    row["trace_file"] = f"artifacts/{path}/{phase}.trace.json.gz"
                    row["log_file"] = f"artifacts/{path}/log.txt"
                derive_ratios(row, PEAK_FLOPS, PEAK_BW)
            else:
                # Containers: "layers" lists are estimated; the rest are measured later from their children.
                row["status"] = "estimated" if path.endswith("layers_0") or mtype.endswith("LayersModule") else "measured"
            phase_rows.append(row)
        if failed and len(phase_rows) > 3:
            victim = next(r for r in reversed(phase_rows) if r["is_leaf"])
            for k in schema.METRIC_FIELDS:
                if k.name not in ("param_bytes", "param_count"):
                    victim[k.name] = None
            victim.update(status="failed", error="RuntimeError: synthetic <failure> & 'quotes'", trace_file=None, log_file=None)
        tree = build_tree(phase_rows)
        # Measured containers: children's sum plus a self share (a few percent over); static metrics sum.
        for node in reversed(list(tree)):
            if not node.children:
                continue
            r = node.row
            r["param_bytes"] = sum(c["param_bytes"] or 0 for c in node.children)
            r["param_count"] = sum(c["param_count"] or 0 for c in node.children)
            if r["status"] == "estimated":  # sums now, so that measured ancestors include them
                kids = [c for c in node.children if c["latency_ms"] is not None]
                r.update(latency_ms=sum(c["latency_ms"] for c in kids), flops=sum(c["flops"] or 0 for c in kids),
                         bytes_moved=sum(c["bytes_moved"] or 0 for c in kids))
            if r["status"] == "measured":
                kids = [c for c in node.children if c["latency_ms"] is not None]
                s = sum(c["latency_ms"] for c in kids)
                r.update(
                    latency_ms=s * 1.05, latency_p25_ms=s * 1.02, latency_p75_ms=s * 1.08, samples=30,
                    cpu_time_ms=s, flops=sum(c["flops"] or 0 for c in kids), bytes_moved=sum(c["bytes_moved"] or 0 for c in kids),
                    peak_memory_bytes=max([c["peak_memory_bytes"] or 0 for c in node.children] + [0]) + 1000,
                    unsupported_ops=["aten::weird_op"] if node.path == "" else [], notes=[],
                )
                derive_ratios(r, PEAK_FLOPS, PEAK_BW)
        estimate_containers(tree, PEAK_FLOPS, PEAK_BW)
        self_check(tree)
        rows.extend(phase_rows)
    assert paths
    return rows


def synthetic_run(
    root: Path, model: str = "toy", version: str = "v1", *, n: int = 40, seed: int = 0, scale: float = 1.0,
    minutes: int = 0, notes: str = "synthetic run", tags: list[str] | None = None, failed: bool = True,
    trace_every: int = 0, ops: bool = False, branching: int = 4, shape_seed: int | None = None,
) -> Path:
    """Write a synthetic run into the archive at `root` and return its folder."""
    created = BASE_TIME + timedelta(minutes=minutes)
    run_id = created.strftime("%Y%m%dT%H%M%SZ") + "-" + f"{seed % 0xFFFFFF:06x}"
    rows = synthetic_rows(model, version, run_id, n=n, seed=seed, scale=scale, failed=failed,
                          trace_every=trace_every, branching=branching, shape_seed=shape_seed)
    meta = _meta(model, version, run_id, created, notes, tags if tags is not None else ["synthetic"])
    counts: dict[str, int] = {}
    for r in rows:
        if r["phase"] == "forward":
            counts[r["status"]] = counts.get(r["status"], 0) + 1
    meta["counts"] = counts
    artifacts = None
    staging = root / f".staging-{run_id}"
    if trace_every:
        for r in rows:
            if r["trace_file"]:
                f = staging / r["trace_file"].removeprefix("artifacts/")
                f.parent.mkdir(parents=True, exist_ok=True)
                trace = {"traceEvents": [{"name": r["path"] or model, "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1}]}
                with gzip.GzipFile(f, "wb", mtime=0) as gz:
                    gz.write(json.dumps(trace).encode())
                (f.parent / "log.txt").write_text(f"log of {r['path']}\n")
        artifacts = staging
    ops_table = None
    if ops:
        op_rows = [
            {"path": r["path"], "phase": r["phase"], "op": op, "count": 2, "time_ms": (r["latency_ms"] or 0) / 3}
            for r in rows if r["is_leaf"] for op in ("aten::mm", "aten::add")
        ]
        ops_table = pa.Table.from_pylist(op_rows)
    folder = archive.write_run(root, meta, archive.rows_to_table(rows), artifacts, ops_table)
    if artifacts is not None:
        import shutil

        shutil.rmtree(staging)
    return folder


# --- small archives built with tests/helpers/runfactory.py (exact, deterministic numbers) ------------------

GOLDEN_SPEC = {
    "": {
        "embedding": {"embedding.tables": {"embedding.tables.t_cat_0": None, "embedding.tables.t_cat_1": None}},
        "dense": {"dense.0": None, "dense.1": None},
        "over": None,
    }
}


def golden_runs():
    """Two versions of a small model, v2 with a bigger table (params, FLOPs, peak memory) and a new layer."""
    from tests.helpers.runfactory import make_run

    v1 = make_run(
        GOLDEN_SPEC, model="dlrm", version="v1", run_id="20250101T000000Z-00000a",
        metrics={"dense": {"status": "measured", "latency_ms": 0.002, "flops": 100},
                 "embedding.tables.t_cat_0": {"param_bytes": 100_000, "flops": 50_000, "latency_ms": 0.05,
                                              "peak_memory_bytes": 200_000, "call_count": 2}},
        tags=["demo"], notes="first version",
    )
    spec2 = {"": {**GOLDEN_SPEC[""], "dense": {"dense.0": None, "dense.1": None, "dense.2": None}}}
    v2 = make_run(
        spec2, model="dlrm", version="v2", run_id="20250102T000000Z-00000b",
        metrics={"dense": {"status": "measured", "latency_ms": 0.002, "flops": 100},
                 "embedding.tables.t_cat_0": {"param_bytes": 400_000, "flops": 900_000, "latency_ms": 0.3,
                                              "peak_memory_bytes": 800_000, "call_count": 2},
                 "dense.2": {"param_bytes": 400, "flops": 1000, "latency_ms": 0.001, "peak_memory_bytes": 1024}},
        tags=["demo"], notes="bigger table",
    )
    return v1, v2


def write_golden_archive(root: Path) -> Path:
    from tests.helpers.runfactory import write_archive

    write_archive(root, golden_runs())
    return root


HOSTILE = '<script>alert("x")</script> & *stars* _under_ [link](http://evil.example) `tick` {{ jinja }} | pipe'


def write_hostile_run(root: Path) -> Path:
    """A run whose free-text fields and module names carry HTML, Markdown and template syntax."""
    from tests.helpers.runfactory import make_run, write_archive

    spec = {"": {"evil<img src=x onerror=alert(1)>": None, "ok": None}}
    run = make_run(
        spec, model="hostile", version="v1", run_id="20250103T000000Z-00000c",
        metrics={"ok": {"module_type": HOSTILE, "status": "failed", "error": HOSTILE}},
        tags=[HOSTILE], notes=HOSTILE,
    )
    run.meta["provider"] = {"name": HOSTILE, "args": {HOSTILE: HOSTILE}}
    return write_archive(root, [run])[0]


def readable_archive(runs: Path, head_trace_every: int = 0) -> None:
    """The archive both readability suites build (tests/test_site_readability.py and
    tests/test_browser_readability.py): the golden runs and two synthetic toy versions, the first with traces
    and ops."""
    write_golden_archive(runs)
    synthetic_run(runs, "toy", "v1", n=60, seed=11, trace_every=5, ops=True)
    synthetic_run(runs, "toy", "v2", n=64, seed=12, minutes=5, scale=1.3, trace_every=head_trace_every)


def quiet_build(runs: Path) -> Path:
    """The site of `runs` built beside it (runs.parent / "site") with default options, its warnings silenced."""
    import warnings

    from cbsite.generator import build_site

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_site(runs, runs.parent / "site", quiet=True)
