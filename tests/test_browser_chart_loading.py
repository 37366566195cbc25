"""Vega charts load as they are needed: a chart is drawn when its box nears the viewport (a chart in a closed
<details> when it is opened), the Vega bundle is loaded on the first chart's need, never by a script tag, and a
point of a model's trend chart opens that run's page, by mouse and by keyboard. Two bundles: vega.js, the Vega runtime
for the model and study pages' charts (compiled to Vega when the site is built), and vega-lite.js for the diff page's
Vega-Lite contributors."""

from __future__ import annotations

import re
import warnings

import pytest

from cbsite.generator import build_site
from tests.helpers.browser import Server, outside, recording_page
from tests.helpers.site_archives import synthetic_run

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}
SHORT_PHONE = {"width": 390, "height": 400}  # the model page's trend charts stack in one column, most below


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("chart-loading")
    for i, version in enumerate(("v1", "v2", "v3")):
        synthetic_run(base / "runs", "toy", version, n=40, seed=21 + i, minutes=5 * i, scale=1 + 0.2 * i)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_site(base / "runs", base / "site", quiet=True)
    server = Server(built)
    yield server, built
    server.close()


def _vega(page, bundle: str = "vega.js") -> list[str]:
    return [r for r in page.requests if r.endswith("/" + bundle)]


def _drawn(page) -> list[bool]:
    return page.evaluate("Array.from(document.querySelectorAll('[data-cbsite-chart]')).map(c => !!c.querySelector('svg'))")


def test_no_page_loads_vega_by_a_script_tag(site):
    """The bundle is run only by charts.js; the model page, whose charts are on its first screen, fetches it early
    (a preload, which blocks nothing); the diff page, whose charts are in a closed section, does not."""
    _, built = site
    pages = {p.relative_to(built).as_posix(): p.read_text() for p in built.rglob("index.html")}
    assert any('data-cbsite-chart="' in text for text in pages.values())
    assert [p for p, text in pages.items() if re.search(r"<script[^>]*vega(-lite)?\.js", text)] == []
    assert [p for p, text in pages.items() if "vega-lite.js" in text] == []
    assert [p for p, text in pages.items() if "vega.js" in text] == ["models/toy/index.html"]
    assert '<link rel="preload" href="../../assets/cbsite/vega.js" as="script">' in pages["models/toy/index.html"]


def test_charts_below_the_fold_are_drawn_when_scrolled_to(site, browser):
    server, _ = site
    with recording_page(browser, SHORT_PHONE) as page:
        page.goto(server.url + "models/toy/")
        page.wait_for_function("document.querySelector('[data-cbsite-chart] svg') !== null", timeout=20000)
        page.wait_for_timeout(500)
        drawn = _drawn(page)
        assert len(drawn) >= 4 and drawn[0] and not drawn[-1], drawn
        assert len(_vega(page)) == 1
        last = page.locator("[data-cbsite-chart]").last
        last.scroll_into_view_if_needed()
        page.wait_for_function("Array.from(document.querySelectorAll('[data-cbsite-chart]')).pop().querySelector('svg') !== null", timeout=20000)
        assert last.locator("svg").first.is_visible()
        assert len(_vega(page)) == 1  # loaded once, for the first chart
        assert page.errors == []


def test_diff_charts_in_a_closed_section_wait_for_it_and_bring_vega(site, page):
    server, built = site
    url = next(p for p in (built / "diffs").rglob("index.html")).parent.relative_to(built).as_posix()
    page.goto(f"{server.url}{url}/")
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(500)
    assert page.locator("#contributors [data-cbsite-chart]").count() >= 1
    assert not any(_drawn(page)) and _vega(page) == [] and _vega(page, "vega-lite.js") == []  # nothing for a closed section
    page.click("#contributors > summary")
    page.wait_for_function("document.querySelector('#contributors [data-cbsite-chart] svg') !== null", timeout=20000)
    assert page.locator("#contributors [data-cbsite-chart] svg").first.is_visible()
    # The contributors are Vega-Lite: their bundle, once, and not the runtime alone besides.
    assert len(_vega(page, "vega-lite.js")) == 1 and _vega(page) == []
    assert page.errors == [] and outside(page.requests, {server.port}) == []


