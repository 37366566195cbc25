"""The build cache owns only what it made and reads its files as data (cbsite/generator/cache.py): a cache folder
over the archive, the site or the project is refused, a foreign folder is never emptied, a planted pickle runs
nothing, and two runs sharing a run id never share page numbers. Real archives, real builds, the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import warnings
from pathlib import Path

import pytest

from cbsite.cli import main
from cbsite.generator import build_site
from cbsite.generator import cache as bcache
from tests.helpers.site_archives import synthetic_run


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _build(runs: Path, out: Path, cache: Path | None) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_site(runs, out, quiet=True, cache=cache)
    return [str(w.message) for w in caught]


@pytest.fixture
def archive_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    runs = tmp_path / "runs"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1, n=12)
    synthetic_run(runs, "toy", "v2", seed=2, minutes=2, n=12, scale=1.3)
    return runs


@pytest.mark.parametrize("cache", [".", "runs", "runs/toy", "site", "site/x", "out-parent"])
def test_cache_over_the_archive_or_site_is_refused_and_the_archive_kept(archive_dir, tmp_path, monkeypatch, capsys, cache):
    monkeypatch.chdir(tmp_path)
    out = "out-parent/site" if cache == "out-parent" else "site"
    before = _digest(archive_dir)
    code = main(["build", "--runs", "runs", "--out", out, "--cache", cache])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--cache" in err and "choose" in err and len(err.strip().splitlines()) == 1, err
    assert _digest(archive_dir) == before


def test_cache_dot_beside_runs_with_a_marker_still_never_touches_the_archive(archive_dir, tmp_path, monkeypatch, capsys):
    """Even a folder that carries the cache's marker is refused where it holds the archive."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / bcache.MARKER).write_text("{}")
    before = _digest(archive_dir)
    assert main(["build", "--runs", "runs", "--out", "site", "--cache", "."]) == 2
    assert _digest(archive_dir) == before


def test_foreign_folder_as_cache_is_refused_untouched(archive_dir, tmp_path, capsys):
    foreign = tmp_path / "mine"
    for name in ("runs/keep.txt", "diffs/keep.txt", "memo/keep.pickle", "catalog.pickle", "site.json"):
        (foreign / name).parent.mkdir(parents=True, exist_ok=True)
        (foreign / name).write_text(f"my own {name}\n")
    before = _digest(foreign)
    code = main(["build", "--runs", str(archive_dir), "--out", str(tmp_path / "site"), "--cache", str(foreign)])
    err = capsys.readouterr().err
    assert code == 2 and "not a cbsite build cache" in err, err
    assert _digest(foreign) == before


def test_cache_that_holds_a_project_is_refused(archive_dir, tmp_path, capsys):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "mkdocs.yml").write_text("site_name: x\n")
    code = main(["build", "--runs", str(archive_dir), "--out", str(tmp_path / "site"), "--cache", str(project)])
    assert code == 2 and "project" in capsys.readouterr().err
    assert (project / "mkdocs.yml").read_text() == "site_name: x\n"


