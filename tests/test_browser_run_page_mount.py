"""How the run page comes up, as a person sees it: the icicle (the first screen's answer) is painted before the
component table below it is built; the roofline, below the first screen, is drawn only when it nears the viewport
(opening the page costs none of its points), then whole, with every point; and the page's address (address.js, shared with the diff page) keeps
a plain anchor that was followed, then holds the view chosen."""

from __future__ import annotations

import json

import pytest

from tests.helpers.browser import roofline_legend_painted, served
from tests.helpers.site_archives import quiet_build, synthetic_run

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}

# From before the page's scripts run: the animation frame in which the icicle and the table's first row appeared.
FRAMES = """window.__frame = 0; window.__seen = {};
  const tick = () => { window.__frame++; requestAnimationFrame(tick); }; requestAnimationFrame(tick);
  new MutationObserver(() => {
    if (!('icicle' in window.__seen) && document.querySelector('#cbsite-icicle svg')) window.__seen.icicle = window.__frame;
    if (!('table' in window.__seen) && document.querySelector('#cbsite-table tbody tr')) window.__seen.table = window.__frame;
  }).observe(document, {childList: true, subtree: true});"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A run of 400 components, with its roofline below the first screen."""
    runs = tmp_path_factory.mktemp("run-mount") / "runs"
    synthetic_run(runs, "wide", "v1", n=400, seed=11, branching=8)
    built = quiet_build(runs)
    with served(built) as server:
        yield server, built


def _run_url(site) -> tuple[str, dict]:
    server, built = site
    run = next(built.glob("runs/wide/v1/*"))
    return f"{server.url}{run.relative_to(built).as_posix()}/", json.loads((run / "roofline.json").read_text())["roofline"]


def test_the_icicle_is_painted_before_the_table_is_built(site, page):
    page.add_init_script(FRAMES)
    url, _ = _run_url(site)
    page.goto(url)
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=30000)
    seen = page.evaluate("window.__seen")
    assert seen["table"] > seen["icicle"], seen  # at least one frame with the icicle and no table yet
    # Once ready, the table is whole: its first page of rows, with the module types fitted to the room left.
    assert page.locator("#cbsite-table tbody tr").count() == 100
    assert page.evaluate("document.querySelector('#cbsite-table table').classList.contains('cbsite-one-line')")
    assert page.errors == []


def test_roofline_below_the_first_screen_waits_until_scrolled_to_then_is_whole(site, page):
    url, drawn = _run_url(site)
    page.goto(url)
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=30000)
    box = page.locator(".cbsite-roofline")
    assert box.bounding_box()["y"] > 1.5 * VIEWPORT["height"]  # more than half a screen below the first one
    page.wait_for_timeout(1500)  # what the page would draw on its own once idle
    assert page.locator(".cbsite-roof-point").count() == 0
    box.scroll_into_view_if_needed()
    page.wait_for_selector(".cbsite-roofline svg .cbsite-roof-point", timeout=20000)
    page.wait_for_function(f"document.querySelectorAll('.cbsite-roof-point').length === {len(drawn['points']['path'])}",
                           timeout=20000)  # every point, added to the chart at once
    roofline_legend_painted(page)
    seen = page.evaluate("""() => { const s = document.querySelector('.cbsite-roofline svg').getBoundingClientRect(),
        p = document.querySelector('.cbsite-roof-plot').getBoundingClientRect();
        const out = Array.from(document.querySelectorAll('.cbsite-roof-point')).filter(a => {
          const b = a.getBoundingClientRect();
          return b.width === 0 || b.left < p.left - 5 || b.right > p.right + 5 || b.top < p.top - 5 || b.bottom > p.bottom + 5; });
        return { top: s.top, bottom: s.bottom, height: s.height, out: out.length,
                 legend: document.querySelector('.cbsite-roofline-legend').innerText }; }""")
    assert seen["top"] >= 0 and seen["bottom"] <= VIEWPORT["height"] and seen["height"] == 320, seen
    assert seen["out"] == 0, seen  # every point drawn, inside the plot
    assert "bound by" in seen["legend"]
    assert page.errors == []


def test_the_address_keeps_a_plain_anchor_then_holds_the_view_chosen(site, page):
    url, _ = _run_url(site)
    page.goto(url + "#summary")
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=30000)
    assert page.evaluate("location.hash") == "#summary"  # followed, and left as it was: no view chosen yet
    top = page.locator("h2#summary").bounding_box()["y"]
    assert 0 <= top < VIEWPORT["height"] / 2  # the browser scrolled to it
    page.select_option("#cbsite-phase", "backward")
    assert page.evaluate("location.hash") == "#phase=backward"
    assert "backward" in page.locator("#cbsite-width option").first.inner_text()  # the choices name the phase
    page.select_option("#cbsite-phase", "forward")  # the default view: no state left in the address
    assert page.evaluate("location.hash") == ""
    assert page.errors == []
