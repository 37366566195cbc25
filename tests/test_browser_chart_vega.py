"""Charts compiled to Vega at build time (charts.py): the model and study pages' chart files hold Vega, drawn by the
Vega runtime alone (vega.js: no Vega-Lite, no vega-embed), and the pages draw what they drew from Vega-Lite: the model
page's trends with their band, legends, tooltips and clickable points (by mouse and keyboard), the study page's
faceted charts drawn as they near the viewport in boxes that hold their height, its log scale, and the dark scheme.
The diff page's contributors stay Vega-Lite, drawn by the other bundle (vega-lite.js), which only that page loads."""

from __future__ import annotations

import re
import shutil
import warnings

import pytest

from cbsite.generator import build_site
from tests.helpers.browser import Server, draw_every, outside, recording_page
from tests.helpers.site_archives import synthetic_run

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}
STUDY = "demo-dense-sparse"


@pytest.fixture(scope="module")
def site(demo_runs, tmp_path_factory):
    """Three versions of a synthetic model (trends and diffs) and the tests' demo study."""
    base = tmp_path_factory.mktemp("chart-vega")
    runs = base / "runs"
    for i, version in enumerate(("v1", "v2", "v3")):
        synthetic_run(runs, "toy", version, n=40, seed=31 + i, minutes=5 * i, scale=1 + 0.2 * i)
    shutil.copytree(demo_runs / STUDY, runs / STUDY)
    shutil.copytree(demo_runs / "_studies", runs / "_studies")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = build_site(runs, base / "site", quiet=True)
    server = Server(built)
    yield server, built
    server.close()


def _chart_files(built):
    import json

    trends = json.loads((built / "models/toy/trends.json").read_text())
    study = json.loads((built / f"studies/{STUDY}/charts.json").read_text())
    diff = json.loads(next((built / "diffs").rglob("charts.json")).read_text())
    return trends, study, diff


def test_chart_files_hold_vega_and_the_bundle_is_the_runtime_alone(site):
    _, built = site
    trends, study, diff = _chart_files(built)
    specs = [*trends.values(), *(s for scales in study.values() for s in scales.values())]
    assert len(trends) >= 4 and len(study) >= 8 and diff
    # The diff's contributors are Vega-Lite (diffdata edits each after it is made; compiling them costs per diff).
    assert all("marks" not in spec and spec["mark"]["type"] == "bar" for spec in diff.values())
    for spec in specs:
        assert isinstance(spec["marks"], list) and "layer" not in spec and "encoding" not in spec, sorted(spec)
        assert "$schema" not in spec and spec["usermeta"]["height"] > 70  # the box it holds until drawn
    # A faceted study chart holds its rows of panels: two panels in one row here.
    assert study["dense_features|latency_forward_ms"]["linear"]["usermeta"]["height"] == 180 + 20 + 70
    bundle = (built / "assets/cbsite/vega.js").read_text()
    assert "window.cbsiteVega=" in bundle.replace(" ", "") and "cbsiteVegaEmbed" not in bundle
    assert "vega-lite" not in bundle and "vg-tooltip" not in bundle  # neither Vega-Lite, vega-embed nor vega-tooltip
    assert len(bundle) < 700_000
    vega_lite = (built / "assets/cbsite/vega-lite.js").read_text()
    assert "window.cbsiteVegaLite=" in vega_lite.replace(" ", "") and len(vega_lite) > len(bundle) + 200_000
    # The model and study pages fetch the runtime early, never the Vega-Lite bundle.
    for page in ("models/toy/index.html", f"studies/{STUDY}/index.html"):
        html = (built / page).read_text()
        assert 'href="../../assets/cbsite/vega.js" as="script"' in html and "vega-lite.js" not in html, page


# Each trend point's link as drawn: its centre, whether it is on top there, and its accessible name (it names the run).
POINTS = """() => Array.from(document.querySelectorAll('[data-cbsite-chart] .cbsite-chart-link')).map(p => {
  const b = p.getBoundingClientRect(), e = document.elementFromPoint((b.left + b.right) / 2, (b.top + b.bottom) / 2);
  return { x: (b.left + b.right) / 2, y: (b.top + b.bottom) / 2, top: e === p, label: p.getAttribute('aria-label') }; })"""

# The tooltip as a reader sees it: shown, inside the window, and its rows.
TOOLTIP = """() => { const t = document.getElementById('vg-tooltip-element'); if (!t) return null;
  const b = t.getBoundingClientRect(), s = getComputedStyle(t);
  return { visible: s.visibility === 'visible' && b.width > 0, inside: b.left >= 0 && b.top >= 0 && b.right <= innerWidth
           && b.bottom <= innerHeight, rows: Array.from(t.querySelectorAll('tr')).map(r => [r.querySelector('.key').textContent,
           r.querySelector('.value').textContent]) }; }"""


