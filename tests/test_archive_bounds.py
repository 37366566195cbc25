"""Archive content is read within bounds (cbsite/archive.py, cbsite/artifacts.py): only regular files inside a
run folder and below a size cap, gzip traces unpacked as a stream with a cap; `gc` removes only what cbsite
staged; names match whole; metadata of every schema version is checked. Hostile archives on disk, the real CLI
(in a subprocess with a memory limit where the old code would read without end)."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cbsite import archive, artifacts, schema
from cbsite.errors import CbsiteError
from tests.helpers.runfactory import make_run, write_archive

CBSITE = [sys.executable, "-m", "cbsite"]
SPEC = {"": {"a": {"a.x": None, "a.y": None}, "b": None}}
# The CLI's data segment in these tests: far below what reading /dev/zero until MemoryError takes (the build
# maps more: the Vega bundle's JavaScript engine reserves address space).
MEMORY_LIMIT = {"build": 6 << 30}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    limit = MEMORY_LIMIT.get(args[0], 2 << 30)
    env = {**os.environ, "CBSITE_BUILD_JOBS": "1"}
    return subprocess.run([*CBSITE, *args], check=False, capture_output=True, text=True, cwd=cwd, timeout=240, env=env,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit)))


def _two_runs(root: Path) -> tuple[Path, Path]:
    good, bad = write_archive(root, [make_run(SPEC, model="good", version="v1"), make_run(SPEC, model="bad", version="v1")])
    return good, bad


def _run_json_replaced(kind: str) -> Callable[[Path, Path], None]:
    """A run whose run.json is no regular file inside the run (`kind`)."""
    def breaks(run: Path, base: Path) -> None:
        target = run / archive.RUN_JSON
        text = target.read_text()
        target.unlink()
        if kind == "dev-zero":
            target.symlink_to("/dev/zero")
        elif kind == "fifo":
            os.mkfifo(target)
        elif kind == "outside":  # a valid run.json, but not the run's own
            (base / "elsewhere.json").write_text(text)
            target.symlink_to(base / "elsewhere.json")
        else:  # a sparse file far above the cap: refused by its size, never read
            with open(target, "wb") as f:
                f.truncate(archive.MAX_RUN_JSON_BYTES * 64)
    return breaks


def _older_schema(version: int, change: dict[str, Any]) -> Callable[[Path, Path], None]:
    """A run whose run.json is of an older schema version and malformed for it."""
    def breaks(run: Path, base: Path) -> None:
        meta = json.loads((run / archive.RUN_JSON).read_text())
        meta.update(change, schema_version=version)
        (run / archive.RUN_JSON).write_text(json.dumps(meta))
    return breaks


# Each way a run can be broken that ls, show and build must skip, by the broken run's model name.
RUN_JSON_KINDS = ["dev-zero", "fifo", "outside", "huge"]
OLDER_SCHEMA = {"v2-device": (2, {"device": "cpu"}), "v1-counts": (1, {"counts": "many"}),
                "v2-model": (2, {"model": "other model"}), "v1-run-id": (1, {"run_id": 7})}
BROKEN: dict[str, Callable[[Path, Path], None]] = {
    **{kind: _run_json_replaced(kind) for kind in RUN_JSON_KINDS},
    **{name: _older_schema(*how) for name, how in OLDER_SCHEMA.items()},
}


@dataclass
class Hostile:
    """One archive holding a good run and one run per way of BROKEN (model `bad-<way>`), listed and built once by
    the real CLI; `show` is run per broken run by its test."""

    root: Path
    good: Path
    bad: dict[str, Path]
    ls: subprocess.CompletedProcess[str]
    build: subprocess.CompletedProcess[str]
    site: Path


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Hostile:
    base = tmp_path_factory.mktemp("hostile")
    root = base / "runs"
    good, *bad = write_archive(root, [make_run(SPEC, model="good", version="v1")]
                               + [make_run(SPEC, model=f"bad-{way}", version="v1") for way in BROKEN])
    for breaks, run in zip(BROKEN.values(), bad):
        breaks(run, base)
    ls = _cli("ls", "--runs", str(root), cwd=base)
    build = _cli("build", "--runs", str(root), "--out", str(base / "site"), cwd=base)
    return Hostile(root, good, dict(zip(BROKEN, bad)), ls, build, base / "site")


def _assert_skipped_everywhere(hostile: Hostile, way: str) -> None:
    root, good, bad, ls, build = hostile.root, hostile.good, hostile.bad[way], hostile.ls, hostile.build
    assert ls.returncode == 0, ls.stderr[-2000:]
    assert good.name in ls.stdout and "Traceback" not in ls.stderr
    # One row for the bad run (its first cell), whatever the table wraps: the path in the reason holds its name too.
    rows = [line for line in ls.stdout.splitlines() if line.lstrip("│ ").startswith(f"bad-{way} ")]
    assert len(rows) == 1 and "unreadable" in rows[0], ls.stdout
    show = _cli("show", bad.name, "--runs", str(root), cwd=root.parent)
    assert show.returncode == 2 and len(show.stderr.strip().splitlines()) == 1, show.stderr[-2000:]
    assert "unreadable" in show.stderr
    assert build.returncode == 0, build.stderr[-2000:]
    assert f"skipped run bad-{way}/v1/{bad.name}" in build.stderr
    assert (hostile.site / "runs" / "good" / "v1" / good.name / "index.html").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("kind", RUN_JSON_KINDS)
def test_run_json_that_is_no_regular_file_inside_the_run_is_skipped(kind, hostile):
    _assert_skipped_everywhere(hostile, kind)


def test_components_parquet_as_a_device_is_skipped(tmp_path):
    root = tmp_path / "runs"
    good, bad = _two_runs(root)
    (bad / archive.COMPONENTS_FILE).unlink()
    (bad / archive.COMPONENTS_FILE).symlink_to("/dev/zero")
    with pytest.raises(CbsiteError, match="components.parquet"):
        archive.read_run(bad)
    assert archive.read_run(good).rows.height


def _bomb(path: Path, unpacked: int) -> None:
    """A gzip file of `unpacked` bytes of JSON-looking text that packs to about a thousandth of that: one packed
    mebibyte repeated (a gzip file may hold many members; readers unpack them all, one after another)."""
    member = gzip.compress(b'"0", ' * (1 << 18), compresslevel=9, mtime=0)
    with open(path, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": [', mtime=0))
        for _ in range(unpacked >> 20):
            f.write(member)


def test_gzip_bomb_is_refused_at_the_cap_with_little_memory(tmp_path):
    bomb = tmp_path / "forward.trace.json.gz"
    _bomb(bomb, artifacts.MAX_UNPACKED_BYTES + (64 << 20))
    assert bomb.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(artifacts.ArtifactError, match="unpacks to more than"):
            artifacts.cleaned(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak >> 20} MiB while refusing a gzip bomb"


def test_large_trace_is_cleaned_as_a_stream(tmp_path):
    """A big trace under the cap is cleaned (paths made relative) without holding it unpacked."""
    trace = tmp_path / "forward.trace.json.gz"
    event = b'{"name": "aten::mm", "args": {"file": "/home/alice/src/pkg/model.py"}, "ph": "X"},\n'
    n = (12 << 20) // len(event)
    with gzip.GzipFile(trace, "wb", mtime=0) as gz:
        gz.write(b'{"traceEvents": [\n')
        for _ in range(n // 4096):
            gz.write(event * 4096)
        gz.write(b'{"name": "end"}]}\n')
    tracemalloc.start()
    try:
        packed = artifacts.cleaned(trace)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak >> 20} MiB cleaning a {n * len(event) >> 20} MiB trace"
    text = gzip.decompress(packed)
    assert b"/home/alice" not in text and text.count(b'"file": "pkg/model.py"') == n // 4096 * 4096
    json.loads(text)


def test_build_skips_a_gzip_bomb_trace_and_carries_on(tmp_path):
    root = tmp_path / "runs"
    [run] = write_archive(root, [make_run(SPEC, model="m", version="v1")])
    (run / "artifacts" / "a").mkdir(parents=True)
    _bomb(run / "artifacts" / "a" / "forward.trace.json.gz", artifacts.MAX_UNPACKED_BYTES + (32 << 20))
    build = _cli("build", "--runs", str(root), "--out", str(tmp_path / "site"), cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    assert "forward.trace.json.gz unpacks to more than" in build.stderr
    assert not (tmp_path / "site" / "runs" / "m" / "v1" / run.name / "artifacts" / "a" / "forward.trace.json.gz").exists()


# --- gc removes only what cbsite staged -----------------------------------------------------------


def _old(folder: Path) -> None:
    past = time.time() - 3600
    os.utime(folder, (past, past))


def test_gc_leaves_folders_without_the_marker(tmp_path, capsys):
    from cbsite.cli import main

    root = tmp_path / "runs"
    [run] = write_archive(root, [make_run(SPEC, model="m", version="v1")])
    version = run.parent
    # Someone's own folders that only look like staging: no marker inside.
    foreign = [archive.staging_dir(root) / "notes", version / ".drafts.partial", version / ".20260101T000000Z-abcdef.partial"]
    for folder in foreign:
        folder.mkdir(parents=True)
        (folder / "thesis.tex").write_text("mine\n")
        _old(folder)
    # What a killed cbsite left: staging folders with its marker, the owner gone.
    dead = archive.new_staging(archive.staging_dir(root), "run-")
    (dead / archive.OWNER_FILE).write_text(json.dumps({"pid": 2**22 + 12345, "host": os.uname().nodename}))
    (dead / "components.parquet.partial").write_bytes(b"half")
    assert main(["gc", "--runs", str(root)]) == 0
    out = capsys.readouterr().out
    assert not dead.exists() and f"removed {dead}" in out
    for folder in foreign:
        assert (folder / "thesis.tex").read_text() == "mine\n", folder
        assert f"left {folder}" in out, out
    assert run.is_dir()


def test_gc_in_a_folder_that_is_no_archive_removes_nothing(tmp_path, capsys):
    from cbsite.cli import main

    home = tmp_path / "home"
    for rel in ("a/b/.x.partial/keep.txt", "a/b/.20250101T000000Z-000001.partial/data.csv", ".cbsite-staging/y/z.txt"):
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text("keep")
    for p in home.rglob("*"):
        if p.is_dir():
            _old(p)
    assert main(["gc", "--runs", str(home)]) == 0
    assert sorted(p.name for p in home.rglob("*") if p.is_file()) == ["data.csv", "keep.txt", "z.txt"]


# --- names match whole ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dlrm\n", "v1\n", "dlrm\r\n"])
def test_names_with_a_trailing_newline_are_refused(name, tmp_path):
    with pytest.raises(CbsiteError, match="invalid"):
        schema.check_name("model", name)
    run = make_run(SPEC, model="m", version="v1")
    for key in ("model", "version", "run_id"):
        meta = {**run.meta, key: run.meta[key] + "\n"}
        with pytest.raises(CbsiteError):
            schema.check_meta(meta)
    assert not schema.RUN_ID_RE.match(run.meta["run_id"] + "\n")
    # A folder named so is not listed as a run: it is reported.
    root = tmp_path / "runs"
    [saved] = write_archive(root, [run])
    odd = root / name
    odd.mkdir()
    (odd / "v1").mkdir()
    os.rename(saved.parent.parent / "v1" / saved.name, odd / "v1" / saved.name)
    assert archive.list_runs(root) == []
    assert any(name.strip() in folder for folder, _ in archive.invalid_folders(root))


# --- metadata of every schema version is checked -------------------------------------------------


@pytest.mark.parametrize("way", sorted(OLDER_SCHEMA))
def test_malformed_older_schema_run_is_skipped(way, hostile):
    bad = hostile.bad[way]
    with pytest.raises(CbsiteError, match="unreadable"):
        archive.read_meta(bad)
    with pytest.raises(CbsiteError, match="unreadable"):
        archive.read_run(bad)
    _assert_skipped_everywhere(hostile, way)
