"""Incremental builds (cbsite/generator/cache.py): a build cache keyed by run content. Only new or changed runs
and the diffs they take part in are computed again, and the site is byte for byte the one a build without
the cache writes."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest

from cbsite.errors import CbsiteError
from cbsite.generator import SiteWarning, build_site
from cbsite.generator import cache as bcache
from cbsite.generator import jobs as gjobs
from cbsite.generator.cache import default_cache_dir
from tests.helpers.site_archives import synthetic_run


def _digest(site: Path) -> dict[str, str]:
    return {p.relative_to(site).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(site.rglob("*")) if p.is_file()}


@pytest.fixture
def counted(monkeypatch):
    """Counts of what the build computes: run page data (per run id) and diffs (per base..head), in-process."""
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    seen: dict[str, list[str]] = {"runs": [], "diffs": []}
    run_files, diff_job = gjobs.run_files, gjobs.diff_job

    def count_run(run, folder, found):
        seen["runs"].append(f"{run.model}@{run.version}")
        return run_files(run, folder, found)

    def count_diff(job):
        seen["diffs"].append(f"{job[0].parent.name}..{job[1].parent.name}")
        return diff_job(job)

    monkeypatch.setattr(gjobs, "run_files", count_run)
    monkeypatch.setattr(gjobs, "diff_job", count_diff)
    return seen


def _build(runs: Path, out: Path, cache: Path | None) -> dict[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(runs, out, quiet=True, cache=cache)
    return _digest(out)


def test_adding_a_run_computes_only_that_run_and_its_diff(tmp_path, counted):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1, trace_every=7)
    synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    synthetic_run(runs, "other", "v1", seed=3, minutes=3)

    cold = _build(runs, tmp_path / "site", cache)
    assert sorted(counted["runs"]) == ["other@v1", "toy@v1", "toy@v2"] and len(counted["diffs"]) == 1
    counted["runs"].clear(), counted["diffs"].clear()

    warm = _build(runs, tmp_path / "site", cache)  # nothing changed: nothing computed, the same site
    assert counted == {"runs": [], "diffs": []}
    assert warm == cold

    synthetic_run(runs, "toy", "v3", seed=4, minutes=4, scale=1.5)  # one new run: its data and its one new diff
    traces = sorted((tmp_path / "site" / "runs" / "toy" / "v1").rglob("artifacts/**/*.gz"))
    assert traces
    inodes = [p.stat().st_ino for p in traces]
    other_page = next((tmp_path / "site" / "runs" / "other").rglob("index.html"))
    page_inode = other_page.stat().st_ino
    grown = _build(runs, tmp_path / "site", cache)
    # An unchanged run's published artifacts are hard links to the previous site's, not new copies.
    assert [p.stat().st_ino for p in traces] == inodes
    # So is an unchanged page: MkDocs did not convert it again (reuse.py).
    assert other_page.stat().st_ino == page_inode
    assert counted["runs"] == ["toy@v3"]
    assert counted["diffs"] == ["v2..v3"]
    assert grown == _build(runs, tmp_path / "fresh", None)  # byte for byte the site of a build without cache
    assert {k for k in grown if k.startswith("runs/toy/v3/")} and "diffs/toy/v2/v3/index.html" in grown


def test_a_changed_run_is_computed_again_with_its_diffs(tmp_path, counted):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1)
    v2 = synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    synthetic_run(runs, "toy", "v3", seed=3, minutes=3, scale=1.3)
    _build(runs, tmp_path / "site", cache)
    counted["runs"].clear(), counted["diffs"].clear()

    meta = json.loads((v2 / "run.json").read_text())
    meta["notes"] = "edited after the fact"
    (v2 / "run.json").write_text(json.dumps(meta))
    site = _build(runs, tmp_path / "site", cache)
    assert counted["runs"] == ["toy@v2"]
    assert sorted(counted["diffs"]) == ["v1..v2", "v2..v3"]
    assert site == _build(runs, tmp_path / "fresh", None)
    assert "edited after the fact" in (tmp_path / "site" / "runs" / "toy" / "v2" / v2.name / "index.html").read_text()

    # Entries of runs that changed (or were removed) do not pile up: only the current ones are kept.
    assert len(list((cache / "runs").iterdir())) == 3
    assert len(list((cache / "diffs").iterdir())) == 2


def test_the_cache_of_the_demo_runs_gives_the_same_site(demo_runs, tmp_path, counted):
    runs = demo_runs
    cold = _build(runs, tmp_path / "a", tmp_path / "cache")
    n_runs, n_diffs = len(counted["runs"]), len(counted["diffs"])
    assert n_runs >= 4 and n_diffs >= 1
    warm = _build(runs, tmp_path / "b", tmp_path / "cache")
    assert (len(counted["runs"]), len(counted["diffs"])) == (n_runs, n_diffs)  # the second build computed nothing
    assert warm == cold


def test_a_cache_inside_the_site_or_archive_is_refused(tmp_path):
    runs = tmp_path / "runs"
    synthetic_run(runs, "toy", "v1", seed=1)
    for cache in (tmp_path / "site" / "cache", runs / "cache"):
        with pytest.raises(CbsiteError, match="--cache"):
            build_site(runs, tmp_path / "site", quiet=True, cache=cache)


def test_a_changed_configuration_builds_every_page_again(tmp_path, counted):
    """Every page depends on the MkDocs configuration: with another one, no page of the previous site is reused."""
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1)
    synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    _build(runs, tmp_path / "site", cache)
    page = next((tmp_path / "site" / "runs").rglob("index.html"))
    inode = page.stat().st_ino
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(runs, tmp_path / "site", quiet=True, cache=cache, perfetto_origin="https://perfetto.example")
        assert sorted(counted["runs"]) == ["toy@v1", "toy@v2"]  # by the first build: the page data stayed cached
        build_site(runs, tmp_path / "fresh", quiet=True, perfetto_origin="https://perfetto.example")
    assert page.stat().st_ino != inode and "perfetto.example" in page.read_text()
    assert _digest(tmp_path / "site") == _digest(tmp_path / "fresh")


@pytest.mark.parametrize("lost", ["search/search_index.json", "runs/toy/v1"])
def test_what_the_previous_site_lost_is_built_again(tmp_path, lost):
    """Reused pages take their search entries from the previous site's index (without it nothing is reused)
    and their HTML from its files (a page missing there is rendered and converted)."""
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1)
    _build(runs, tmp_path / "site", cache)
    for page in (tmp_path / "site").glob(lost if lost.endswith(".json") else lost + "/*/index.html"):
        page.unlink()
    synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    assert _build(runs, tmp_path / "site", cache) == _build(runs, tmp_path / "fresh", None)


# -- the default cache: what a build that names none uses -----------------------------------------------------


def test_the_default_cache_lies_in_the_users_cache_directory_one_per_site(tmp_path, monkeypatch):
    monkeypatch.delenv("CBSITE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    site = default_cache_dir(tmp_path / "site")
    assert site.parent.parent == tmp_path / "xdg" / "cbsite" and site.name.startswith("site-")
    assert default_cache_dir(tmp_path / "other" / "site") != site  # two sites never share (and prune) one
    monkeypatch.chdir(tmp_path)
    assert default_cache_dir(Path("site")) == site  # named by the absolute output path
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG rule says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir(Path("site")).is_relative_to(tmp_path / "home" / ".cache" / "cbsite")
    monkeypatch.setenv("CBSITE_CACHE_DIR", str(tmp_path / "own"))
    assert default_cache_dir(Path("site")).is_relative_to(tmp_path / "own")


def test_a_second_build_with_the_default_cache_computes_nothing(tmp_path, counted):
    runs, out = tmp_path / "runs", tmp_path / "site"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1, trace_every=7)
    synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    cold = _build(runs, out, default_cache_dir(out))
    assert sorted(counted["runs"]) == ["toy@v1", "toy@v2"] and len(counted["diffs"]) == 1
    assert (default_cache_dir(out) / bcache.MARKER).is_file()
    counted["runs"].clear(), counted["diffs"].clear()
    assert _build(runs, out, default_cache_dir(out)) == cold
    assert counted == {"runs": [], "diffs": []}
    assert cold == _build(runs, tmp_path / "fresh", None)


def test_a_stale_foreign_or_broken_cache_still_writes_the_right_site(tmp_path, monkeypatch):
    """A cache of an older cbsite, one copied from another site's place (a restored CI cache), entries cut
    short, and an archive changed since (a run edited, one removed, one added): the site is the one a build
    without a cache writes."""
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    runs, out, other = tmp_path / "runs", tmp_path / "site", tmp_path / "other"
    v1 = synthetic_run(runs, "toy", "v1", seed=1, minutes=1, trace_every=7)
    v2 = synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    synthetic_run(runs, "toy", "v3", seed=3, minutes=3, scale=1.3)
    with monkeypatch.context() as older:  # every key and the site record written by another cbsite
        older.setattr(bcache, "fingerprint", lambda: "0" * 64)
        _build(runs, out, default_cache_dir(out))
    _build(runs, out, default_cache_dir(out))
    shutil.copytree(default_cache_dir(out), default_cache_dir(other))
    for entry in sorted(default_cache_dir(out).rglob("value.pickle"))[::2]:
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
    meta = json.loads((v2 / "run.json").read_text())
    meta["notes"] = "edited after the fact"
    (v2 / "run.json").write_text(json.dumps(meta))
    shutil.rmtree(v1)
    synthetic_run(runs, "toy", "v4", seed=4, minutes=4, scale=1.5)
    fresh = _build(runs, tmp_path / "fresh", None)
    assert _build(runs, out, default_cache_dir(out)) == fresh
    assert _build(runs, other, default_cache_dir(other)) == fresh


def test_a_default_cache_folder_that_is_not_cbsites_is_left_untouched(tmp_path, monkeypatch):
    """Where the default folder is someone else's, or would lie in the archive, the build says so and goes
    without a cache; a folder named with --cache is still refused."""
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    runs, out = tmp_path / "runs", tmp_path / "site"
    synthetic_run(runs, "toy", "v1", seed=1, minutes=1)
    synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.2)
    place = default_cache_dir(out)
    place.mkdir(parents=True)
    (place / "notes.txt").write_text("mine\n")
    with pytest.warns(SiteWarning, match="default build cache .* was not used .*not a cbsite build cache"):
        build_site(runs, out, quiet=True, cache=place)
    assert [p.name for p in place.iterdir()] == ["notes.txt"] and (place / "notes.txt").read_text() == "mine\n"
    assert _digest(out) == _build(runs, tmp_path / "fresh", None)
    with pytest.raises(CbsiteError, match="not a cbsite build cache"):
        build_site(runs, tmp_path / "elsewhere", quiet=True, cache=place)

    archive_before = _digest(runs)
    monkeypatch.setenv("CBSITE_CACHE_DIR", str(runs / ".cache"))  # the default would lie inside the archive
    with pytest.warns(SiteWarning, match="default build cache .* lies inside the archive"):
        build_site(runs, out, quiet=True, cache=default_cache_dir(out))
    assert _digest(runs) == archive_before and not (runs / ".cache").exists()
