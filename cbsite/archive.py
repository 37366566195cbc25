"""The results archive: write a run atomically, read it back, list and resolve runs, migrate old ones.

Layout: ``<root>/<model>/<version>/<run_id>/{run.json, components.parquet, ops.parquet, artifacts/}``.
A run is written under a dot-folder and renamed into place when complete; readers ignore dot-folders,
so a crash never leaves a half run visible.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from cbsite import schema
from cbsite.errors import CbsiteError

RUN_JSON = "run.json"
COMPONENTS_FILE = "components.parquet"
OPS_FILE = "ops.parquet"
SAMPLES_FILE = "samples.parquet"
ARTIFACTS_DIR = "artifacts"


def new_run_id(now: datetime | None = None) -> str:
    """`YYYYMMDDTHHMMSSZ-xxxxxx`: UTC time plus 6 random hex digits, so ids sort by time."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Build the Arrow table of components.parquet from row dicts, checking every value's column."""
    unknown = sorted({k for r in rows for k in r} - set(schema.COLUMNS))
    if unknown:
        raise ValueError(f"rows carry columns outside the schema: {unknown}")
    for r in rows:
        if r.get("phase") not in schema.PHASES:
            raise ValueError(f"bad phase {r.get('phase')!r} for {r.get('path')!r}")
        if r.get("status") not in schema.STATUSES:
            raise ValueError(f"bad status {r.get('status')!r} for {r.get('path')!r}")
    columns = {name: [r.get(name) for r in rows] for name in schema.COLUMNS}
    return pa.Table.from_pydict(columns, schema=schema.COMPONENTS_SCHEMA)


@dataclass
class Run:
    """One profiled run: its metadata, its rows and (until saved) a staging folder of artifacts."""

    meta: dict[str, Any]
    rows: pl.DataFrame
    artifacts: Path | None = None  # folder whose content becomes <run>/artifacts/
    ops: pl.DataFrame | None = None
    path: Path | None = None  # where it lives in an archive, once saved or read
    samples: pl.DataFrame | None = None  # raw timed blocks (samples.parquet); None for runs before schema 2

    @property
    def run_id(self) -> str:
        return self.meta["run_id"]

    @property
    def model(self) -> str:
        return self.meta["model"]

    @property
    def version(self) -> str:
        return self.meta["version"]

    def table(self, phase: str | None = None) -> pl.DataFrame:
        """The rows as a polars DataFrame, optionally one phase, in pre-order."""
        df = self.rows if phase is None else self.rows.filter(pl.col("phase") == phase)
        return df.sort(["order", "phase"])

    def flat_table(self) -> pl.DataFrame:
        """The rows in pre-order with nothing nested, for CSV: lists of strings joined by ';',
        other nested values (lists of structs) as JSON text."""
        df = self.table()
        flat = []
        for column, dtype in df.schema.items():
            if isinstance(dtype, pl.List) and dtype.inner == pl.String:
                flat.append(pl.col(column).list.join(";"))
            elif isinstance(dtype, (pl.List, pl.Struct, pl.Array)):
                flat.append(pl.col(column).map_elements(_json_cell, return_dtype=pl.String))
        return df.with_columns(flat)

    def save(self, root: str | os.PathLike[str] = "runs") -> Path:
        """Write this run into the archive at `root` atomically and return its folder."""
        ops = self.ops.to_arrow() if self.ops is not None else None
        samples = self.samples.to_arrow() if self.samples is not None else None
        self.path = write_run(root, self.meta, self.rows.to_arrow(), self.artifacts, ops, samples)
        return self.path


def _json_cell(value: Any) -> str:
    # polars hands a list cell to the function as a Series (of dicts for a list of structs).
    return json.dumps(value.to_list() if isinstance(value, pl.Series) else value, sort_keys=True)


def _table_with_meta(table: pa.Table, meta: dict[str, Any]) -> pa.Table:
    existing = dict(table.schema.metadata or {})
    existing[schema.PARQUET_META_KEY] = json.dumps(meta, sort_keys=True).encode()
    return table.replace_schema_metadata(existing)


