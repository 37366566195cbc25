"""The run page's roofline as a person sees it, drawn as SVG by roofline.js with no Vega on the page: log axes
with readable ticks, the roofs, one point per leaf and phase coloured by its bound, a tooltip on hover and on
keyboard focus, a click or Enter that opens the component; whole at 390 px and in the dark scheme."""

from __future__ import annotations

import json
import warnings

import pytest

from cbsite.generator import build_site
from tests.helpers.browser import Server, outside, roofline_legend_painted
from tests.helpers.site_archives import synthetic_run

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("roofline")
    synthetic_run(base / "runs", "toy", "v1", n=60, seed=11)
    synthetic_run(base / "runs", "toy", "v2", n=64, seed=12, minutes=5, scale=1.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_site(base / "runs", base / "site", quiet=True)
    server = Server(built)
    run = next((built / "runs" / "toy" / "v2").iterdir())
    yield server, server.url + run.relative_to(built).as_posix() + "/", json.loads((run / "roofline.json").read_text())["roofline"]
    server.close()


TABLE_TOP = "document.getElementById('cbsite-table').getBoundingClientRect().top + window.scrollY"


def _open(page, url):
    page.goto(url)
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    table_top = page.evaluate(TABLE_TOP)
    page.locator(".cbsite-roofline").scroll_into_view_if_needed()
    page.wait_for_selector(".cbsite-roofline svg .cbsite-roof-point", timeout=20000)
    roofline_legend_painted(page)  # read as a person sees it, once painted
    # Drawn in the room kept for it: the table below does not move under a reader's eyes or pointer.
    assert page.evaluate(TABLE_TOP) == table_top


# What a person sees of the roofline: the svg's box, the plot's, every point's box and fill, the tick labels of each
# axis (text, box, font size) and the legend's text.
DRAWN = """() => { const s = document.querySelector('.cbsite-roofline svg'), box = e => { const b = e.getBoundingClientRect();
    return { left: b.left, right: b.right, top: b.top, bottom: b.bottom }; };
  const ticks = (sel) => Array.from(s.querySelectorAll(sel + ' text')).map(t => ({ text: t.textContent, box: box(t),
    size: parseFloat(getComputedStyle(t).fontSize) }));
  return { svg: box(s), plot: box(s.querySelector('.cbsite-roof-plot')), x: ticks('.cbsite-roof-x'), y: ticks('.cbsite-roof-y'),
    points: Array.from(s.querySelectorAll('.cbsite-roof-point')).map(a => ({ box: box(a), fill: a.firstChild.getAttribute('fill'),
      href: a.getAttribute('href') })),
    roofs: s.querySelectorAll('.cbsite-roof').length, ridge: s.querySelectorAll('.cbsite-ridge').length,
    legend: document.querySelector('.cbsite-roofline-legend').innerText,
    pageWidth: document.documentElement.scrollWidth }; }"""


def _overlap(a, b) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


def _check_drawn(d, data, viewport):
    points = data["points"]
    assert len(d["points"]) == len(points["path"]) > 5
    # Every point inside the plot, coloured by its bound, linked to its component.
    plot = d["plot"]
    assert all(plot["left"] - 0.5 <= p["box"]["left"] and p["box"]["right"] <= plot["right"] + 0.5
               and plot["top"] - 0.5 <= p["box"]["top"] and p["box"]["bottom"] <= plot["bottom"] + 0.5 for p in d["points"])
    assert {p["href"] for p in d["points"]} == {"#component=" + path for path in points["path"]}
    assert d["roofs"] == 1 and d["ridge"] == 1
    # Readable ticks: at least three per axis, 10 px or larger, none overlapping another, all inside the viewport.
    for axis in ("x", "y"):
        ticks = d[axis]
        assert len(ticks) >= 3 and all(t["size"] >= 10 for t in ticks), ticks
        assert all(not _overlap(a["box"], b["box"]) for i, a in enumerate(ticks) for b in ticks[i + 1:]), ticks
        assert all(0 <= t["box"]["left"] and t["box"]["right"] <= viewport["width"] for t in ticks), ticks
    assert d["svg"]["right"] <= viewport["width"] and d["pageWidth"] <= viewport["width"]
    for words in ("compute", "memory", "overhead", "forward", "backward"):
        assert words in d["legend"]


def test_run_page_draws_the_roofline_without_vega(site, page):
    server, url, data = site
    _open(page, url)
    d = page.evaluate(DRAWN)
    _check_drawn(d, data, VIEWPORT)
    assert d["plot"]["right"] - d["plot"]["left"] > 800  # the page's width, not a thumbnail
    colours = {"compute": "#1f6fb4", "memory": "#d9730d", "overhead": "#7f7f7f"}
    expected = [colours[b] for b in data["points"]["bound"]]
    assert [p["fill"] for p in d["points"]] == expected
    # Nothing of Vega on the page: neither the bundle nor charts.js are requested.
    assert [r for r in page.requests if "vega" in r or "charts.js" in r] == []
    assert page.errors == [] and outside(page.requests, {server.port}) == []


def _topmost(page, other_than: str = "") -> int:
    """The index of a point drawn on top of the others at its centre (points may overlap), in the viewport."""
    page.locator(".cbsite-roofline-svg").scroll_into_view_if_needed()
    i = page.evaluate("""(other) => Array.from(document.querySelectorAll('.cbsite-roof-point')).findIndex(a => {
        const b = a.getBoundingClientRect(), e = document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
        return a.getAttribute('href') !== other && e !== null && e.closest('a') === a; })""", other_than)
    assert i >= 0
    return i


def test_hover_and_keyboard_show_the_numbers_and_open_the_component(site, page):
    server, url, data = site
    _open(page, url)
    i = _topmost(page)
    page.locator(".cbsite-roof-point").nth(i).hover()
    tip = page.locator(".cbsite-tip:not([hidden])")
    tip.wait_for(timeout=5000)
    text, path = tip.inner_text(), data["points"]["path"][i]
    for words in (path, data["points"]["phase"][i], "FLOP/byte", "FLOP/s", "bound by"):
        assert words in text, (words, text)
    box = tip.bounding_box()
    assert box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= VIEWPORT["width"] and box["y"] + box["height"] <= VIEWPORT["height"]
    # One tab stop: the chart's focused point; arrows move along the points, the tooltip follows the focus.
    assert page.locator(".cbsite-roof-point[tabindex='0']").count() == 1
    page.focus(".cbsite-roof-point[tabindex='0']")
    first = page.evaluate("document.activeElement.getAttribute('href')")
    page.keyboard.press("ArrowRight")
    focused = page.evaluate("document.activeElement.getAttribute('href')")
    assert focused != first and focused.startswith("#component=")
    assert page.locator(".cbsite-roof-point[tabindex='0']").count() == 1
    assert page.evaluate("document.activeElement.getAttribute('tabindex')") == "0"
    shown = page.locator(".cbsite-tip:not([hidden])").inner_text()
    assert shown.split("\n")[0].endswith(page.evaluate("decodeURIComponent(document.activeElement.getAttribute('href').slice(11))"))
    page.keyboard.press("Enter")
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    # The address names the component (the run page may add its zoom); the details panel shows it.
    assert page.evaluate("location.hash.split('&')[0]") == focused
    assert page.inner_text("#cbsite-details h3") == page.evaluate("decodeURIComponent(location.hash.split('&')[0].slice(11))")
    # A click opens the component as well.
    other = page.locator(".cbsite-roof-point").nth(_topmost(page, focused))
    href = other.get_attribute("href")
    other.click()
    page.wait_for_function(f"location.hash.split('&')[0] === {json.dumps(href)}", timeout=5000)
    page.wait_for_function(f"document.querySelector('#cbsite-details h3').textContent === decodeURIComponent({json.dumps(href[11:])})", timeout=5000)
    assert page.errors == []


def test_roofline_is_whole_at_390_px_and_follows_the_dark_scheme(site, browser):
    from tests.helpers.browser import recording_page

    _, url, data = site
    with recording_page(browser, PHONE) as page:
        _open(page, url)
        _check_drawn(page.evaluate(DRAWN), data, PHONE)
        page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
        # Drawn again: the compute points in the lighter blue, the axes' text light on the dark page.
        page.wait_for_function("document.querySelector('.cbsite-roofline svg [fill=\"#4a9bd9\"]') !== null", timeout=5000)
        d = page.evaluate(DRAWN)
        _check_drawn(d, data, PHONE)
        assert "#1f6fb4" not in {p["fill"] for p in d["points"]}
        light = page.evaluate("""() => { const t = document.querySelector('.cbsite-roof-x text');
            const v = getComputedStyle(t).fill.match(/\\d+/g).slice(0, 3).map(Number);
            return (0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]) / 255; }""")
        assert light > 0.6
        assert page.errors == []
