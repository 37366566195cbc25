"""One archive, every reader: the documented polars and DuckDB snippets (each fenced python block right after an
`<!-- archive-reader -->` line in README.md or docs/*.md) run as written, without cbsite, on the tests' archive
and on an archive that mixes every schema version ever written; `cbsite upgrade` rewrites the older runs of
such an archive at the current schema, in place, as the reader migrates them.

A snippet reads the archive from the folder that holds `runs/` and leaves its rows in `rows` (a polars
DataFrame or LazyFrame): every row of every run, with every column of the current schema."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cbsite import archive, schema
from cbsite.cli import main

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- archive-reader -->"
SNIPPET = re.compile(re.escape(MARKER) + r"[ \t]*\n(?:[ \t]*\n)*```python[ \t]*\n(.*?)\n```", re.S)

# The columns each schema version wrote (cbsite/schema.py's history): the first version-1 runs had no plugin
# columns (they came later in version 1), version 2 added raw samples only, version 3 the sharded-run columns.
V1_FIELDS = schema.IDENTITY_FIELDS + schema.METRIC_FIELDS + schema.LINK_FIELDS
V2_FIELDS = schema.IDENTITY_FIELDS + schema.METRIC_FIELDS + schema.PLUGIN_FIELDS + schema.LINK_FIELDS
# run.json keys each step added (migration.MIGRATIONS): absent from the runs written before it.
ADDED_META = {2: ("samples", "rounds", "samples_note"), 3: ("distributed",)}


def reader_snippets() -> list[tuple[str, str]]:
    """(where, code) of every marked python block in README.md and the manual."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        if doc.is_file():
            for i, code in enumerate(SNIPPET.findall(doc.read_text())):
                found.append((f"{doc.relative_to(ROOT)}#{i + 1}", code))
    return found


SNIPPETS = reader_snippets()


def _older_run(source: Path, root: Path, model: str, version: int, fields: list[pa.Field] | None) -> Path:
    """`source` (a run at the current schema) as schema `version` wrote it: its columns and run.json keys only."""
    meta = json.loads((source / archive.RUN_JSON).read_text())
    meta.update(model=model, schema_version=version, run_id=f"2025010{version}T000000Z-00000{version}")
    for step, keys in ADDED_META.items():
        if version < step:
            for key in keys:
                meta.pop(key, None)
    folder = root / model / meta["version"] / meta["run_id"]
    folder.mkdir(parents=True)
    embedded = {schema.PARQUET_META_KEY: json.dumps(meta, sort_keys=True).encode()}

    def rewrite(name: str, keep: list[pa.Field] | None) -> None:
        table = pq.read_table(source / name)
        for column in ("model", "run_id"):
            table = table.set_column(table.column_names.index(column), column, pa.array([meta[column]] * table.num_rows))
        if keep is not None:
            table = table.select([f.name for f in keep]).cast(pa.schema(keep))
        pq.write_table(table.replace_schema_metadata(embedded), folder / name)

    rewrite(archive.COMPONENTS_FILE, fields)
    if version >= 2 and (source / archive.SAMPLES_FILE).exists():
        rewrite(archive.SAMPLES_FILE, None)
    if version >= 3 and (source / archive.RANKS_FILE).exists():
        rewrite(archive.RANKS_FILE, None)
    (folder / archive.RUN_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return folder


@pytest.fixture
def mixed_runs(demo_runs, tmp_path) -> Path:
    """Runs of schema 1, 2 and 3 side by side, the oldest first in every glob's order (the case a reader that
    takes its columns from the first file gets wrong): a demo run as each version wrote it, and a sharded run."""
    root = tmp_path / "mixed" / "runs"
    dense = archive.resolve_run("dlrm@v1", demo_runs).path
    sharded = archive.resolve_run("dlrm-sharded@row-wise", demo_runs).path
    _older_run(dense, root, "m1-schema1", 1, V1_FIELDS)
    _older_run(dense, root, "m2-schema2", 2, V2_FIELDS)
    _older_run(sharded, root, "m3-schema3", 3, None)
    return root


def _expected(root: Path) -> dict[str, int]:
    """run_id -> rows of its components.parquet, read with pyarrow alone."""
    return {f.parent.name: pq.read_metadata(f).num_rows for f in root.glob("*/*/*/" + archive.COMPONENTS_FILE)}


def _run_snippet(code: str, folder: Path, monkeypatch) -> pl.DataFrame:
    monkeypatch.chdir(folder)
    namespace: dict = {"__name__": "__snippet__"}
    exec(compile(code, "<archive-reader snippet>", "exec"), namespace)
    rows = namespace.get("rows")
    assert rows is not None, "an archive-reader snippet leaves the archive's rows in `rows` (docs/archive.md)"
    return rows.collect() if isinstance(rows, pl.LazyFrame) else pl.DataFrame(rows)


def test_the_manual_gives_a_polars_and_a_duckdb_reader():
    manual = [code for where, code in SNIPPETS if where.startswith("docs/archive.md")]
    assert any("import polars" in c for c in manual) and any("import duckdb" in c for c in manual), manual
    assert all("cbsite" not in code for _, code in SNIPPETS)  # readers of the files, not of cbsite


@pytest.mark.parametrize("which", ["demo", "mixed"])
@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_documented_reader_reads_every_run_with_every_column(where, code, which, demo_runs, mixed_runs, monkeypatch,
                                                             capsys):
    root = demo_runs if which == "demo" else mixed_runs
    expected = _expected(root)
    rows = _run_snippet(code, root.parent, monkeypatch)
    capsys.readouterr()  # what the snippet printed
    assert rows.height == sum(expected.values()), where
    assert dict(rows.group_by("run_id").len().iter_rows()) == expected, where
    assert set(schema.COLUMNS) <= set(rows.columns), (where, sorted(set(schema.COLUMNS) - set(rows.columns)))
    if which == "mixed":
        by_model = {m: rows.filter(pl.col("model") == m) for m in ("m1-schema1", "m2-schema2", "m3-schema3")}
        # What a run never wrote is null; what it wrote is read as written.
        assert by_model["m1-schema1"]["compile_speedup"].null_count() == by_model["m1-schema1"].height
        assert by_model["m2-schema2"]["rank"].null_count() == by_model["m2-schema2"].height
        assert by_model["m3-schema3"]["rank"].drop_nulls().len() == by_model["m3-schema3"].height
        assert by_model["m2-schema2"]["compile_speedup"].drop_nulls().len() > 0
        assert by_model["m1-schema1"]["flops"].sum() == by_model["m2-schema2"]["flops"].sum() > 0


def test_one_glob_without_options_refuses_a_mixed_archive(mixed_runs, monkeypatch):
    """Why the manual gives reader options: the plain glob takes its columns from the first file."""
    monkeypatch.chdir(mixed_runs.parent)
    with pytest.raises(pl.exceptions.PolarsError):
        pl.scan_parquet("runs/**/components.parquet").collect()


def _digest(root: Path) -> dict[str, str]:
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(root.rglob("*")) if f.is_file()}


