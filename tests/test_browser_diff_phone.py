"""The diff page on a phone (390x844, Debian's chromium, the tests' own archive): the page never scrolls sideways;
the answer's rows stack as cards, the component first, its own change, ratio, verdict and bound all on the screen;
the delta table's answering columns (path, latency change, ratio, verdict, bound) come first and are on the screen
before the table scrolls in its box, the paths broken after a dot or an underscore, never spilling into the next
cell."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 390, "height": 844}
DIFFS = ["diffs/dlrm/v1/v2/", "diffs/dlrm-sharded/table-wise/row-wise/",
         "diffs/demo-dense-sparse/dense_features-64.sparse_features-4/dense_features-64.sparse_features-16/"]
ANSWERING = ["path", "\u0394 latency", "ratio", "verdict", "bound"]


@pytest.mark.parametrize("url", DIFFS)
def test_diff_page_answers_on_a_phone_without_sideways_scroll(committed_site, page, url):
    server, _ = committed_site
    page.goto(server.url + url)
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    page.wait_for_timeout(200)
    assert page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]
    cards = page.evaluate("""() => Array.from(document.querySelectorAll('.cbsite-answer-latency tbody tr')).map(tr => {
        const cells = Array.from(tr.children).slice(0, 5).map(td => { const r = td.getBoundingClientRect();
            return { text: td.innerText, left: r.left, right: r.right, top: r.top, shown: td.checkVisibility() }; });
        const box = tr.closest('.cbsite-answer-phase');
        return { cells: cells, boxScrolls: box.scrollWidth > box.clientWidth + 1 }; })""")
    assert cards, url
    for card in cards:
        assert not card["boxScrolls"], card
        head, *answer = card["cells"]
        for cell in card["cells"]:
            assert cell["shown"] and cell["text"].strip() and 0 <= cell["left"] and cell["right"] <= VIEWPORT["width"], card
        assert all(head["top"] < c["top"] for c in answer), card  # the component on its own line, above its numbers
    page.locator("#components").scroll_into_view_if_needed()
    table = page.evaluate("""(n) => { const box = document.querySelector('#cbsite-difftable .cbsite-table-wrap') ||
            document.querySelector('#cbsite-difftable'), edge = box.getBoundingClientRect().right;
        const heads = Array.from(document.querySelectorAll('#cbsite-difftable thead th')).map(h => h.textContent);
        const rows = Array.from(document.querySelectorAll('#cbsite-difftable tbody tr')).slice(0, 8).map(tr =>
            Array.from(tr.children).slice(0, n).map(td => { const r = td.getBoundingClientRect();
                return { left: r.left, right: r.right, spills: td.scrollWidth > td.clientWidth + 1 }; }));
        return { heads: heads, rows: rows, edge: Math.min(edge, window.innerWidth) }; }""", len(ANSWERING))
    assert table["heads"][:len(ANSWERING)] == ANSWERING, table["heads"]
    for cells in table["rows"]:
        assert cells[-1]["right"] <= table["edge"] + 0.5, (url, cells)  # the bound, on the screen
        assert not cells[0]["spills"], (url, cells)  # the path stays in its cell
        assert all(a["right"] <= b["left"] + 0.5 for a, b in zip(cells, cells[1:])), (url, cells)
    assert page.evaluate("document.documentElement.scrollWidth") <= VIEWPORT["width"]
    assert page.errors == []
