"""Search for any part of a component path, in Debian's chromium on the demo site: a query that starts inside a
segment (after a `_` as well as after a `.`) finds the run pages that have such a component, each result under a
page shows one matching path and nothing else, and following it opens that component."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make browser)"),
]
VIEWPORT = {"width": 1400, "height": 1000}

# Each component result shown (not folded under "N more on this page") as a person reads it: its address and
# every line of text drawn in it.
RESULTS = """() => Array.from(document.querySelectorAll('.md-search-result__item a.md-search-result__link'))
    .filter(a => a.getAttribute('href').includes('#find=') && !a.closest('details:not([open])'))
    .map(a => [a.getAttribute('href'), a.innerText.split('\\n').map(s => s.trim()).filter(Boolean)])"""


def _search(page, query: str) -> None:
    page.click(".md-search__input")
    page.keyboard.type(query)  # Material searches on key events
    page.wait_for_selector(".md-search-result__item", timeout=15000)
    page.wait_for_timeout(500)  # the worker answers the whole query after the first keys' results


def _holds(path: str, query: str) -> bool:
    """The query is a part of the path that starts at a segment boundary (`.` or `_`) or at its start."""
    return any((path[:i] == "" or path[i - 1] in "._") and path.startswith(query, i) for i in range(len(path)))


@pytest.mark.parametrize("query", ["mlp.1._linear", "bag_collection", "cat_3"])
def test_search_finds_the_middle_of_a_path_and_shows_that_path_alone(committed_site, page, query):
    server, built = committed_site
    page.goto(server.url)
    _search(page, query)
    results = page.evaluate(RESULTS)
    assert results, query
    for href, lines in results:
        assert len(lines) == 1, lines  # the path, not a blob of paths or the words that matched
        assert _holds(lines[0], query), (query, lines)
        run = href.split("?")[0].split("/runs/", 1)[1]
        paths = json.loads((built / "runs" / run / "components.json").read_text())["path"]
        assert lines[0] in paths
    target = results[0][1][0]
    page.locator(f".md-search-result__link[href='{results[0][0]}']").click()
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    assert page.inner_text("#cbsite-details h3") == target
    row = page.locator("#cbsite-table tr.cbsite-linked")
    assert row.count() == 1 and row.is_visible()
    box = row.bounding_box()
    assert box and 0 <= box["y"] and box["y"] + box["height"] <= VIEWPORT["height"]
    assert page.errors == []


def test_a_components_search_address_opens_it(committed_site, page):
    """A component's search entry is addressed `#find=PATH` (copied, or opened without the site's script): the
    run page opens that component as `#component=PATH` does."""
    server, built = committed_site
    run = max((built / "runs" / "dlrm").glob("*/*"))
    path = next(p for p in json.loads((run / "components.json").read_text())["path"] if p.endswith("cat_3"))
    page.goto(f"{server.url}{run.relative_to(built).as_posix()}/#find={path}")
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    assert page.inner_text("#cbsite-details h3") == path
    assert page.locator("#cbsite-table tr.cbsite-linked").count() == 1
    assert page.errors == []