# Each trend point's link: its box, whether it is on top at its centre, and its run (the tooltip's "run" row).
POINTS = """() => Array.from(document.querySelectorAll('[data-cbsite-chart] .cbsite-chart-link')).map(p => {
  const b = p.getBoundingClientRect(), e = document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
  return { x: (b.left + b.right) / 2, y: (b.top + b.bottom) / 2, top: e === p, label: p.getAttribute('aria-label') }; })"""


def test_a_trend_point_opens_its_run_by_mouse_and_keyboard(site, page):
    server, built = site
    page.goto(server.url + "models/toy/")
    page.wait_for_function("document.querySelector('[data-cbsite-chart][data-cbsite-links]') !== null", timeout=20000)
    points = [p for p in page.evaluate(POINTS) if p["top"]]
    assert points
    point = points[0]
    run_id = next(r.name for r in built.glob("runs/toy/*/*") if r.name in point["label"])
    page.mouse.click(point["x"], point["y"])
    page.wait_for_url(f"**/runs/toy/*/{run_id}/", timeout=10000)
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    # The keyboard: one tab stop per chart, arrows move along its points, Enter opens the focused point's run.
    page.goto(server.url + "models/toy/")
    page.wait_for_function("document.querySelector('[data-cbsite-chart][data-cbsite-links]') !== null", timeout=20000)
    chart = page.locator("[data-cbsite-chart][data-cbsite-links]").first
    assert chart.locator("[tabindex='0']").count() == 1
    chart.locator("[tabindex='0']").focus()
    page.keyboard.press("ArrowRight")
    label = page.evaluate("document.activeElement.getAttribute('aria-label')")
    assert page.evaluate("document.activeElement.getAttribute('role')") == "link"
    run_id = next(r.name for r in built.glob("runs/toy/*/*") if r.name in label)
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/runs/toy/*/{run_id}/", timeout=10000)
    assert page.errors == []


def test_study_charts_below_the_fold_wait_until_scrolled_to(committed_site, page):
    """The study page's charts are faceted (one panel per value of the other axis): their boxes used to hold no height
    until drawn, so every box counted as near the viewport and all 16 charts were drawn on open. Now each box holds its
    chart's height: the charts of the first screen are drawn on open, those far below it when scrolled to, and the page
    does not jump as they are drawn."""
    server, _ = committed_site
    page.goto(server.url + "studies/demo-dense-sparse/")
    page.wait_for_function("document.querySelector('[data-cbsite-study-chart] svg') !== null", timeout=20000)
    page.wait_for_timeout(1500)  # what else the page would draw on its own
    boxes = page.evaluate("""() => Array.from(document.querySelectorAll('[data-cbsite-study-chart]')).map(c => {
        const b = c.getBoundingClientRect(); return [b.top, b.height, !!c.querySelector('svg')]; })""")
    assert len(boxes) >= 10
    first_screen = [drawn for top, _, drawn in boxes if top < VIEWPORT["height"]]
    far_below = [drawn for top, _, drawn in boxes if top > 2.5 * VIEWPORT["height"]]
    assert first_screen and all(first_screen), boxes
    assert far_below and not any(far_below), boxes
    last = page.locator("[data-cbsite-study-chart]").last
    top_before = last.evaluate("c => c.getBoundingClientRect().top + window.scrollY")
    last.scroll_into_view_if_needed()
    page.wait_for_function("Array.from(document.querySelectorAll('[data-cbsite-study-chart]')).pop().querySelector('svg .mark-line') !== null",
                           timeout=20000)
    assert last.locator("svg").first.is_visible()
    # Each box held about its chart's height: the drawing moved the last chart by little, if at all.
    top_after = last.evaluate("c => c.getBoundingClientRect().top + window.scrollY")
    assert abs(top_after - top_before) < 0.1 * top_before, (top_before, top_after)
    assert page.errors == []
