"""Shared fixtures. Collector tests use a tiny time budget and given peaks, so they are quick and
deterministic in what they assert (never a wall-clock figure)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("CBSITE_QUIET", "1")
# Builds keep their default cache in the user's cache directory: the tests' go to a folder of their own.
os.environ["CBSITE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cbsite-tests-cache-")
atexit.register(shutil.rmtree, os.environ["CBSITE_CACHE_DIR"], True)


@pytest.fixture
def fast_config():
    from cbsite.collector import CollectConfig

    return CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10, progress=False)


# Browser tests (the harness lives in tests/helpers/browser.py): one chromium per module, and a page at the
# module's VIEWPORT (1400 x 1000 unless the module says otherwise), recording requests and console errors.
@pytest.fixture(scope="module")
def browser():
    from tests.helpers.browser import launched_browser

    with launched_browser() as b:
        yield b


@pytest.fixture
def page(browser, request):
    from tests.helpers.browser import recording_page

    with recording_page(browser, getattr(request.module, "VIEWPORT", {"width": 1400, "height": 1000})) as pg:
        yield pg


# The tests' own archive: the demo runs (every demo model with the full demo's plugins, the DLRM comparison, the
# demo study, the sharded runs) at the current schema; tests/data/README.md says how it was made. No test reads
# the repository's runs/, which `cbsite demo` writes.
DEMO_ARCHIVE = Path(__file__).resolve().parent / "data" / "runs"


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory) -> Path:
    """A session copy of tests/data/runs, so that no test can change the archive the others read."""
    import shutil

    from cbsite import archive, schema

    copy = tmp_path_factory.mktemp("demo-archive") / "runs"
    shutil.copytree(DEMO_ARCHIVE, copy, ignore=shutil.ignore_patterns(archive.STAGING_DIR))
    old = [r.path for r in archive.list_runs(copy) if archive.read_meta(r.path)["schema_version"] != schema.SCHEMA_VERSION]
    assert not old, f"tests/data/runs has runs of an older schema: run `cbsite upgrade --runs tests/data/runs` ({old})"
    return copy


@pytest.fixture(scope="session")
def demo_site(demo_runs, tmp_path_factory) -> Path:
    """The tests' demo archive built once (`cbsite build`, default options) for every test that only reads the
    site; a test that changes a site or builds with other options builds its own."""
    from cbsite.generator import build_site

    return build_site(demo_runs, tmp_path_factory.mktemp("committed") / "site", quiet=True)


@pytest.fixture(scope="session")
def committed_site(demo_site):
    """`demo_site` served over HTTP for the browser modules: (server, site folder). Tests only read it."""
    from tests.helpers.browser import Server

    server = Server(demo_site)
    yield server, demo_site
    server.close()


def pytest_collection_modifyitems(config, items):
    """GPU and browser tests are real code paths, skipped (not deselected) where torch sees no CUDA device or
    Debian's chromium is missing (`make browser` installs it)."""
    from tests.helpers.browser import CHROMIUM

    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skips = {"gpu": None if has_cuda else pytest.mark.skip(reason="needs a CUDA device"),
             "browser": None if CHROMIUM.exists() else pytest.mark.skip(reason="Debian's chromium is not installed (make browser)")}
    for item in items:
        for marker, skip in skips.items():
            if skip is not None and marker in item.keywords:
                item.add_marker(skip)
