"""Latency verdicts on a diff page, in the real browser: what a person sees of a comparison's verdicts in the
component table, the icicle coloured by latency change and its tooltip, and the model page's link to it."""

from __future__ import annotations

import pytest

from tests.helpers.browser import Server, outside
from tests.helpers.latency_archive import COMPARISON_ID, IDS

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
PAIR = f"diffs/runs/{IDS['v1']}/{IDS['v3']}/"


@pytest.fixture(scope="module")
def site(latency_site):
    """The session's latency site (its cmp model is the one these pages show) over HTTP. Tests only read it."""
    _, built, _ = latency_site
    server = Server(built)
    yield server, built
    server.close()


def _cell(page, path: str, header: str):
    """The table cell of the row whose path reads exactly `path`, in the column headed `header`."""
    headers = [h.strip() for h in page.locator("#cbsite-difftable thead th").all_inner_texts()]
    label = "cmp (root)" if path == "" else path
    rows = page.locator("#cbsite-difftable tbody tr")
    texts = [t.strip() for t in page.locator("#cbsite-difftable tbody tr td.path").all_inner_texts()]
    return rows.nth(texts.index(label)).locator("td").nth(headers.index(header))


def test_table_shows_verdict_ratio_and_interval_and_colours_only_verdicts(site, page):
    server, _ = site
    page.goto(server.url + PAIR)
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    assert _cell(page, "enc.a", "verdict").inner_text() == "regressed"
    assert _cell(page, "enc.a", "ratio").inner_text() == "1.301×"
    assert _cell(page, "enc.a", "95 % interval").inner_text() == "1.287–1.315×"
    assert _cell(page, "c", "verdict").inner_text() == "improved"
    assert _cell(page, "enc.b", "verdict").inner_text() == "unchanged"
    # enc.b's median moved by +12 %, but the paired session found it unchanged: not drawn as a change.
    moved = _cell(page, "enc.b", "\u0394 latency")
    assert moved.inner_text().startswith("+") and moved.get_attribute("class") == "num"
    assert "up" in _cell(page, "enc.a", "\u0394 latency").get_attribute("class").split()
    assert "down" in _cell(page, "c", "\u0394 latency").get_attribute("class").split()
    # The verdict is readable: regressed in red, improved in blue, unchanged muted.
    colours = page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll(
        '#cbsite-difftable .cbsite-verdict')).map(s => [s.textContent, getComputedStyle(s).color]))""")
    assert colours["regressed"] == "rgb(178, 24, 43)" and colours["improved"] == "rgb(33, 102, 172)"
    # The page's latency section names the session, its noise and the smallest detectable change.
    page.click("details#latency > summary")  # a collapsed section (the page opens short)
    how = page.inner_text(".cbsite-latency-how")
    assert COMPARISON_ID in how and "6 worker processes" in how
    stats = page.inner_text(".cbsite-latency-stats")
    assert "noise (median spread)" in stats and "smallest detectable change" in stats
    assert page.errors == []
    assert outside(page.requests, {server.port}) == []


def test_icicle_by_latency_change_draws_only_verdicts_and_its_tooltip_is_whole(site, page, tmp_path):
    server, _ = site
    page.goto(server.url + PAIR)
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    page.select_option("#cbsite-colour", "delta_latency_ms")
    fills = page.evaluate("""() => {
        const h = window.cbsiteDiff.head, out = {};
        document.querySelectorAll('#cbsite-icicle g.cbsite-node:not(.self)').forEach(g => {
            const i = +g.dataset.index; if (i >= 0) out[h.path[i]] = g.querySelector('rect').getAttribute('fill'); });
        return out; }""")
    assert fills["enc.b"] == "rgb(247,247,247)"  # unchanged: the neutral middle of the diverging scale
    assert fills["enc"] == "#cccccc"  # an estimated container is not timed in a session: no value
    r, g, b = (int(x) for x in fills["enc.a"][4:-1].split(","))
    assert r > 150 and g < 80 and b < 80  # regressed: red
    legend = page.inner_text("#cbsite-legend")
    assert "verdict's ratio" in legend and "only where it is regressed or improved" in legend

    index = page.evaluate("window.cbsiteDiff.head.path.indexOf('enc.a')")
    node = page.locator(f"#cbsite-icicle g.cbsite-node[data-index='{index}']").first
    node.scroll_into_view_if_needed()
    node.hover()
    tip = page.locator(".cbsite-tip")
    text = tip.inner_text()
    assert "latency verdict: regressed" in text and "ratio (95 % interval): 1.301× (1.287–1.315×)" in text
    assert "bandwidth utilisation" in text  # the whole tooltip, not its first lines
    box = tip.bounding_box()
    vw, vh = page.viewport_size["width"], page.viewport_size["height"]
    assert box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= vw and box["y"] + box["height"] <= vh
    # No ancestor clips it: every ancestor that hides overflow contains it whole.
    clipped = page.evaluate("""() => {
        const tip = document.querySelector('.cbsite-tip'), t = tip.getBoundingClientRect(), out = [];
        for (let a = tip.parentElement; a && a !== document.documentElement; a = a.parentElement) {
            const s = getComputedStyle(a);
            if (s.overflow === 'visible' && s.overflowX === 'visible' && s.overflowY === 'visible') continue;
            const r = a.getBoundingClientRect();
            if (t.left < r.left || t.top < r.top || t.right > r.right || t.bottom > r.bottom) out.push(a.className || a.tagName);
        }
        return out; }""")
    assert clipped == []
    assert tip.evaluate("e => e.scrollHeight <= e.clientHeight + 1")  # nothing cut at its own bottom
    assert page.errors == []
    page.screenshot(path=str(tmp_path / "latency-diff.png"))  # not beside the shared site, which tests only read


def test_model_page_links_the_comparison(site, page):
    server, _ = site
    page.goto(server.url + "models/cmp/")
    link = page.locator("#comparisons ~ table.cbsite-comparisons a", has_text=COMPARISON_ID)
    link.click()
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    assert page.url.endswith(PAIR)
    page.goto(server.url + "diffs/cmp/v1/v2/")
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    assert "not judged" in page.inner_text("details#latency > summary")  # said while the section is collapsed
    page.click("details#latency > summary")
    assert "Latency not judged" in page.inner_text(".cbsite-not-judged")
    assert set(page.locator("#cbsite-difftable td .cbsite-verdict").all_inner_texts()) == {"not judged"}
    assert page.errors == []
