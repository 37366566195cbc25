"""Readability in the real browser at 1400x1000: what a person sees. The icicle's tooltip is whole and inside the
viewport, its labels are readable (contrast from the drawn colours), utilisations are on absolute scales
with their own ramps, the icicle colours by what bounds each component, the roofline opens a component,
the table fits the page with right-aligned numbers and paths never broken inside a name, a search for a
full path lands on that component's row, and icicle nodes work from the keyboard."""

from __future__ import annotations

import json
import re

import pytest

from cbsite.generator import build_site
from tests.helpers.browser import Server, outside, served_html
from tests.helpers.readability import CONTRASTS, LABELS, check_labels
from tests.helpers.site_archives import readable_archive

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}

UNCLIPPED = """(sel) => {
  const el = document.querySelector(sel), t = el.getBoundingClientRect(), out = [];
  for (let a = el.parentElement; a && a !== document.documentElement; a = a.parentElement) {
    const s = getComputedStyle(a);
    if (s.overflow === 'visible' && s.overflowX === 'visible' && s.overflowY === 'visible') continue;
    const r = a.getBoundingClientRect();
    if (t.left < r.left - 0.5 || t.top < r.top - 0.5 || t.right > r.right + 0.5 || t.bottom > r.bottom + 0.5) out.push(a.className || a.tagName);
  }
  return out; }"""


# A Perfetto UI that never answers: the site's "Open in Perfetto" goes to it.
SILENT = "<!DOCTYPE html><html><head><meta charset='utf-8'><title>silent</title></head><body>no answer</body></html>"


@pytest.fixture(scope="module")
def silent(tmp_path_factory):
    with served_html(tmp_path_factory.mktemp("silent"), SILENT) as server:
        yield server


@pytest.fixture(scope="module")
def site(tmp_path_factory, silent):
    base = tmp_path_factory.mktemp("readable-browser")
    runs = base / "runs"
    readable_archive(runs, head_trace_every=5)
    built = build_site(runs, base / "site", perfetto_origin=silent.url.rstrip("/"), quiet=True)
    server = Server(built)
    yield server, built
    server.close()


def _run(server, built, version="v2") -> str:
    folder = next((built / "runs" / "toy" / version).iterdir())
    return f"{server.url}runs/toy/{version}/{folder.name}/"


def _open(page, url):
    page.goto(url)
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)


def _inside_viewport(box) -> bool:
    return (box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= VIEWPORT["width"]
            and box["y"] + box["height"] <= VIEWPORT["height"])


def test_icicle_tooltip_is_whole_and_inside_the_viewport(site, page):
    server, built = site
    _open(page, _run(server, built))
    # A node near the right end of the deepest row: the tooltip must flip to stay inside the viewport.
    index = page.evaluate("""() => { const L = window.cbsiteRun.icicle.layout; let best = -1, x = -1;
        L.nodes.forEach(i => { if (L.depth[i] >= 2 && L.x1[i] - L.x0[i] > 0.01 && L.x0[i] > x) { x = L.x0[i]; best = i; } });
        return best; }""")
    node = page.locator(f"#cbsite-icicle g.cbsite-node[data-index='{index}']").first
    node.scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -(window.innerHeight - 140 - document.querySelector('#cbsite-icicle').getBoundingClientRect().bottom))")
    box = node.bounding_box()
    page.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    tip = page.locator(".cbsite-tip")
    text = tip.inner_text()
    for row in ("latency per forward", "FLOPs per forward", "MFU", "bandwidth utilisation", "bound by"):
        assert row in text  # every line, not the first two or three
    assert _inside_viewport(tip.bounding_box())
    assert page.evaluate(UNCLIPPED, ".cbsite-tip") == []
    assert tip.evaluate("e => e.scrollHeight <= e.clientHeight + 1 && e.scrollWidth <= e.clientWidth + 1")
    assert page.errors == []


@pytest.mark.parametrize("colour", ["mfu", "bandwidth_util", "latency_ms", "flops", "bound"])
def test_icicle_labels_are_readable_in_every_colouring(site, page, colour):
    server, built = site
    _open(page, _run(server, built))
    page.select_option("#cbsite-colour", colour)
    pairs = page.evaluate(CONTRASTS)
    assert len(pairs) > 10
    low = [(t, round(c, 2)) for t, c in pairs if c < 4.5]
    assert low == []
    assert page.errors == []


def test_icicle_labels_are_names_or_their_start(site, page):
    """Never "t…0": a label is its node's leaf name, or the name's first 3+ characters and an ellipsis, drawn
    inside its rectangle; a node too narrow for that has none."""

    server, built = site
    _open(page, _run(server, built))
    for width in (1400, 700):
        page.set_viewport_size({"width": width, "height": 1000})
        page.wait_for_timeout(300)  # the icicle redraws on resize
        check_labels(page.evaluate(LABELS))
    assert page.errors == []


