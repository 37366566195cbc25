"""What a page does on open, so that it is interactive soon (issue 31, benchmarks/page_weight.py): a run, diff or model
page starts loading its data with its scripts, not after them, and loads each file once; the diff page draws its icicle
once; the run page puts its table's first rows in the page together, so that the browser lays the table out once."""

from __future__ import annotations


import pytest

from tests.helpers.browser import served
from tests.helpers.site_archives import quiet_build, synthetic_run

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Two versions of a 300-component model: run pages, a diff page and a model page with trend charts."""
    runs = tmp_path_factory.mktemp("page-weight") / "runs"
    for i, version in enumerate(("v1", "v2")):
        synthetic_run(runs, "wide", version, n=300, seed=31 + i, minutes=i, scale=1 + 0.3 * i, branching=8)
    built = quiet_build(runs)
    with served(built) as server:
        yield server, built


def _pages(built) -> dict[str, str]:
    run = sorted(built.glob("runs/wide/v2/*"))[-1]
    diff = next(built.glob("diffs/wide/**/index.html")).parent
    return {"run": run.relative_to(built).as_posix() + "/", "diff": diff.relative_to(built).as_posix() + "/",
            "model": "models/wide/"}


# Per page: its data files, and the selector that says its first screen is drawn (the benchmark's READY).
DATA = {"run": (["components.json"], "#cbsite-run[data-ready='1']"),
        "diff": (["diff.json", "diff.forward.json"], "#cbsite-diff[data-ready='1']"),
        "model": (["trends.json"], "[data-cbsite-chart] svg")}


@pytest.mark.parametrize("kind", list(DATA))
def test_page_data_loads_with_the_scripts_and_once(site, page, kind):
    server, built = site
    url = server.url + _pages(built)[kind]
    files, ready = DATA[kind]
    page.goto(url)
    page.wait_for_selector(ready, timeout=30000)
    page.wait_for_timeout(300)
    for name in files:
        assert [r for r in page.requests if r == url + name] == [url + name], (name, page.requests)  # once
    timing = page.evaluate("""(names) => { const nav = performance.getEntriesByType('navigation')[0];
        return { dcl: nav.domContentLoadedEventStart,
                 data: names.map(n => performance.getEntriesByName(new URL(n, location.href).href).map(e => e.startTime)) }; }""",
                           files)
    for name, starts in zip(files, timing["data"]):
        assert len(starts) == 1 and starts[0] < timing["dcl"], (name, starts, timing["dcl"])  # before the scripts ran
    assert not [r for r in page.requests if r.endswith("diff.backward.json")]  # another phase: only when asked for
    assert page.errors == []


# From before the page's scripts run: each <svg> put into the icicle's box, and each insertion of rows into the run
# table's body (how many rows it held), until the page is ready.
INSERTIONS = """window.__icicles = 0; window.__rows = [];
  new MutationObserver(records => records.forEach(r => r.addedNodes.forEach(n => {
    if (n.nodeName.toLowerCase() === 'svg' && r.target.id === 'cbsite-icicle') window.__icicles++; }))).observe(document, {childList: true, subtree: true});
  new MutationObserver(records => records.forEach(r => {
    const rows = Array.from(r.addedNodes).filter(n => n.nodeName === 'TR').length;
    if (rows && r.target.nodeName === 'TBODY' && r.target.closest('#cbsite-table')) window.__rows.push(rows); }))
    .observe(document, {childList: true, subtree: true});"""


def test_diff_page_draws_its_icicle_once(site, page):
    server, built = site
    page.add_init_script(INSERTIONS)
    page.goto(server.url + _pages(built)["diff"])
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=30000)
    page.wait_for_timeout(300)
    assert page.evaluate("window.__icicles") == 1
    assert page.locator("#cbsite-icicle svg").count() == 1
    assert page.locator("#cbsite-icicle g.cbsite-node").count() > 20
    assert page.errors == []


def test_run_table_first_rows_enter_the_page_together(site, page):
    server, built = site
    page.add_init_script(INSERTIONS)
    page.goto(server.url + _pages(built)["run"])
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=30000)
    assert page.evaluate("window.__icicles") == 1
    assert page.evaluate("window.__rows") == [100]  # the first page of rows, in one insertion
    # Drawn again (sorted), the table's rows are all there, in one insertion too.
    page.locator("#cbsite-table th[data-key='param_bytes']").click()
    page.wait_for_function("window.__rows.length === 2")
    assert page.evaluate("window.__rows") == [100, 100]
    sizes = page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-table tbody tr'))
        .map(tr => window.cbsiteRun.data.param_bytes[+tr.dataset.index])""")
    assert len(sizes) == 100 and sizes == sorted(sizes, reverse=True)  # largest first
    assert page.errors == []