def test_prune_removes_only_manifest_entries(archive_dir, tmp_path):
    cache = tmp_path / "cache"
    _build(archive_dir, tmp_path / "site", cache)
    assert (cache / bcache.MARKER).is_file()
    manifest = json.loads((cache / bcache.MANIFEST).read_text())
    assert any(e.startswith("runs/") for e in manifest["entries"]) and any(e.startswith("diffs/") for e in manifest["entries"])
    # Something the cache did not write, in its own folders: a build leaves it, however unused.
    planted = [cache / "runs" / "not-mine", cache / "diffs" / "notes.txt", cache / "memo" / "x.pickle"]
    for p in planted:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("kept")
    # A run removed: its entry (the cache's own) goes at the next build.
    [gone] = [p for p in (archive_dir / "toy").iterdir() if p.name == "v2"]
    old_entries = set(manifest["entries"])
    for p in sorted(gone.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    gone.rmdir()
    _build(archive_dir, tmp_path / "site", cache)
    assert all(p.read_text() == "kept" for p in planted)
    now = set(json.loads((cache / bcache.MANIFEST).read_text())["entries"])
    removed = old_entries - now
    assert removed and all(not (cache / e).exists() for e in removed)
    assert all((cache / e).exists() for e in now)


class _Payload:
    """Unpickling this calls os.mkdir on the given path: what a planted cache file would run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_planted_pickle_in_the_cache_runs_nothing(archive_dir, tmp_path):
    cache, site = tmp_path / "cache", tmp_path / "site"
    _build(archive_dir, site, cache)
    fresh = tmp_path / "fresh"
    _build(archive_dir, fresh, None)
    pwned = tmp_path / "pwned"
    planted = [p for p in cache.rglob("*.pickle")]
    assert any(p.name == "value.pickle" for p in planted) and (cache / "catalog.pickle") in planted
    for p in planted:
        p.write_bytes(pickle.dumps({"runs": _Payload(str(pwned)), "rd": _Payload(str(pwned))}))
    caught = _build(archive_dir, site, cache)
    assert not pwned.exists()
    assert any("build cache" in w and "computed again" in w for w in caught), caught
    assert _digest(site) == _digest(fresh)
    # and the next build finds clean entries again
    assert not any("build cache" in w for w in _build(archive_dir, site, cache))
    # A pickle cut short (a killed build, a full disk) is computed again quietly: nothing was planted.
    value = next(cache.glob("runs/*/value.pickle"))
    value.write_bytes(value.read_bytes()[:40])
    assert not any("build cache" in w for w in _build(archive_dir, site, cache))
    assert _digest(site) == _digest(fresh)


def test_runs_sharing_a_run_id_keep_their_own_numbers(tmp_path, monkeypatch):
    """Two runs with one run id (a copied folder, a clash): never one's cached numbers on the other's page."""
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    a = synthetic_run(runs, "alpha", "v1", seed=5, minutes=1, n=12, scale=1.0)
    b = synthetic_run(runs, "beta", "v1", seed=5, minutes=1, n=12, scale=7.0)
    assert a.name == b.name
    alone = tmp_path / "alone"
    synthetic_run(alone, "alpha", "v1", seed=5, minutes=1, n=12, scale=1.0)
    _build(alone, tmp_path / "site-alone", None)
    want = (tmp_path / "site-alone" / "runs" / "alpha" / "v1" / a.name / "components.json").read_bytes()
    for _ in range(2):  # cold, then from the cache
        caught = _build(runs, tmp_path / "site", cache)
        page = tmp_path / "site" / "runs" / "{}" / "v1" / a.name / "components.json"
        # The first by folder is shown with its own numbers; the other is skipped, named, with the reason.
        assert Path(str(page).format("alpha")).read_bytes() == want
        assert not Path(str(page).format("beta")).exists()
        assert any(f"beta/v1/{a.name}" in w and "run id" in w and "alpha/v1" in w for w in caught), caught


@pytest.mark.parametrize("cache", [".", "runs", "docs"])
def test_plugin_cache_over_the_project_is_refused(archive_dir, tmp_path, cache):
    """The MkDocs plugin's `cache:` is checked as --cache is: never the project, the archive or the docs."""
    import subprocess
    import sys

    proj = tmp_path
    (proj / "docs").mkdir()
    (proj / "docs" / "index.md").write_text("# Team docs\n")
    (proj / "mkdocs.yml").write_text(f"site_name: Team docs\nplugins:\n  - cbsite:\n      runs: runs\n      cache: {cache}\n")
    before = _digest(archive_dir), _digest(proj / "docs")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], check=False, cwd=proj,
                          capture_output=True,
                          text=True, timeout=300, env={**os.environ, "CBSITE_BUILD_JOBS": "1"})
    assert proc.returncode != 0 and "cache:" in proc.stderr and "choose a folder of its own" in proc.stderr, proc.stderr[-3000:]
    assert (_digest(archive_dir), _digest(proj / "docs")) == before
    assert not (proj / bcache.MARKER).exists()