def test_utilisations_are_on_absolute_scales_with_their_own_ramps(site, page):
    server, built = site
    _open(page, _run(server, built))
    page.select_option("#cbsite-colour", "mfu")
    mfu = page.evaluate("(() => { const s = window.cbsiteRun.icicle.scale; return [s.lo, s.hi, s.kind, s.stops]; })()")
    legend = page.inner_text("#cbsite-legend")
    assert "0%" in legend and "100% (absolute)" in legend
    assert page.locator("#cbsite-legend .cbsite-ramp").count() == 1  # a colour swatch, not words only
    page.select_option("#cbsite-colour", "bandwidth_util")
    bw = page.evaluate("(() => { const s = window.cbsiteRun.icicle.scale; return [s.lo, s.hi, s.kind, s.stops]; })()")
    assert mfu[:3] == [0, 1, "unit"] and bw[:3] == [0, 1, "unit"]
    assert mfu[3] != bw[3]  # MFU and bandwidth never share one ramp
    # A node's colour depends on its own value only: the same MFU draws the same colour whatever is shown.
    same = page.evaluate("""() => { const s = window.CbsiteIcicle.scale([0.21], 'unit', 'purple'),
        t = window.CbsiteIcicle.scale([0.21, 0.9], 'unit', 'purple'); return s.colour(0.21) === t.colour(0.21); }""")
    assert same
    # The legend explains outlines and hatching.
    for words in ("hatched", "dashed outline", "red outline", "black and white outline", "no value"):
        assert words in page.inner_text("#cbsite-legend")


def test_icicle_colours_by_bound_and_the_roofline_opens_a_component(site, page):
    server, built = site
    _open(page, _run(server, built))
    page.select_option("#cbsite-colour", "bound")
    check = page.evaluate("""() => { const d = window.cbsiteRun.data, colours = {compute: '#1f6fb4', memory: '#d9730d', overhead: '#7f7f7f'};
        let n = 0, bad = [];
        document.querySelectorAll('#cbsite-icicle g.cbsite-node:not(.self):not(.ancestor)').forEach(g => {
          const i = +g.dataset.index, b = d.forward.bound[i], fill = g.querySelector('rect').getAttribute('fill');
          if (b) { n++; if (fill !== colours[b]) bad.push([d.path[i], b, fill]); } });
        return [n, bad]; }""")
    assert check[0] > 10 and check[1] == []
    assert {"compute", "memory", "overhead"} <= set(page.inner_text("#cbsite-legend").split())
    page.locator(".cbsite-roofline").scroll_into_view_if_needed()  # drawn only when it nears the viewport
    page.wait_for_selector(".cbsite-roofline svg .cbsite-roof-point", timeout=20000)
    points = page.locator(".cbsite-roofline .cbsite-roof-point")
    assert points.count() > 5
    points.first.click(force=True)  # points may overlap: whichever is on top opens
    page.wait_for_function("location.hash.startsWith('#component=')", timeout=5000)
    # The address names the component first (the page may add its zoom after an `&`).
    path = page.evaluate("decodeURIComponent(location.hash.split('&')[0].slice('#component='.length))")
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    assert page.inner_text("#cbsite-details h3") == path
    assert page.locator("#cbsite-table tr.cbsite-linked").count() == 1
    assert page.errors == []
    assert outside(page.requests, {server.port}) == []


def test_table_fits_the_page_with_right_aligned_numbers_and_whole_names(site, page):
    server, built = site
    for version in ("v1", "v2"):
        _open(page, _run(server, built, version))
        page.select_option("#cbsite-table select.cbsite-depth", "")
        widths = page.evaluate("""() => { const w = document.querySelector('#cbsite-table .cbsite-table-wrap'),
            t = w.querySelector('table'); return [t.scrollWidth, w.clientWidth, document.documentElement.scrollWidth]; }""")
        assert widths[0] <= widths[1] and widths[2] <= VIEWPORT["width"]
        aligns = page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-table td.num, #cbsite-table th.num'))
            .map(e => getComputedStyle(e).textAlign)""")
        assert aligns and set(aligns) == {"right"}
        # Path cells: no overflow, and no break inside a name (word-break normal everywhere inside).
        cells = page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-table td.path')).map(td =>
            [td.scrollWidth <= td.clientWidth + 1, Array.from(td.querySelectorAll('*')).concat([td]).every(e =>
              getComputedStyle(e).wordBreak === 'normal' && getComputedStyle(e).overflowWrap === 'normal')])""")
        assert cells and all(a and b for a, b in cells)
        flops = page.evaluate("""() => { const h = Array.from(document.querySelectorAll('#cbsite-table thead th')).map(t => t.textContent);
            const k = h.indexOf('FLOP/s'); return Array.from(document.querySelectorAll('#cbsite-table tbody tr')).map(tr => tr.children[k].textContent); }""")
        assert all(v == "\u2013" or v.endswith("FLOP/s") for v in flops)
        assert not any("0.000" in v for v in flops)
    assert page.errors == []


