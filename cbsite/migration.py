"""Schema migrations: one function per step brings an older run's metadata and rows to the current schema.

Pure data (no files): archive.read_run migrates what it reads, `cbsite upgrade` (archive.upgrade_archive) writes
the result back. A newer schema is refused with both versions named.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from cbsite import schema
from cbsite.errors import CbsiteError

# One function per schema step: MIGRATIONS[n] turns version n into n + 1.
Migration = Callable[[dict[str, Any], pl.DataFrame], tuple[dict[str, Any], pl.DataFrame]]


def _with_null_columns(rows: pl.DataFrame, fields: list[pa.Field]) -> pl.DataFrame:
    """`rows` with each of `fields` it lacks added as a null column of the field's type."""
    missing = [f for f in fields if f.name not in rows.columns]
    if not missing or not rows.width:
        return rows
    nulls = pl.from_arrow(pa.table({f.name: pa.nulls(rows.height, f.type) for f in missing}))
    assert isinstance(nulls, pl.DataFrame)
    return pl.concat([rows, nulls], how="horizontal")


def _v1_to_v2(meta: dict[str, Any], rows: pl.DataFrame) -> tuple[dict[str, Any], pl.DataFrame]:
    """Schema 2 keeps raw samples; a version-1 run had none, and says so instead of inventing them.

    The plugin columns arrived during version 1: the first version-1 runs lack them, and get them null."""
    meta = dict(meta)
    meta.setdefault("samples", None)
    meta.setdefault("rounds", 1)
    meta.setdefault(
        "samples_note", "collected before schema 2: no raw timing samples were kept; latencies are within-run medians"
    )
    return meta, _with_null_columns(rows, schema.PLUGIN_FIELDS)


def _v2_to_v3(meta: dict[str, Any], rows: pl.DataFrame) -> tuple[dict[str, Any], pl.DataFrame]:
    """Schema 3 adds the sharded-run columns; a version-2 run is one process: they are null."""
    meta = dict(meta)
    meta.setdefault("distributed", None)
    return meta, _with_null_columns(rows, schema.DISTRIBUTED_FIELDS)


MIGRATIONS: dict[int, Migration] = {1: _v1_to_v2, 2: _v2_to_v3}


def migrate(meta: dict[str, Any], rows: pl.DataFrame, path: Path | str = "") -> tuple[dict[str, Any], pl.DataFrame]:
    """Bring a run's metadata and rows up to SCHEMA_VERSION, or refuse a newer one."""
    found = schema_version(meta, path)
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


def schema_version(meta: dict[str, Any], path: Path | str) -> int:
    found = meta.get("schema_version", 0)
    if type(found) is not int or found < 0:
        raise CbsiteError(f"run {path} is unreadable: schema_version must be a whole number, found {found!r}")
    return found
