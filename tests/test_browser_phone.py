"""The site on a phone (390x844, touch) in Debian's chromium, as a person sees it: no page of any kind (the
component history with its longest path shown and the regressions index included) pans sideways, a table wider than the screen scrolls inside its own box, the home page's changes and the run page's
bound badges can be scrolled into view, and on the icicle a first tap shows a node's numbers, a second tap zooms."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.helpers.browser import PHONE

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make browser)"),
]


def _first(folder: Path) -> Path:
    return min(p for p in folder.iterdir() if p.is_dir())


def page_urls(built: Path) -> dict[str, str]:
    """One page of each kind in the built demo site, by its path under the site root."""

    def rel(p: Path) -> str:
        return p.relative_to(built).as_posix() + "/"

    # A model with a diff page (its newest run beside it), and a sharded one.
    with_diffs = sorted(d.name for d in (built / "diffs").iterdir() if d.is_dir())
    sharded = built / "runs" / next(m for m in with_diffs if "sharded" in m)
    dense = built / "runs" / next(m for m in with_diffs if "sharded" not in m and not m.startswith("demo-"))
    history = built / "models" / dense.name / "history"
    longest = max(json.loads((history / "index.json").read_text())["paths"], key=len)
    return {
        "home": "",
        "model": rel(built / "models" / dense.name),
        "run": rel(_first(max(p for p in dense.iterdir() if p.is_dir()))),
        "diff": rel(_first(_first(built / "diffs" / dense.name))),
        "study": rel(_first(built / "studies")),
        "sharded run": rel(_first(_first(sharded))),
        "sharded diff": rel(_first(_first(built / "diffs" / sharded.name))),
        "history": rel(history) + "#component=" + quote(longest, safe=""),
        "regressions": "regressions/",
    }


def _settle(page, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state("load")
    if page.locator("#cbsite-run").count():
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    if page.locator("#cbsite-history").count():  # its component's charts drawn
        page.wait_for_selector("#cbsite-history[data-shown]", timeout=20000)


# Everything drawn right of the screen that no box of its own clips: what makes the page pan.
OVERHANG = """() => { const W = document.documentElement.clientWidth, out = [];
  document.querySelectorAll('.md-main *').forEach(e => { const r = e.getBoundingClientRect();
    if (r.width === 0 || r.right <= W + 1) return;
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' && a.getBoundingClientRect().right <= W + 1) return; }
    out.push(e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' right ' + Math.round(r.right)); });
  return { scroll: document.documentElement.scrollWidth, body: document.body.scrollWidth, width: W, over: out.slice(0, 5) }; }"""


@pytest.mark.parametrize("kind", ["home", "model", "run", "diff", "study", "sharded run", "sharded diff", "history",
                                  "regressions"])
def test_no_page_scrolls_sideways_on_a_phone(committed_site, phone, kind):
    server, built = committed_site
    _settle(phone, server.url + page_urls(built)[kind])
    seen = phone.evaluate(OVERHANG)
    assert seen["over"] == [] and seen["scroll"] <= PHONE["width"] and seen["body"] <= PHONE["width"], seen
    # A table wider than the screen is its own scroll box (or sits in one), inside the screen.
    boxes = phone.evaluate("""() => Array.from(document.querySelectorAll('.cbsite-page table')).filter(t =>
        t.scrollWidth > document.documentElement.clientWidth).map(t => { let a = t;
        while (a && getComputedStyle(a).overflowX === 'visible') a = a.parentElement;
        return a ? [a.getBoundingClientRect().left, a.getBoundingClientRect().right] : null; })""")
    assert all(b is not None and b[0] >= -0.5 and b[1] <= PHONE["width"] + 0.5 for b in boxes), boxes
    assert phone.errors == []


def _reachable(page, selector: str) -> list[str]:
    """Each element matching `selector`, scrolled into view (its scroll boxes scroll), that is then not wholly
    inside the screen: what a person could not read however they swipe."""
    out = []
    for el in page.locator(selector).all()[:6]:
        el.scroll_into_view_if_needed()
        box = el.bounding_box()
        if not (box and box["x"] >= -0.5 and box["x"] + box["width"] <= PHONE["width"] + 0.5
                and box["y"] >= -0.5 and box["y"] + box["height"] <= PHONE["height"] + 0.5):
            out.append(f"{el.inner_text()!r} at {box}")
    return out


def test_home_changes_and_run_bound_badges_can_be_reached(committed_site, phone):
    server, built = committed_site
    _settle(phone, server.url)
    changes = "table.cbsite-changes tbody td:nth-child(3) li"
    assert phone.locator(changes).count() > 0
    assert _reachable(phone, changes) == []
    _settle(phone, server.url + page_urls(built)["run"])
    badges = ".cbsite-facts .cbsite-bound"
    assert phone.locator(badges).count() > 0
    assert _reachable(phone, badges) == []
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_first_tap_shows_the_numbers_second_tap_zooms(committed_site, phone):
    server, built = committed_site
    _settle(phone, server.url + page_urls(built)["run"])
    # The widest child of the root: a box large enough to tap.
    index = phone.evaluate("""() => { const L = window.cbsiteRun.icicle.layout, P = window.cbsiteRun.data.parent;
        let best = -1, w = -1; L.nodes.forEach(i => { if (P[i] === 0 && L.x1[i] - L.x0[i] > w) { w = L.x1[i] - L.x0[i]; best = i; } });
        return best; }""")
    node = phone.locator(f"#cbsite-icicle g.cbsite-node[data-index='{index}']").first
    node.scroll_into_view_if_needed()
    node.tap()
    tip = phone.locator(".cbsite-tip")
    assert tip.is_visible()
    assert "latency per forward" in tip.inner_text()
    box = tip.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] and box["y"] >= 0 and box["y"] + box["height"] <= PHONE["height"]
    assert phone.evaluate("window.cbsiteRun.icicle.zoom") == 0  # not zoomed yet
    phone.locator(f"#cbsite-icicle g.cbsite-node[data-index='{index}']").first.tap()
    assert phone.evaluate("window.cbsiteRun.icicle.zoom") == index
    assert tip.is_hidden()
    # A tap elsewhere on the page hides a tooltip a first tap showed.
    other = phone.evaluate("""(z) => { const P = window.cbsiteRun.data.parent, L = window.cbsiteRun.icicle.layout;
        return L.nodes.find(i => P[i] === z && L.x1[i] - L.x0[i] > 0.1); }""", index)
    if other is not None:
        phone.locator(f"#cbsite-icicle g.cbsite-node[data-index='{other}']").first.tap()
        assert tip.is_visible()
        phone.locator("h2#facts").tap()
        assert tip.is_hidden()
    assert phone.errors == []