def test_search_for_a_full_path_lands_on_its_row(site, page):
    server, built = site
    page.goto(server.url)
    folder = next((built / "runs" / "toy" / "v2").iterdir())
    data = json.loads((folder / "components.json").read_text())
    target = max((p for p in data["path"] if p.count(".") >= 2), key=len)
    page.click(".md-search__input")
    page.keyboard.type(target)
    page.wait_for_selector(".md-search-result__item", timeout=15000)
    page.wait_for_timeout(500)
    first = page.locator(".md-search-result__link").first
    assert "/runs/toy/" in first.get_attribute("href")  # a run page first, not the home or another model
    first.click()
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    assert page.inner_text("#cbsite-details h3") == target
    row = page.locator("#cbsite-table tr.cbsite-linked")
    assert row.count() == 1 and target.rsplit(".", 1)[-1] in row.inner_text()
    assert page.errors == []


def test_icicle_nodes_work_from_the_keyboard(site, page):
    server, built = site
    _open(page, _run(server, built))
    node = page.locator("#cbsite-icicle g.cbsite-node[tabindex='0']:not(.ancestor)").nth(1)
    index = int(node.get_attribute("data-index"))
    node.focus()
    assert page.locator(".cbsite-tip").is_visible() and _inside_viewport(page.locator(".cbsite-tip").bounding_box())
    page.keyboard.press("Enter")
    assert page.evaluate("window.cbsiteRun.icicle.zoom") == index
    assert page.evaluate("document.activeElement.getAttribute('data-index')") == str(index)
    assert page.errors == []


def test_charts_follow_the_dark_scheme(site, page):
    server, _ = site
    page.goto(server.url + "models/toy/")
    page.wait_for_selector(".cbsite-chart svg", timeout=20000)
    style = "(() => { const s = document.querySelector('.cbsite-chart svg'); return [s.style.backgroundColor, getComputedStyle(s.querySelector('text')).fill]; })()"
    assert page.evaluate(style) == ["white", "rgb(0, 0, 0)"]
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")  # what the palette toggle does
    page.wait_for_function("document.querySelector('.cbsite-chart svg') && document.querySelector('.cbsite-chart svg').style.backgroundColor === 'transparent'", timeout=10000)
    background, ink = page.evaluate(style)
    assert background == "transparent" and ink != "rgb(0, 0, 0)"  # light text on the dark page, no white box
    # Axis labels carry unit prefixes, not raw numbers.
    labels = page.locator(".cbsite-chart svg .role-axis-label text").all_text_contents()
    assert labels and not any(len(t.replace(",", "")) > 6 and t.replace(",", "").isdigit() for t in labels)
    assert [t for t in labels if re.search(r"\de[+-]?\d", t)] == []  # never "1e+1"
    assert page.errors == []


def test_perfetto_that_does_not_answer_is_said_on_the_page(site, silent, browser):
    """Offline, the Perfetto tab shows only a browser error: the run page itself says what happened."""
    server, out = site
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    _open(page, _run(server, out, "v1"))
    page.evaluate("window.CbsitePerfetto.answerMs = 300")
    page.select_option("#cbsite-table select.cbsite-depth", "")
    button = page.locator("button.cbsite-perfetto").first
    assert silent.url.rstrip("/") in button.get_attribute("title")
    with context.expect_page():
        button.click()
    toast = page.locator(".cbsite-toast")
    toast.wait_for(timeout=5000)
    assert "has not answered" in toast.inner_text() and _inside_viewport(toast.bounding_box())
    assert toast.locator("a").get_attribute("href") == button.get_attribute("data-trace")
    assert errors == []
    context.close()


def test_a_page_opened_from_disk_says_why_it_does_not_work(site, browser):
    _, built = site
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto((next((built / "runs" / "toy" / "v1").iterdir()) / "index.html").as_uri())
    banner = page.locator(".cbsite-file-banner")
    banner.wait_for(timeout=10000)
    assert "cbsite serve" in banner.inner_text() and banner.is_visible()
    assert _inside_viewport(banner.bounding_box())
    context.close()
