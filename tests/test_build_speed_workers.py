"""The build's worker processes run polars on one thread each: every worker has a core of its own, and polars'
thread pool in a worker would only contend with the other workers (cbsite/generator/jobs.py `Pool`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import polars as pl
import pytest

from cbsite.generator import jobs


def test_build_workers_run_polars_on_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "2")
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    with contextlib.ExitStack() as stack:
        pool = jobs.Pool(stack).get()
        assert pool is not None
        sizes = {pool.submit(pl.thread_pool_size).result() for _ in range(8)}
    assert sizes == {1}
    assert "POLARS_MAX_THREADS" not in os.environ  # the build's own process is left as it was


def test_a_users_polars_thread_setting_is_kept_in_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "2")
    monkeypatch.setenv("POLARS_MAX_THREADS", "2")
    with contextlib.ExitStack() as stack:
        pool = jobs.Pool(stack).get()
        assert pool is not None
        assert pool.submit(pl.thread_pool_size).result() == 2
    assert os.environ["POLARS_MAX_THREADS"] == "2"


@pytest.mark.slow
def test_search_parsed_in_the_workers_gives_the_same_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With worker processes, Material's search parse of each page runs in them (searchparse.py): the search index
    and every page are the same byte for byte as a build in one process writes, with and without the build cache."""
    from cbsite.generator import searchparse
    from cbsite.generator.build import build
    from tests.helpers.site_archives import synthetic_run

    runs = tmp_path / "runs"
    for i in range(6):  # 6 run pages and 5 diffs: enough jobs for the pool to start (jobs.PARALLEL_MIN_JOBS)
        synthetic_run(runs, "m", f"v{i + 1}", n=60, seed=i + 1, minutes=i, trace_every=10)
    sent = []
    real_send = searchparse.Offload.send
    monkeypatch.setattr(searchparse.Offload, "send", lambda self, *a: sent.append(real_send(self, *a)) or sent[-1])
    sites, pages = {}, []
    for jobs_env, cache in (("1", None), ("2", None), ("2", tmp_path / "cache")):
        monkeypatch.setenv("CBSITE_BUILD_JOBS", jobs_env)
        out = tmp_path / f"site-{jobs_env}-{'cache' if cache else 'full'}"
        pages.append(build(runs, out, quiet=True, cache=cache).pages)
        sites[out.name] = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*"))
                           if p.suffix == ".html" or p.name == "search_index.json"}
    assert len(set(pages)) == 1 and pages[0] > 11  # the home, model, history and regressions pages, 6 runs, 5 diffs
    # Every page of both builds with workers went to them (none of the first) but the history page, which its own
    # front matter keeps out of search.
    assert len(sent) == 2 * pages[0] and sent.count(False) == 2
    one, *others = sites.values()
    assert len(one) > pages[0] and b"m/v6" in one[Path("search/search_index.json")]
    for other in others:
        assert other.keys() == one.keys()
        assert [k for k in one if one[k] != other[k]] == []