def test_trend_charts_draw_their_band_legend_tooltips_and_open_a_run_on_click(site, browser):
    server, built = site
    with recording_page(browser, VIEWPORT) as page:
        page.goto(server.url + "models/toy/")
        n = draw_every(page, "[data-cbsite-chart]", "[data-cbsite-links]")
        assert n >= 4
        latency = page.locator("[data-cbsite-chart='latency_ms']")
        assert latency.locator("svg .mark-area path").count() >= 1  # the p25-p75 band of the newest runs
        assert latency.locator("svg .mark-line path").count() >= 2  # forward and backward
        legend = latency.locator("svg .role-legend-label text").all_text_contents()
        assert legend == ["backward", "forward"], legend
        title = latency.locator("svg .role-title-text").all_text_contents()
        assert title and "band: p25-p75" in title[0]
        # A point's tooltip: its version, run and value, shown beside the pointer and inside the window.
        point = next(p for p in page.evaluate(POINTS) if p["top"])
        page.mouse.move(point["x"], point["y"])
        page.wait_for_selector("#vg-tooltip-element.visible", timeout=5000)
        tip = page.evaluate(TOOLTIP)
        assert tip["visible"] and tip["inside"], tip
        rows = dict(tip["rows"])
        assert rows["version"] in ("v1", "v2", "v3") and rows["run"] in point["label"], (rows, point)
        assert re.fullmatch(r"[\d.]+[kMGT]?", rows["value"]), rows
        page.mouse.move(0, 0)
        page.wait_for_function("!document.querySelector('#vg-tooltip-element.visible')", timeout=5000)
        # A click opens that run's page.
        page.mouse.click(point["x"], point["y"])
        page.wait_for_url(f"**/runs/toy/*/{rows['run']}/", timeout=10000)
        assert page.errors == [] and outside(page.requests, {server.port}) == []
        # The keyboard's way to a run is test_browser_chart_loading's (the same charts since they are Vega).


def test_study_charts_show_panels_tooltips_and_swap_to_log(site, browser):
    """The faceted study charts drawn by the Vega runtime: panel headers, legend, tooltips, the log scale. (That
    their boxes hold their height until drawn is test_browser_chart_loading's.)"""
    server, _ = site
    with recording_page(browser, VIEWPORT) as page:
        page.goto(server.url + f"studies/{STUDY}/")
        draw_every(page, "[data-cbsite-study-chart]", "svg .mark-line")
        # Two panels (one per value of the other axis), each with its header, and the series' legend.
        chart = page.locator("[data-cbsite-study-chart='dense_features|latency_forward_ms']")
        headers = chart.locator("svg .role-column-header text, svg .role-title-text").all_text_contents()
        assert "sparse_features=4" in headers and "sparse_features=16" in headers, headers
        assert "model" in chart.locator("svg .role-legend-label text").all_text_contents()
        # A point's tooltip names its point, series and value.
        chart.scroll_into_view_if_needed()
        box = chart.locator("svg .mark-symbol.role-mark path").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_selector("#vg-tooltip-element.visible", timeout=5000)
        tip = page.evaluate(TOOLTIP)
        assert tip["visible"] and tip["inside"], tip
        assert [k for k, _ in tip["rows"]][:2] == ["point", "series"] and "forward ms" in dict(tip["rows"]), tip
        page.mouse.move(0, 0)
        # The log scale: every chart drawn again, on log axes.
        page.evaluate("window.scrollTo(0, 0)")
        page.check("#cbsite-study-log")
        draw_every(page, "[data-cbsite-study-chart]", "[data-cbsite-scale='log']")
        assert page.errors == [] and outside(page.requests, {server.port}) == []


def test_dark_scheme_draws_light_ink_on_no_background(site, browser):
    server, _ = site
    with recording_page(browser, VIEWPORT) as page:
        page.goto(server.url + "models/toy/")
        page.wait_for_function("document.querySelector('[data-cbsite-chart] svg .mark-line') !== null", timeout=20000)
        page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
        page.wait_for_function("document.querySelector('[data-cbsite-chart][data-cbsite-scheme=\"dark\"] svg .mark-line') !== null",
                               timeout=20000)
        looks = page.evaluate("""() => { const c = document.querySelector('[data-cbsite-chart][data-cbsite-scheme="dark"]');
            const bg = Array.from(c.querySelectorAll('svg .background')).map(r => getComputedStyle(r).fill);
            const ink = Array.from(c.querySelectorAll('svg .role-axis-label text, svg .role-legend-label text, svg .role-title-text text'))
              .map(t => getComputedStyle(t).fill);
            return { bg, ink }; }""")
        assert looks["ink"], looks
        assert all(f in ("none", "transparent", "rgba(0, 0, 0, 0)") for f in looks["bg"]), looks  # never a white box
        assert sorted(set(looks["ink"])) == ["rgb(255, 255, 255)"], sorted(set(looks["ink"]))
        assert page.errors == []


def test_diff_contributors_are_drawn_when_opened(site, browser):
    server, built = site
    url = next((built / "diffs").rglob("index.html")).parent.relative_to(built).as_posix()
    with recording_page(browser, VIEWPORT) as page:
        page.goto(f"{server.url}{url}/")
        page.wait_for_load_state("networkidle")
        assert not any(r.endswith(("/vega.js", "/vega-lite.js")) for r in page.requests)  # nothing for a closed section
        page.click("#contributors > summary")
        page.wait_for_function("document.querySelector('#contributors [data-cbsite-chart] svg .mark-rect') !== null", timeout=20000)
        bars = page.locator("#contributors [data-cbsite-chart] svg .mark-rect path")
        assert bars.count() >= 1 and bars.first.is_visible()
        labels = page.locator("#contributors [data-cbsite-chart]").first.locator("svg .role-axis-label text").all_text_contents()
        assert labels, labels
        # Drawn by the Vega-Lite bundle, loaded once; the runtime alone is not fetched too.
        assert [r.rsplit("/", 1)[1] for r in page.requests if r.endswith(".js") and "/vega" in r] == ["vega-lite.js"]
        assert page.errors == []
