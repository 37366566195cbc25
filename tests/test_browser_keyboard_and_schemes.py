"""Keyboard and colour schemes in Debian's chromium: the first Tab stop skips to the content, the table filter
shows where focus is, the icicle moves with the arrow keys and backs out with Escape, change and verdict text
stays readable (4.5:1) in the dark scheme, and the system's dark preference picks the dark scheme (the built-in
configuration) and the memory viewer's colours."""

from __future__ import annotations

from pathlib import Path

import pytest

from cbsite.generator import build_site
from cbsite.generator.config import DEFAULTS_FILE
from cbsite.generator.serve import make_server

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make browser)"),
]
VIEWPORT = {"width": 1400, "height": 1000}

# WCAG contrast of each element's text against the colour drawn behind it (the first opaque background up).
CONTRASTS = """(sel) => {
  const rgba = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = (c) => { const v = rgba(c).slice(0, 3).map(x => { x /= 255;
    return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4); });
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const behind = (e) => { for (let a = e; a; a = a.parentElement) { const b = getComputedStyle(a).backgroundColor, v = rgba(b);
    if (v.length === 3 || (v.length === 4 && v[3] > 0.9)) return b; } return getComputedStyle(document.body).backgroundColor; };
  return Array.from(document.querySelectorAll(sel)).filter(e => e.offsetParent !== null && e.textContent.trim())
    .map(e => { const a = lum(getComputedStyle(e).color), b = lum(behind(e));
      return [e.className + ': ' + e.textContent.trim().slice(0, 30), (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)]; }); }"""
DELTAS = (".cbsite-table .up, .cbsite-table .down, tr.up td:nth-child(5), tr.down td:nth-child(5), .cbsite-kind[class*='kind-'], "
          ".cbsite-verdict, .cbsite-suspect, .cbsite-warn, .cbsite-status.status-failed")


def _diff(built: Path) -> str:
    model = next(d for d in sorted((built / "diffs").iterdir()) if "sharded" not in d.name and not d.name.startswith("demo-"))
    return next(model.glob("*/*")).relative_to(built).as_posix() + "/"


def _run(built: Path) -> str:
    return max((built / "runs" / "dlrm").glob("*/*")).relative_to(built).as_posix() + "/"


def test_change_and_verdict_text_is_readable_in_the_dark_scheme(committed_site, page):
    server, built = committed_site
    page.goto(server.url + _diff(built))
    page.wait_for_load_state("load")
    page.wait_for_timeout(500)
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")  # what the palette toggle does
    page.evaluate("document.querySelectorAll('.cbsite-page details').forEach(d => d.open = true)")
    pairs = page.evaluate(CONTRASTS, DELTAS)
    assert len(pairs) > 5
    assert [(t, round(c, 2)) for t, c in pairs if c < 4.5] == []
    assert page.errors == []


def test_skip_link_is_the_first_tab_stop(committed_site, page):
    server, built = committed_site
    page.goto(server.url + _run(built))
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    page.keyboard.press("Tab")
    skip = page.evaluate("""() => { const a = document.activeElement; return [a.tagName, a.textContent.trim()]; }""")
    assert skip == ["A", "Skip to content"]
    page.wait_for_timeout(400)  # Material's transition brings it into view
    box = page.locator("a.md-skip").bounding_box()
    assert box and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]
    page.keyboard.press("Enter")
    page.keyboard.press("Tab")  # the next stop is in the page's content, past the header and the navigation
    assert page.evaluate("!!document.activeElement.closest('.md-content') && !document.activeElement.closest('.md-header')")
    assert page.errors == []


def test_filter_input_shows_keyboard_focus(committed_site, page):
    server, built = committed_site
    page.goto(server.url + _run(built))
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    before = page.evaluate("getComputedStyle(document.querySelector('input.cbsite-filter')).outlineStyle")
    page.locator("input.cbsite-filter").focus()
    style = page.evaluate("""() => { const s = getComputedStyle(document.activeElement);
        return [document.activeElement.classList.contains('cbsite-filter'), s.outlineStyle, parseFloat(s.outlineWidth)]; }""")
    assert style[0] and style[1] not in ("none", before) and style[2] >= 2, style
    assert page.errors == []


def test_icicle_arrow_keys_and_escape(committed_site, page):
    server, built = committed_site
    page.goto(server.url + _run(built))
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    focused = """() => { const a = document.activeElement, g = a.closest && a.closest('g.cbsite-node');
        return g ? +g.dataset.index : null; }"""

    def parent(i: int) -> int:
        return page.evaluate("(i) => window.cbsiteRun.data.parent[i]", i)

    def x0(i: int) -> float:
        return page.evaluate("(i) => window.cbsiteRun.icicle.layout.x0[i]", i)

    page.locator("#cbsite-icicle g.cbsite-node[data-index='0']").focus()
    assert page.evaluate(focused) == 0
    page.keyboard.press("ArrowDown")
    child = page.evaluate(focused)
    assert child is not None and parent(child) == 0 and page.locator(".cbsite-tip").is_visible()
    page.keyboard.press("ArrowRight")
    sibling = page.evaluate(focused)
    assert sibling != child and parent(sibling) == 0 and x0(sibling) > x0(child)
    page.keyboard.press("ArrowLeft")
    assert page.evaluate(focused) == child
    page.keyboard.press("Enter")  # zoom into it
    assert page.evaluate("window.cbsiteRun.icicle.zoom") == child
    page.keyboard.press("Escape")  # and back out one level, focus kept on the icicle
    assert page.evaluate("window.cbsiteRun.icicle.zoom") == 0
    assert page.evaluate(focused) is not None
    page.keyboard.press("ArrowUp")
    assert page.evaluate(focused) == 0
    assert page.errors == []


def test_system_dark_preference_picks_the_dark_scheme(tmp_path, browser):
    from tests.helpers.site_archives import write_golden_archive

    runs = write_golden_archive(tmp_path / "runs")
    built = build_site(runs, tmp_path / "site", config=DEFAULTS_FILE, quiet=True)
    import threading

    httpd = make_server(built, port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        for scheme, expected in (("dark", "slate"), ("light", "default")):
            context = browser.new_context(viewport=VIEWPORT, color_scheme=scheme)
            page = context.new_page()
            page.goto(url)
            assert page.evaluate("document.body.getAttribute('data-md-color-scheme')") == expected
            page.goto(url + "assets/cbsite/memory.html")
            bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
            light_bg = bg in ("rgb(255, 255, 255)", "rgba(0, 0, 0, 0)")
            assert light_bg == (scheme == "light"), (scheme, bg)
            context.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
