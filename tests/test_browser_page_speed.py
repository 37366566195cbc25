"""What the run page's icicle and roofline do on open and under the pointer, now that they are drawn with less work:
the icicle is drawn once on open (not again when its box is first observed), its labels are cut to fit by canvas
measurement yet fit their boxes as drawn, and one listener per kind of event on the icicle and on the roofline's
points answers hover, focus, click and keys as a listener per box did."""

from __future__ import annotations

import warnings

import pytest

from cbsite.generator import build_site
from tests.helpers.browser import Server
from tests.helpers.site_archives import synthetic_run

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}

# Every icicle drawn into the page, counted from before the page's own scripts run.
COUNT_DRAWINGS = """window.__icicles = 0;
  new MutationObserver(ms => ms.forEach(m => m.addedNodes.forEach(n => {
    if (n.classList && n.classList.contains('cbsite-icicle-svg')) window.__icicles++; })))
    .observe(document, {childList: true, subtree: true});"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("page-speed")
    synthetic_run(base / "runs", "wide", "v1", n=400, seed=7, branching=8, trace_every=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_site(base / "runs", base / "site", quiet=True)
    server = Server(built)
    yield server, built
    server.close()


def _open_run(page, site) -> None:
    server, built = site
    run = next(built.glob("runs/wide/v1/*"))
    page.goto(f"{server.url}{run.relative_to(built).as_posix()}/")
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=30000)


def test_the_icicle_is_drawn_once_on_open_and_every_label_fits_its_box(site, page):
    page.add_init_script(COUNT_DRAWINGS)
    _open_run(page, site)
    page.wait_for_timeout(800)  # a ResizeObserver's first call, and anything else that would draw it again
    assert page.evaluate("window.__icicles") == 1
    labels = page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-icicle text[data-room]')).map(t => {
        const box = t.parentNode.querySelector('rect').getBoundingClientRect(), b = t.getBoundingClientRect();
        return { text: t.textContent, name: t.getAttribute('data-name'), length: t.getComputedTextLength(),
                 room: +t.getAttribute('data-room'), inside: b.left >= box.left - 0.5 && b.right <= box.right + 0.5,
                 font: parseFloat(getComputedStyle(t).fontSize) }; })""")
    assert len(labels) > 20
    assert [w for w in labels if w["length"] > w["room"] + 0.5 or not w["inside"]] == []
    assert all(w["font"] >= 10 for w in labels)
    cut = [w for w in labels if w["name"] not in w["text"]]  # a status marker ("\u2248 ") may lead a whole name
    assert cut and all("\u2026" in w["text"] and w["text"].startswith(w["name"][:3]) for w in cut), cut[:5]
    # A wider window draws it again, once, at the new width.
    page.set_viewport_size({"width": 1000, "height": 1000})
    page.wait_for_function("window.__icicles === 2", timeout=10000)
    page.wait_for_timeout(500)
    assert page.evaluate("window.__icicles") == 2
    assert page.evaluate("document.querySelector('#cbsite-icicle svg').getAttribute('width')") == str(
        page.evaluate("document.querySelector('#cbsite-icicle').clientWidth"))
    assert page.errors == []


def test_icicle_boxes_answer_the_pointer_and_the_keyboard(site, page):
    _open_run(page, site)
    tip = page.locator(".cbsite-tip")
    node = page.locator("#cbsite-icicle g.cbsite-node:not(.ancestor):not(.self):not(.zoom-root)").first
    k = int(node.get_attribute("data-index"))
    path = page.evaluate(f"window.cbsiteRun.data.path[{k}]")
    node.hover()
    assert tip.is_visible() and path.split(".")[-1] in tip.inner_text()
    page.mouse.move(5, 5)  # off the icicle: the tooltip goes
    assert tip.is_hidden()
    node.click()
    page.wait_for_function(f"window.cbsiteRun.icicle.zoom === {k}")
    # The zoomed node's ancestors are rows above it: a click on the top one zooms back out to the root.
    ancestor = page.locator("#cbsite-icicle g.cbsite-node.ancestor").first
    ancestor.hover()
    assert tip.is_visible()
    ancestor.click()
    page.wait_for_function("window.cbsiteRun.icicle.zoom === 0")
    # Keyboard: focus shows the numbers, Enter zooms, Escape backs out.
    child = page.locator("#cbsite-icicle g.cbsite-node:not(.ancestor):not(.self):not(.zoom-root)").first
    k = int(child.get_attribute("data-index"))
    child.focus()
    assert tip.is_visible()
    page.keyboard.press("Enter")
    page.wait_for_function(f"window.cbsiteRun.icicle.zoom === {k}")
    page.keyboard.press("Escape")
    page.wait_for_function("window.cbsiteRun.icicle.zoom === 0")
    # A self share (the part of a node no child covers) tells its share and zooms nowhere.
    own = page.locator("#cbsite-icicle g.cbsite-node.self").first
    if own.count():
        own.hover()
        assert "self share of" in tip.inner_text()
        own.click(force=True)
        assert page.evaluate("window.cbsiteRun.icicle.zoom") == 0
    assert page.errors == []


def test_roofline_points_answer_the_pointer_and_the_keyboard(site, page):
    _open_run(page, site)
    page.locator(".cbsite-roofline").scroll_into_view_if_needed()
    page.wait_for_selector(".cbsite-roofline svg .cbsite-roof-point", timeout=20000)
    tip = page.locator("body > .cbsite-tip").filter(has_text="intensity")
    # The point on top at its own centre (points overlap): hover shows its numbers, leaving hides them.
    box = page.evaluate("""() => { for (const a of document.querySelectorAll('.cbsite-roof-point')) {
        const b = a.getBoundingClientRect(), x = (b.left + b.right) / 2, y = (b.top + b.bottom) / 2;
        if (document.elementFromPoint(x, y).closest('a') === a) return [x, y, +a.dataset.index]; } return null; }""")
    assert box is not None
    page.mouse.move(box[0], box[1])
    path = page.evaluate(f"window.cbsiteRoofline.data.points.path[{box[2]}]")
    assert tip.count() == 1 and tip.is_visible() and (path or "wide") in tip.inner_text()
    page.mouse.move(5, 5)
    assert tip.count() == 0
    # The chart's one tab stop: focus outlines the point and shows its numbers, arrows move on, blur hides them.
    first = page.locator(".cbsite-roof-point[tabindex='0']")
    first.focus()
    assert page.evaluate("document.activeElement.firstChild.getAttribute('stroke')") == "currentColor"
    assert tip.count() == 1
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.firstChild.getAttribute('stroke')") == "currentColor"
    assert page.locator(".cbsite-roof-point > [stroke='currentColor']").count() == 1  # the left one lost its outline
    page.evaluate("document.activeElement.blur()")
    assert tip.count() == 0
    assert page.errors == []
