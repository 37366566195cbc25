"""The archive: names, atomic writes, round trips readable without cbsite, migrations, layering."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from cbsite import archive, leftovers, migration, schema
from cbsite.collector import profile
from cbsite.errors import CbsiteError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_run(fast_config):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    return profile(model, torch.randn(4, 8), model_name="mlp", version="v1", config=fast_config)


def test_round_trip_keeps_schema_and_metadata(small_run, tmp_path):
    path = small_run.save(tmp_path)
    assert path == tmp_path / "mlp" / "v1" / small_run.run_id
    back = archive.read_run(path)
    assert back.meta == json.loads((path / "run.json").read_text())
    assert back.rows.columns == schema.COLUMNS
    assert back.table().equals(small_run.table())
    table = pq.read_table(path / "components.parquet")
    assert table.schema.remove_metadata() == schema.COMPONENTS_SCHEMA
    embedded = json.loads(table.schema.metadata[schema.PARQUET_META_KEY])
    assert embedded["run_id"] == small_run.run_id and embedded["schema_version"] == schema.SCHEMA_VERSION


def test_archive_is_readable_without_cbsite(small_run, tmp_path):
    small_run.save(tmp_path)
    dataset = ds.dataset(sorted(str(p) for p in tmp_path.glob("*/*/*/components.parquet")), format="parquet")
    assert set(dataset.to_table().column("model").to_pylist()) == {"mlp"}
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(
        f"select path, phase, flops from read_parquet('{tmp_path}/**/components.parquet') where path = '0' order by phase"
    ).fetchall()
    assert rows == [("0", "backward", 2 * 4 * 8 * 8), ("0", "forward", 2 * 4 * 8 * 8)]


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 65, "sp ace", "é"])
def test_unsafe_names_are_refused(bad):
    with pytest.raises(CbsiteError, match="invalid model name"):
        schema.check_name("model", bad)


def test_run_ids_sort_by_time():
    from datetime import datetime, timezone

    early = archive.new_run_id(datetime(2026, 1, 1, tzinfo=timezone.utc))
    late = archive.new_run_id(datetime(2026, 1, 2, tzinfo=timezone.utc))
    assert schema.RUN_ID_RE.match(early) and early < late
    # Within one second, by the millisecond: a model's newest run is the later of two runs started in one second.
    in_one_second = [archive.new_run_id(datetime(2026, 1, 1, 0, 0, 0, ms * 1000, tzinfo=timezone.utc))
                     for ms in (0, 1, 15, 16, 255, 256, 998, 999)]
    assert all(schema.RUN_ID_RE.match(i) for i in in_one_second) and in_one_second == sorted(in_one_second)
    assert len({archive.new_run_id(datetime(2026, 1, 1, tzinfo=timezone.utc)) for _ in range(50)}) > 40  # random tail


def test_killed_writer_leaves_no_visible_run(small_run, tmp_path):
    """A writer killed while writing leaves only a staging folder that no reader (nor a `**` glob) sees."""
    meta = dict(small_run.meta, run_id=archive.new_run_id())
    meta_file = tmp_path / "meta.json"
    meta_file.write_text(json.dumps(meta))
    small_run.rows.write_parquet(tmp_path / "rows.parquet")
    script = textwrap.dedent(
        f"""
        import json, time, polars as pl, pyarrow.parquet as pq
        from cbsite import archive
        real = pq.write_table
        def slow(*a, **k):
            real(*a, **k)
            print("written", flush=True)
            time.sleep(60)  # killed here, before the rename
        pq.write_table = slow
        archive.pq.write_table = slow
        archive.write_run({str(tmp_path / 'arch')!r}, json.load(open({str(meta_file)!r})),
                          pl.read_parquet({str(tmp_path / 'rows.parquet')!r}).to_arrow())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "arch" / "mlp").exists()
    [staged] = (tmp_path / "arch" / archive.STAGING_DIR).iterdir()
    assert (staged / "components.parquet.partial").is_file()
    assert archive.list_runs(tmp_path / "arch") == []
    assert list((tmp_path / "arch").glob("**/components.parquet")) == []
    assert [s.path for s in leftovers.stale_staging(tmp_path / "arch")] == [staged]


def test_newer_schema_is_refused_with_both_versions(small_run, tmp_path):
    path = small_run.save(tmp_path)
    meta = json.loads((path / "run.json").read_text())
    meta["schema_version"] = schema.SCHEMA_VERSION + 1
    (path / "run.json").write_text(json.dumps(meta))
    with pytest.raises(CbsiteError, match=f"schema version {schema.SCHEMA_VERSION + 1}.*up to version {schema.SCHEMA_VERSION}"):
        archive.read_run(path)


def test_older_schema_is_migrated_step_by_step(small_run, tmp_path, monkeypatch):
    path = small_run.save(tmp_path)
    meta = json.loads((path / "run.json").read_text())
    meta["schema_version"] = 0
    (path / "run.json").write_text(json.dumps(meta))
    seen = []

    def step(m, rows):
        seen.append(m["schema_version"])
        return m, rows

    monkeypatch.setitem(migration.MIGRATIONS, 0, step)
    assert archive.read_run(path).meta["schema_version"] == schema.SCHEMA_VERSION and seen == [0]


def test_resolve_by_id_model_version_and_path(small_run, tmp_path):
    path = small_run.save(tmp_path)
    for spec in (small_run.run_id, "mlp@v1", "mlp", str(path)):
        assert archive.resolve_run(spec, tmp_path).run_id == small_run.run_id
    with pytest.raises(CbsiteError, match="Known: mlp@v1"):
        archive.resolve_run("other@v9", tmp_path)


def test_broken_run_is_reported(small_run, tmp_path):
    path = small_run.save(tmp_path)
    (path / "components.parquet").write_bytes(b"not parquet")
    with pytest.raises(CbsiteError, match="unreadable"):
        archive.read_run(path)


def test_core_modules_do_not_import_torch_or_site_libraries():
    code = textwrap.dedent(
        """
        import sys
        import cbsite, cbsite.schema, cbsite.archive, cbsite.tree, cbsite.errors, cbsite.cli
        try:
            import cbsite.diff.rundiff
        except ImportError:
            pass
        bad = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'torchrec', 'fbgemm_gpu', 'jinja2', 'mkdocs', 'altair', 'vl_convert'})
        print(bad)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_collector_and_generator_do_not_import_each_other():
    for pkg, other in (("collector", "generator"), ("generator", "collector")):
        folder = ROOT / "cbsite" / pkg
        for file in folder.rglob("*.py"):
            text = file.read_text()
            assert f"cbsite.{other}" not in text and f"from . import {other}" not in text, file


def test_read_meta_reads_run_json_alone_and_refuses_newer(small_run, tmp_path):
    path = small_run.save(tmp_path)
    (path / "components.parquet").unlink()  # a listing must not need the rows
    assert archive.read_meta(path) == json.loads(json.dumps(small_run.meta))  # tuples come back as lists
    meta = json.loads((path / "run.json").read_text())
    meta["schema_version"] = schema.SCHEMA_VERSION + 1
    (path / "run.json").write_text(json.dumps(meta))
    with pytest.raises(CbsiteError, match="upgrade cbsite"):
        archive.read_meta(path)
