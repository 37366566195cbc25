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
# Builds compute in-process: a build's pool of spawned workers costs more CPU than the tests' small archives save,
# and the suite already keeps every core busy. `demo_site` is built with the pool, so its path stays tested.
os.environ.setdefault("CBSITE_BUILD_JOBS", "1")
# Timing never pauses for a quiet machine: beside the suite's other workers it never is, and each collection would
# spend up to 15 s asleep. Rows still say `contended`; tests/test_contention.py and the busy-neighbours test wait.
os.environ.setdefault("CBSITE_QUIET_WAIT_S", "0")


@pytest.fixture
def fast_config():
    from cbsite.collector import CollectConfig

    return CollectConfig(min_run_time=0.005, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10, progress=False)


# Browser tests (the harness lives in tests/helpers/browser.py): one chromium per test session (per xdist worker),
# each test in contexts of its own; a page at the module's VIEWPORT (1400 x 1000 unless the module says otherwise),
# recording requests and console errors.
@pytest.fixture(scope="session")
def chromium():
    """The session's chromium. Tests take `browser`, `page` or `phone`, which close the contexts they open."""
    from tests.helpers.browser import launched_browser

    with launched_browser() as b:
        yield b


@pytest.fixture
def browser(chromium):
    """The session's chromium; any context the test leaves open (a failed assertion before its close) is closed
    after it, so that no state reaches the next test."""
    from tests.helpers.browser import closing_new_contexts

    with closing_new_contexts(chromium):
        yield chromium


@pytest.fixture
def page(browser, request):
    from tests.helpers.browser import recording_page

    with recording_page(browser, getattr(request.module, "VIEWPORT", {"width": 1400, "height": 1000})) as pg:
        yield pg


@pytest.fixture(scope="module")
def phone(chromium):
    """A phone: 390 px wide, touch input, recording page errors; one per module, shared by its tests."""
    from tests.helpers.browser import PHONE

    context = chromium.new_context(viewport=PHONE, has_touch=True, is_mobile=True)
    pg = context.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    context.close()


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
    """The tests' demo archive built once per session, by the first xdist worker that needs it, for every test that
    only reads the site: `cbsite build` with default options and its pool of two workers, in a process that cannot
    import torch (tests/helpers/no_torch_build.py), as on a docs machine. A test that changes a site or builds with
    other options builds its own."""
    from tests.helpers.no_torch_build import build_without_torch
    from tests.helpers.shared_builds import made_once

    def make(folder: Path) -> None:
        shutil.copytree(demo_runs, folder / "runs")
        build_without_torch(folder / "runs", folder / "site", jobs=2)

    return made_once(tmp_path_factory, "demo-site", make) / "site"


@pytest.fixture(scope="session")
def latency_site(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The latency archive (tests/helpers/latency_archive.py, with its rounds) built once per session, for the tests
    that only read it: (runs, site, the generated MkDocs project's docs folder)."""
    from tests.helpers.shared_builds import made_once

    def make(folder: Path) -> None:
        from cbsite.generator import build_site
        from tests.helpers.latency_archive import write_latency_archive

        build_site(write_latency_archive(folder / "runs"), folder / "site", project_dir=folder / "project", quiet=True)

    folder = made_once(tmp_path_factory, "latency-site", make)
    return folder / "runs", folder / "site", folder / "project" / "docs"


@pytest.fixture(scope="session")
def committed_site(demo_site):
    """`demo_site` served over HTTP for the browser modules: (server, site folder). Tests only read it."""
    from tests.helpers.browser import Server

    server = Server(demo_site)
    yield server, demo_site
    server.close()


# The files that hold `serial` tests: `make test` collects only these for its serial part (collecting all of tests/
# takes about 10 s). A serial test anywhere else fails the collection, so it cannot be left out unseen.
SERIAL_FILES = ("tests/test_latency_story.py", "tests/test_plugins.py", "tests/test_session.py", "tests/test_twins.py")


@pytest.hookimpl(tryfirst=True, specname="pytest_collection_modifyitems")  # before `-m` deselects them
def pytest_serial_tests_in_serial_files(config, items):
    astray = sorted({item.nodeid.split("::")[0] for item in items if item.get_closest_marker("serial")} - set(SERIAL_FILES))
    if astray:
        raise pytest.UsageError(f"serial tests in {', '.join(astray)}: add the file to SERIAL_FILES in tests/conftest.py")


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: the order is that of the tests that run
def pytest_collection_modifyitems(config, items):
    """GPU and browser tests are real code paths, skipped (not deselected) where torch sees no CUDA device or
    Debian's chromium is missing (`make browser` installs it). Modules run longest first (`_by_expected_length`)."""
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
    _by_expected_length(items)


def _by_expected_length(items: list[pytest.Item]) -> None:
    """Modules holding a slow test first, then those driving the browser, then the rest, each group in file order
    and each module's tests in theirs. `make test` hands whole modules to the xdist workers in this order (--dist
    loadscope --no-loadscope-reorder): a long module taken last would leave the other core idle at the end.

    Before them all, the smallest module that reads `demo_site`: the first worker builds that session site while
    the other starts on the slow modules, instead of both reaching the browser modules and one waiting for it."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    rank: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for item in items:
        own = 0 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("browser") else 2
        rank[module(item)] = min(rank.get(module(item), 2), own)
        if "demo_site" in getattr(item, "fixturenames", ()):
            sizes[module(item)] = sizes.get(module(item), 0) + 1
    if sizes:
        rank[min(sizes, key=lambda m: (sizes[m], m))] = -1
    items.sort(key=lambda item: rank[module(item)])
