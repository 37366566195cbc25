"""The build's worker processes run polars on one thread each: every worker has a core of its own, and polars'
thread pool in a worker would only contend with the other workers (cbsite/generator/jobs.py `Pool`)."""

from __future__ import annotations

import contextlib
import os

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
