"""The results archive: write a run atomically, read it back, list and resolve runs, upgrade old ones.

Layout: ``<root>/<model>/<version>/<run_id>/{run.json, components.parquet, ops.parquet, artifacts/}``.

Crash safety. A run is written in ``<root>/.cbsite-staging/`` with its Parquet files named ``*.partial``,
so no reader glob (``runs/**/components.parquet`` descends into dot-folders, in polars and DuckDB alike)
matches a file of an unfinished run; the folder is then renamed into place and ``components.parquet.partial``
renamed last: a run exists exactly when its ``components.parquet`` does. Every staging folder records its
owner (process id and host), so `leftovers.stale_staging` tells the remains of a killed process from work in
progress and `leftovers.remove_stale` (``cbsite gc``) deletes them. Older schemas migrate on read (migration.py).

Reading is defensive: archive content is untrusted. `read_meta` and `read_run` turn every problem of one
run (bad JSON, wrong types, a Parquet that does not fit the schema, no rows) into a `CbsiteError` naming
the run and the problem; non-finite floats are read as null.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cbsite import runsummary, schema
from cbsite.errors import CbsiteError
from cbsite.migration import migrate, schema_version

RUN_JSON = "run.json"
COMPONENTS_FILE = "components.parquet"
OPS_FILE = "ops.parquet"
SAMPLES_FILE = "samples.parquet"
RANKS_FILE = "ranks.parquet"  # sharded runs: every rank's rows (components.parquet's schema, `rank` set)
ARTIFACTS_DIR = "artifacts"
STAGING_DIR = ".cbsite-staging"  # in the archive root: runs and plugin artifacts being written
PARTIAL = ".partial"  # suffix of a staged Parquet file: no `**/components.parquet` glob matches it
OWNER_FILE = ".cbsite-owner"  # in every staging folder: {"pid", "host", "started"}


def new_run_id(now: datetime | None = None) -> str:
    """`YYYYMMDDTHHMMSSZ-mmmrrr`: UTC time, then its milliseconds and 3 random digits in hex, so that ids sort by
    time to the millisecond ("newest run" is right for two runs started in one second) and ids made in one
    millisecond still differ."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ") + f"-{now.microsecond // 1000:03x}" + secrets.token_hex(2)[:3]


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
    ranks: pl.DataFrame | None = None  # every rank's rows of a sharded run (ranks.parquet); None otherwise

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
        ranks = self.ranks.to_arrow() if self.ranks is not None else None
        self.path = write_run(root, self.meta, self.rows.to_arrow(), self.artifacts, ops, samples, ranks)
        return self.path

    def __repr__(self) -> str:
        """A few lines, not the rows: model@version, run id, device, the whole model per phase, the top components."""
        return runsummary.run_text(self)

    def _repr_html_(self) -> str:
        """The same summary as a small table, for notebooks."""
        return runsummary.run_html(self)


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
    ranks: pa.Table | None = None,
) -> Path:
    """Write a run under `<root>/<model>/<version>/<run_id>/`, visible only once complete.

    Staged in `<root>/.cbsite-staging/` with `*.partial` Parquet names (see the module docstring); a
    further Parquet file is written to `_staged(staging, NAME)` and renamed with the others.
    """
    schema.check_meta(meta)
    table = table.cast(schema.COMPONENTS_SCHEMA)  # refuses a table that does not fit the contract
    version_dir = Path(root) / meta["model"] / meta["version"]
    final = version_dir / meta["run_id"]
    if final.exists():
        raise CbsiteError(f"run {meta['run_id']} already exists at {final}; runs are immutable")
    staging = new_staging(staging_dir(root), f"run-{meta['run_id']}-")
    try:
        (staging / RUN_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        pq.write_table(_table_with_meta(table, meta), _staged(staging, COMPONENTS_FILE))
        if ops is not None and ops.num_rows:
            pq.write_table(_table_with_meta(ops, meta), _staged(staging, OPS_FILE))
        if samples is not None and samples.num_rows:
            pq.write_table(_table_with_meta(samples.cast(schema.SAMPLES_SCHEMA), meta), _staged(staging, SAMPLES_FILE))
        if ranks is not None and ranks.num_rows:
            pq.write_table(_table_with_meta(ranks.cast(schema.COMPONENTS_SCHEMA), meta), _staged(staging, RANKS_FILE))
        if artifacts is not None and Path(artifacts).is_dir() and any(Path(artifacts).iterdir()):
            shutil.copytree(artifacts, staging / ARTIFACTS_DIR, ignore=shutil.ignore_patterns(OWNER_FILE))
        version_dir.mkdir(parents=True, exist_ok=True)
        _commit(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _staged(staging: Path, name: str) -> Path:
    """Where a Parquet file of a run is written while staged: a name no reader glob matches."""
    return staging / (name + PARTIAL)


def _commit(staging: Path, final: Path) -> None:
    """Move a staged run into place, then give its Parquet files their names, components.parquet last.

    The folder rename is atomic on one file system (staging is inside the archive); the run exists from the
    moment its components.parquet does. A failure before that removes the half-moved folder (only ours).
    """
    os.rename(staging, final)
    try:
        partial = sorted(final.glob("*" + PARTIAL), key=lambda f: f.name == COMPONENTS_FILE + PARTIAL)
        for f in partial:
            os.replace(f, f.with_name(f.name[: -len(PARTIAL)]))
    except BaseException:
        if not (final / COMPONENTS_FILE).exists() and _owned_by_us(final):
            shutil.rmtree(final, ignore_errors=True)
        raise
    (final / OWNER_FILE).unlink(missing_ok=True)


# --- staging: folders that record the process writing them (leftovers.py finds the stale ones) ---


def staging_dir(root: str | os.PathLike[str]) -> Path:
    """The archive's staging area: runs being saved and plugin artifacts of runs being collected."""
    return Path(root) / STAGING_DIR


def _owner() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": round(time.time(), 3)}


def new_staging(parent: str | os.PathLike[str], prefix: str) -> Path:
    """A new folder under `parent` that records this process as its owner (OWNER_FILE)."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    (folder / OWNER_FILE).write_text(json.dumps(_owner()))
    return folder


def read_owner(folder: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _owned_by_us(folder: Path) -> bool:
    owner = read_owner(folder)
    return owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname()



# --- upgrade: older runs rewritten at the current schema, in place ---------------------------------


@dataclass(frozen=True)
class Upgrade:
    """A run `upgrade_archive` rewrote (or would rewrite): its folder and the schema version it had."""

    path: Path
    found: int


def upgrade_archive(root: str | os.PathLike[str] = "runs", dry_run: bool = False) -> tuple[list[Upgrade], int]:
    """Rewrite every run of an older schema in place, as `read_run` migrates it: (the runs, how many were current).

    Every older run is read (and so checked) before any is rewritten, so a broken run or one of a newer schema
    stops the upgrade before it changes anything.
    """
    todo: list[Upgrade] = []
    current = 0
    for ref in list_runs(root):
        meta = _load_meta(ref.path)
        found = meta.get("schema_version", 0)
        if found > schema.SCHEMA_VERSION:
            migrate(meta, pl.DataFrame(), shown(ref.path))  # refuses, naming both versions
        if found == schema.SCHEMA_VERSION:
            current += 1
            continue
        read_run(ref.path)
        todo.append(Upgrade(ref.path, found))
    if not dry_run:
        for item in todo:
            upgrade_run(item.path, root)
    return todo, current


def upgrade_run(folder: str | os.PathLike[str], root: str | os.PathLike[str]) -> dict[str, Any]:
    """Rewrite one run at SCHEMA_VERSION in place; returns its new metadata.

    Each file is staged in `<root>/.cbsite-staging/` and renamed over the old one (one file system, so each
    rename is atomic): the Parquet files first, run.json last. Every state in between reads as a whole run:
    a newer components.parquet under an older run.json migrates to itself. Parquet files other than
    components.parquet keep their rows; every file gets the new metadata embedded.
    """
    folder = Path(folder)
    run = read_run(folder)
    meta = run.meta
    staging = new_staging(staging_dir(root), f"upgrade-{meta['run_id']}-")
    try:
        files: list[tuple[str, pa.Table]] = []
        for name in (OPS_FILE, SAMPLES_FILE, RANKS_FILE):
            if (folder / name).exists():
                files.append((name, _read_parquet(folder, name)))
        files.append((COMPONENTS_FILE, run.rows.to_arrow().cast(schema.COMPONENTS_SCHEMA)))
        for name, table in files:
            pq.write_table(_table_with_meta(table, meta), staging / name)
        (staging / RUN_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        for name in [n for n, _ in files] + [RUN_JSON]:
            os.replace(staging / name, folder / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return meta


def shown(path: Path | str) -> str:
    """A path as text that prints anywhere: bytes that are not UTF-8 in a folder name as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


# Archive content is untrusted: nothing is read that is not a regular file of the run folder, or beyond a cap.
MAX_RUN_JSON_BYTES = 16 << 20  # run.json is metadata: kilobytes in practice
MAX_PARQUET_BYTES = 1 << 30  # a run's Parquet file: far above a real run's, below what exhausts a build machine


def open_member(folder: Path, name: str, cap: int) -> BinaryIO:
    """`folder/name` opened for reading when it is a regular file inside `folder` of at most `cap` bytes;
    CbsiteError naming the run otherwise. Opened without blocking (a FIFO never waits for a writer) and
    checked on the open descriptor, so a symlink to /dev/zero or a FIFO is refused before any byte is read."""
    where, path = shown(folder), folder / name
    problem = f"run folder {where} is unreadable: {name}"
    try:
        if not path.resolve().is_relative_to(folder.resolve()):
            raise CbsiteError(f"{problem} is a symbolic link out of the run folder")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise CbsiteError(f"run folder {where} is incomplete: {name} is missing") from exc
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop, on Pythons before 3.13
        raise CbsiteError(f"{problem}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CbsiteError(f"{problem} is not a regular file")
        if info.st_size > cap:
            raise CbsiteError(f"{problem} is {info.st_size / 2**20:.0f} MiB, more than the {cap >> 20} MiB it may have")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_member(folder: Path, name: str, cap: int) -> bytes:
    """The bytes of `folder/name`, read as `open_member` allows (and never more than `cap`, should it grow)."""
    with open_member(folder, name, cap) as f:
        try:
            data = f.read(cap + 1)
        except OSError as exc:
            raise CbsiteError(f"run folder {shown(folder)} is unreadable: {name}: {exc.strerror or exc}") from exc
    if len(data) > cap:
        raise CbsiteError(f"run folder {shown(folder)} is unreadable: {name} grew past {cap >> 20} MiB while read")
    return data


def _load_meta(folder: Path) -> dict[str, Any]:
    """run.json as a dict with a valid schema_version, non-finite numbers as null; CbsiteError otherwise."""
    where = shown(folder)
    raw = read_member(folder, RUN_JSON, MAX_RUN_JSON_BYTES)
    try:
        meta = json.loads(raw.decode("utf-8"), parse_constant=lambda _: None)  # NaN, Infinity -> null
    except UnicodeDecodeError as exc:
        raise CbsiteError(f"run folder {where} is unreadable: {RUN_JSON} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except (ValueError, RecursionError) as exc:
        raise CbsiteError(f"run folder {where} is unreadable: {RUN_JSON} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise CbsiteError(f"run folder {where} is unreadable: {RUN_JSON} holds a JSON {type(meta).__name__}, not an object")
    schema_version(meta, where)
    return meta


def _check_meta(meta: dict[str, Any], folder: Path) -> dict[str, Any]:
    try:
        return schema.check_meta(meta)
    except CbsiteError as exc:
        raise CbsiteError(f"run folder {shown(folder)} is unreadable: {exc}") from None


def read_meta(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's metadata alone (run.json), for listings that need no rows; checked as `read_run` checks it."""
    folder = Path(path)
    meta = _load_meta(folder)
    # Every version is checked: an older one once migrated (as read_run does), a newer one refused by name.
    if meta.get("schema_version", 0) != schema.SCHEMA_VERSION:
        try:
            meta, _ = migrate(meta, pl.DataFrame(), shown(folder))
        except CbsiteError:
            raise
        except Exception as exc:  # noqa: BLE001 - a migration step meeting malformed metadata
            raise CbsiteError(f"run folder {shown(folder)} is unreadable: its run.json cannot be migrated "
                              f"({type(exc).__name__}: {exc})") from None
    return _check_meta(meta, folder)


def read_run(path: str | os.PathLike[str] | RunRef, runs: str | os.PathLike[str] = "runs") -> Run:
    """Read one run: a folder, a `RunRef`, or a text that `resolve_run` finds in the archive at `runs` (a run id,
    `model@version`, `model`); raise CbsiteError naming the run and the problem when anything of it is broken.

    The rows are checked against `schema.COMPONENTS_SCHEMA` (cast where the values allow it, refused with the
    column named otherwise), must be non-empty, belong to this run and form one tree per phase; non-finite
    floats are read as null.
    """
    folder = _run_folder(path, runs)
    where = shown(folder)
    meta = _load_meta(folder)
    if meta.get("schema_version", 0) > schema.SCHEMA_VERSION:
        migrate(meta, pl.DataFrame(), where)
    table = _read_parquet(folder, COMPONENTS_FILE)
    if meta.get("schema_version", 0) < schema.SCHEMA_VERSION:
        rows = _frame(table, folder / COMPONENTS_FILE)
        meta, rows = migrate(meta, rows, where)
        table = rows.to_arrow()
    _check_meta(meta, folder)
    rows = _frame(conform(table, schema.COMPONENTS_SCHEMA, f"{where}/{COMPONENTS_FILE}"), folder / COMPONENTS_FILE)
    _check_rows(rows, meta, f"{where}/{COMPONENTS_FILE}")
    ops = None
    if (folder / OPS_FILE).exists():
        ops = _frame(conform_ops(_read_parquet(folder, OPS_FILE), f"{where}/{OPS_FILE}"), folder / OPS_FILE)
    samples = None
    if (folder / SAMPLES_FILE).exists():
        samples = _frame(conform(_read_parquet(folder, SAMPLES_FILE), schema.SAMPLES_SCHEMA, f"{where}/{SAMPLES_FILE}"),
                         folder / SAMPLES_FILE)
    ranks = None
    if (folder / RANKS_FILE).exists():
        ranks = _frame(conform(_read_parquet(folder, RANKS_FILE), schema.COMPONENTS_SCHEMA, f"{where}/{RANKS_FILE}"),
                       folder / RANKS_FILE)
    return Run(meta=meta, rows=rows, ops=ops, path=folder, samples=samples, ranks=ranks)


def _run_folder(spec: str | os.PathLike[str] | RunRef, runs: str | os.PathLike[str]) -> Path:
    """The folder `read_run` reads: a path object or a text naming an existing path or holding a path separator
    is a folder; any other text is resolved in the archive (a run id, model@version, model)."""
    if isinstance(spec, RunRef):
        return spec.path
    if not isinstance(spec, str) or os.path.lexists(spec) or os.sep in spec or (os.altsep or os.sep) in spec:
        return Path(spec)
    return resolve_run(spec, runs).path


def _read_parquet(folder: Path, name: str) -> pa.Table:
    try:
        with open_member(folder, name, MAX_PARQUET_BYTES) as f:
            return pq.read_table(f)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise CbsiteError(f"run folder {shown(folder)} is unreadable: {name}: {exc}") from exc


def _frame(table: pa.Table, file: Path) -> pl.DataFrame:
    try:
        frame = pl.from_arrow(table)
    except (pl.exceptions.PolarsError, pa.ArrowException, ValueError, TypeError) as exc:
        raise CbsiteError(f"{shown(file)} is unreadable: {exc}") from exc
    assert isinstance(frame, pl.DataFrame)
    return frame


def conform(table: pa.Table, target: pa.Schema, where: str) -> pa.Table:
    """`table` with exactly `target`'s columns and types, non-finite floats as null.

    A column of another type is cast when every value converts exactly; a missing column, a value that does
    not convert, or a null in a non-nullable column is refused with the column named. Extra columns are dropped.
    """
    missing = [f.name for f in target if f.name not in table.column_names]
    if missing:
        raise CbsiteError(f"{where} lacks columns {missing}")
    columns = []
    for f in target:
        column = table.column(f.name)
        if column.type != f.type:
            try:
                column = column.cast(f.type, safe=True)
            except (pa.ArrowException, ValueError, TypeError) as exc:
                raise CbsiteError(f"{where}: column {f.name} has type {column.type} where {f.type} is expected ({exc})") from None
        column = _finite(column)
        if not f.nullable and column.null_count:
            raise CbsiteError(f"{where}: column {f.name} has {column.null_count} null values; it must have none")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=target.remove_metadata()).replace_schema_metadata(table.schema.metadata)


def conform_ops(table: pa.Table, where: str) -> pa.Table:
    """ops.parquet, whose columns are the plugins' (only `path` and `phase` are required): the columns that
    `schema.OPS_SCHEMA` names are checked as `conform` does; other columns are kept when they hold plain
    numbers, strings or booleans (anything else could not reach the site's JSON); non-finite floats as null."""
    required = {"path", "phase"}
    known = {f.name: f for f in schema.OPS_SCHEMA}
    present = pa.schema([known[n] if n in required else known[n].with_nullable(True)
                         for n in table.column_names if n in known])
    missing = sorted(required - set(table.column_names))
    if missing:
        raise CbsiteError(f"{where} lacks columns {missing}")
    checked = conform(table, present, where)
    names, columns = list(checked.column_names), list(checked.columns)
    for name in table.column_names:
        t = table.schema.field(name).type
        if name not in known and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                                  or pa.types.is_string(t) or pa.types.is_large_string(t)):
            names.append(name)
            columns.append(_finite(table.column(name)))
    return pa.Table.from_arrays(columns, names=names)


def _finite(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """NaN and +-inf as null, in float columns and in the float fields of lists of structs (plugin_metrics)."""
    t = column.type
    if pa.types.is_floating(t):
        if column.null_count == len(column) or pc.all(pc.is_finite(column)).as_py() is not False:
            return column
        return pc.if_else(pc.is_finite(column), column, pa.scalar(None, t))
    if pa.types.is_list(t) and pa.types.is_struct(t.value_type):
        chunks = []
        for chunk in column.chunks:
            values = chunk.values
            fields = [values.field(i) for i in range(values.type.num_fields)]
            fixed = [pc.if_else(pc.is_finite(v), v, pa.scalar(None, v.type)) if pa.types.is_floating(v.type) else v for v in fields]
            struct = pa.StructArray.from_arrays(fixed, fields=list(values.type), mask=values.is_null())
            chunks.append(pa.ListArray.from_arrays(chunk.offsets, struct, type=t, mask=chunk.is_null()))
        return pa.chunked_array(chunks, type=t)
    return column


def _check_rows(rows: pl.DataFrame, meta: dict[str, Any], where: str) -> None:
    """The rows are one run's: non-empty, identity as in run.json, known phases and statuses, one tree per phase."""
    if rows.is_empty():
        raise CbsiteError(f"{where} has no rows")
    for column in ("run_id", "model", "version"):
        other = sorted(set(rows.get_column(column).unique().to_list()) - {meta[column]})
        if other:
            raise CbsiteError(f"{where}: rows of {column} {other[0]!r} in run {meta[column]!r}")
    for column, allowed in (("phase", schema.PHASES), ("status", schema.STATUSES)):
        bad = sorted(set(rows.get_column(column).unique().to_list()) - set(allowed))
        if bad:
            raise CbsiteError(f"{where}: column {column} holds {bad[0]!r}; expected one of {', '.join(allowed)}")
    dup = rows.group_by(["path", "phase"]).len().filter(pl.col("len") > 1)
    if dup.height:
        raise CbsiteError(f"{where}: component {dup.get_column('path')[0]!r} has {dup.get_column('len')[0]} rows in one phase")
    for phase in rows.get_column("phase").unique().sort().to_list():
        prows = rows.filter(pl.col("phase") == phase)
        paths = set(prows.get_column("path").to_list())
        if "" not in paths:
            raise CbsiteError(f"{where}: the {phase} rows have no root component (path '')")
        orphans = sorted(set(prows.get_column("parent").drop_nulls().to_list()) - paths)
        if orphans:
            raise CbsiteError(f"{where}: a {phase} row names parent {orphans[0]!r}, which has no row")


@dataclass(frozen=True, order=True)
class RunRef:
    """Where a run lives, without reading it. Sorts by model, version, then time."""

    model: str
    version: str
    run_id: str
    path: Path = field(compare=False)


def list_runs(root: str | os.PathLike[str] = "runs") -> list[RunRef]:
    """Every complete run under `root`, sorted. Dot-folders, folders whose names are not valid model,
    version or run names (see `invalid_folders`) and runs still being renamed into place are ignored."""
    base = Path(root)
    refs: list[RunRef] = []
    if not base.is_dir():
        return refs
    for model_dir in sorted(base.iterdir()):
        if not model_dir.is_dir() or not schema.NAME_RE.match(model_dir.name):
            continue
        for version_dir in sorted(model_dir.iterdir()):
            if not version_dir.is_dir() or not schema.NAME_RE.match(version_dir.name):
                continue
            for run_dir in sorted(version_dir.iterdir()):
                if run_dir.is_dir() and schema.RUN_ID_RE.match(run_dir.name) and not _unfinished(run_dir):
                    refs.append(RunRef(model_dir.name, version_dir.name, run_dir.name, run_dir))
    return sorted(refs)


def _unfinished(run_dir: Path) -> bool:
    return (run_dir / (COMPONENTS_FILE + PARTIAL)).exists() and not (run_dir / COMPONENTS_FILE).exists()


# Top-level folders cbsite keeps beside the models: comparison records (diff/comparison.py), study records (study.py).
RESERVED_FOLDERS = ("_comparisons", "_studies")


def invalid_folders(root: str | os.PathLike[str] = "runs") -> list[tuple[str, str]]:
    """(folder as printable text, the problem) for each folder where a model, version or run folder would be
    whose name is not one: `list_runs` ignores them, listings and the site name them. Dot-folders are not
    reported (the staging area, `.git`, ...)."""
    base = Path(root)
    out: list[tuple[str, str]] = []
    if not base.is_dir():
        return out
    levels = (("model", schema.NAME_RE), ("version", schema.NAME_RE), ("run", schema.RUN_ID_RE))

    def visit(folder: Path, depth: int) -> None:
        kind, pattern = levels[depth]
        for entry in sorted(folder.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            if depth == 0 and entry.name in RESERVED_FOLDERS:  # records beside the runs, not models
                continue
            if not pattern.match(entry.name):
                rel = shown(entry.relative_to(base))
                expected = "YYYYMMDDTHHMMSSZ-xxxxxx" if kind == "run" else "letters, digits, '.', '_', '-'"
                out.append((rel, f"ignored: {shown(entry.name)!r} is not a valid {kind} folder name ({expected})"))
            elif depth + 1 < len(levels):
                visit(entry, depth + 1)

    visit(base, 0)
    return out


def resolve_run(spec: str, root: str | os.PathLike[str] = "runs") -> RunRef:
    """Find a run by run id, `model@version` (its newest run), `model` (newest run) or folder path."""
    as_path = Path(spec)
    if (as_path / RUN_JSON).is_file():
        meta = read_meta(as_path)
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