def test_upgrade_rewrites_older_runs_as_the_reader_migrates_them(mixed_runs, capsys):
    before = {r.run_id: archive.read_run(r.path) for r in archive.list_runs(mixed_runs)}
    files = _digest(mixed_runs)

    assert main(["upgrade", "--runs", str(mixed_runs), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _digest(mixed_runs) == files  # a dry run changes nothing
    assert "would upgrade" in out and "(schema 1 -> 3)" in out and "(schema 2 -> 3)" in out
    assert f"2 runs to upgrade, 1 already at schema {schema.SCHEMA_VERSION}" in out

    assert main(["upgrade", "--runs", str(mixed_runs)]) == 0
    out = capsys.readouterr().out
    assert out.count("upgraded ") == 2 and f"2 runs upgraded, 1 already at schema {schema.SCHEMA_VERSION}" in out
    for ref in archive.list_runs(mixed_runs):
        meta = json.loads((ref.path / archive.RUN_JSON).read_text())
        assert meta["schema_version"] == schema.SCHEMA_VERSION
        for name in (archive.COMPONENTS_FILE, archive.SAMPLES_FILE, archive.RANKS_FILE):
            if (ref.path / name).exists():
                embedded = pq.read_schema(ref.path / name).metadata[schema.PARQUET_META_KEY]
                assert json.loads(embedded) == meta, name
        assert pq.read_schema(ref.path / archive.COMPONENTS_FILE).names == schema.COLUMNS
        after = archive.read_run(ref.path)
        assert after.meta == before[ref.run_id].meta  # what the reader gave before, now on disk
        assert after.rows.equals(before[ref.run_id].rows)
    v1 = archive.resolve_run("m1-schema1", mixed_runs).path
    assert json.loads((v1 / archive.RUN_JSON).read_text())["samples"] is None  # none invented
    # At one schema version, the plain glob reads the whole archive; no staged file is left behind.
    assert pl.scan_parquet(str(mixed_runs / "**" / archive.COMPONENTS_FILE)).collect().height == sum(_expected(mixed_runs).values())
    assert not any(archive.staging_dir(mixed_runs).glob("*"))

    upgraded = _digest(mixed_runs)
    assert main(["upgrade", "--runs", str(mixed_runs)]) == 0
    assert "0 runs upgraded, 3 already" in capsys.readouterr().out and _digest(mixed_runs) == upgraded


def test_upgrade_changes_nothing_when_a_run_cannot_be_upgraded(mixed_runs, demo_runs, capsys):
    """A run of a newer schema (or a broken one) stops the upgrade before any run is rewritten."""
    newer = shutil.copytree(archive.resolve_run("dlrm@v2", demo_runs).path,
                            mixed_runs / "zz-newer" / "v1" / archive.resolve_run("dlrm@v2", demo_runs).run_id)
    meta = json.loads((newer / archive.RUN_JSON).read_text())
    (newer / archive.RUN_JSON).write_text(json.dumps({**meta, "model": "zz-newer", "version": "v1",
                                                      "schema_version": schema.SCHEMA_VERSION + 1}))
    files = _digest(mixed_runs)
    assert main(["upgrade", "--runs", str(mixed_runs)]) == 2
    err = capsys.readouterr().err
    assert f"schema version {schema.SCHEMA_VERSION + 1}" in err and "upgrade cbsite" in err
    assert _digest(mixed_runs) == files


def test_upgrade_without_an_archive_says_what_to_give(tmp_path, capsys):
    assert main(["upgrade", "--runs", str(tmp_path / "nowhere")]) == 2
    assert "--runs" in capsys.readouterr().err