def write_run(
    root: str | os.PathLike[str],
    meta: dict[str, Any],
    table: pa.Table,
    artifacts: Path | None = None,
    ops: pa.Table | None = None,
    samples: pa.Table | None = None,
) -> Path:
    """Write a run under `<root>/<model>/<version>/<run_id>/`, visible only once complete."""
    schema.check_meta(meta)
    table = table.cast(schema.COMPONENTS_SCHEMA)  # refuses a table that does not fit the contract
    version_dir = Path(root) / meta["model"] / meta["version"]
    final = version_dir / meta["run_id"]
    if final.exists():
        raise CbsiteError(f"run {meta['run_id']} already exists at {final}; runs are immutable")
    staging = version_dir / f".{meta['run_id']}.partial"
    staging.mkdir(parents=True, exist_ok=False)
    try:
        (staging / RUN_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        pq.write_table(_table_with_meta(table, meta), staging / COMPONENTS_FILE)
        if ops is not None and ops.num_rows:
            pq.write_table(_table_with_meta(ops, meta), staging / OPS_FILE)
        if samples is not None and samples.num_rows:
            pq.write_table(_table_with_meta(samples.cast(schema.SAMPLES_SCHEMA), meta), staging / SAMPLES_FILE)
        if artifacts is not None and Path(artifacts).is_dir() and any(Path(artifacts).iterdir()):
            shutil.copytree(artifacts, staging / ARTIFACTS_DIR)
        os.rename(staging, final)  # atomic on one file system: the run appears whole or not at all
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


# One function per schema step: MIGRATIONS[n] turns version n into n + 1.
Migration = Callable[[dict[str, Any], pl.DataFrame], tuple[dict[str, Any], pl.DataFrame]]


def _v1_to_v2(meta: dict[str, Any], rows: pl.DataFrame) -> tuple[dict[str, Any], pl.DataFrame]:
    """Schema 2 keeps raw samples; a version-1 run had none, and says so instead of inventing them."""
    meta = dict(meta)
    meta.setdefault("samples", None)
    meta.setdefault("rounds", 1)
    meta.setdefault(
        "samples_note", "collected before schema 2: no raw timing samples were kept; latencies are within-run medians"
    )
    return meta, rows


MIGRATIONS: dict[int, Migration] = {1: _v1_to_v2}


def migrate(meta: dict[str, Any], rows: pl.DataFrame, path: Path | str = "") -> tuple[dict[str, Any], pl.DataFrame]:
    """Bring a run's metadata and rows up to SCHEMA_VERSION, or refuse a newer one."""
    found = int(meta.get("schema_version", 0))
    if found > schema.SCHEMA_VERSION:
        raise CbsiteError(
            f"run {path} has schema version {found} but this cbsite reads up to version "
            f"{schema.SCHEMA_VERSION}; upgrade cbsite to read it"
        )
    while found < schema.SCHEMA_VERSION:
        if found not in MIGRATIONS:
            raise CbsiteError(f"run {path} has schema version {found}, which cbsite cannot migrate")
        meta, rows = MIGRATIONS[found](meta, rows)
        found += 1
        meta["schema_version"] = found
    return meta, rows


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's metadata alone (run.json), for listings that need no rows."""
    folder = Path(path)
    try:
        meta = json.loads((folder / RUN_JSON).read_text())
    except FileNotFoundError as exc:
        raise CbsiteError(f"run folder {folder} is incomplete: {RUN_JSON} is missing") from exc
    except (json.JSONDecodeError, OSError) as exc:
        raise CbsiteError(f"run folder {folder} is unreadable: {exc}") from exc
    found = int(meta.get("schema_version", 0))
    if found > schema.SCHEMA_VERSION:
        migrate(meta, pl.DataFrame(), folder)  # refuses with the message that names both versions
    return meta


def read_run(path: str | os.PathLike[str]) -> Run:
    """Read one run folder; raise CbsiteError with the file at fault when it is broken."""
    folder = Path(path)
    try:
        meta = json.loads((folder / RUN_JSON).read_text())
        rows = pl.read_parquet(folder / COMPONENTS_FILE)
        ops = pl.read_parquet(folder / OPS_FILE) if (folder / OPS_FILE).exists() else None
        samples = pl.read_parquet(folder / SAMPLES_FILE) if (folder / SAMPLES_FILE).exists() else None
    except FileNotFoundError as exc:
        raise CbsiteError(f"run folder {folder} is incomplete: {Path(exc.filename).name} is missing") from exc
    except (json.JSONDecodeError, OSError, pl.exceptions.PolarsError) as exc:
        raise CbsiteError(f"run folder {folder} is unreadable: {exc}") from exc
    meta, rows = migrate(meta, rows, folder)
    schema.check_meta(meta)
    missing = [c for c in schema.COLUMNS if c not in rows.columns]
    if missing:
        raise CbsiteError(f"{folder / COMPONENTS_FILE} lacks columns {missing}")
    return Run(meta=meta, rows=rows, ops=ops, path=folder, samples=samples)


@dataclass(frozen=True, order=True)
class RunRef:
    """Where a run lives, without reading it. Sorts by model, version, then time."""

    model: str
    version: str
    run_id: str
    path: Path = field(compare=False)


def list_runs(root: str | os.PathLike[str] = "runs") -> list[RunRef]:
    """Every complete run under `root`, sorted; dot-folders (runs being written) are ignored."""
    base = Path(root)
    refs: list[RunRef] = []
    if not base.is_dir():
        return refs
    for model_dir in sorted(base.iterdir()):
        if not model_dir.is_dir() or model_dir.name.startswith(".") or not schema.NAME_RE.match(model_dir.name):
            continue
        for version_dir in sorted(model_dir.iterdir()):
            if not version_dir.is_dir() or version_dir.name.startswith("."):
                continue
            for run_dir in sorted(version_dir.iterdir()):
                if run_dir.is_dir() and schema.RUN_ID_RE.match(run_dir.name):
                    refs.append(RunRef(model_dir.name, version_dir.name, run_dir.name, run_dir))
    return sorted(refs)


def resolve_run(spec: str, root: str | os.PathLike[str] = "runs") -> RunRef:
    """Find a run by run id, `model@version` (its newest run), `model` (newest run) or folder path."""
    as_path = Path(spec)
    if (as_path / RUN_JSON).is_file():
        meta = json.loads((as_path / RUN_JSON).read_text())
        return RunRef(meta["model"], meta["version"], meta["run_id"], as_path)
    refs = list_runs(root)
    if schema.RUN_ID_RE.match(spec):
        hits = [r for r in refs if r.run_id == spec]
    elif "@" in spec:
        model, version = spec.split("@", 1)
        hits = [r for r in refs if r.model == model and r.version == version]
    else:
        hits = [r for r in refs if r.model == spec]
    if not hits:
        known = sorted({f"{r.model}@{r.version}" for r in refs})
        hint = f" Known: {', '.join(known)}." if known else f" The archive {root} is empty: run `cbsite collect` first."
        raise CbsiteError(f"no run matches {spec!r} in {root}.{hint}")
    return max(hits, key=lambda r: r.run_id)
