"""The real-browser harness: Debian's chromium under playwright (never a downloaded browser), a local HTTP server
for a built site, pages that record every request and console error, and checks several browser files share.
Tests marked `browser` are skipped where chromium is missing (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path
from urllib.parse import urlparse

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


class Server:
    """`cbsite serve`'s server for `directory` on a free port of 127.0.0.1, in a thread."""

    def __init__(self, directory: Path) -> None:
        # Imported here, not above: conftest reads CHROMIUM at collection, before any site is served.
        from cbsite.generator.serve import make_server

        self.httpd = make_server(directory, port=0)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def served(folder: Path):
    server = Server(folder)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def served_html(folder: Path, html: str):
    """One page, `html`, served as the index of `folder` (a stand-in for another site: a Perfetto UI, say)."""
    (folder / "index.html").write_text(html)
    with served(folder) as server:
        yield server


@contextlib.contextmanager
def launched_browser():
    """Debian's chromium under playwright; a session's tests share one (the `chromium` fixture)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield b
        finally:
            b.close()


@contextlib.contextmanager
def closing_new_contexts(browser):
    """Closes, on the way out, every context of `browser` opened inside the block and still open."""
    before = set(browser.contexts)
    try:
        yield browser
    finally:
        for context in browser.contexts:
            if context not in before:
                context.close()


@contextlib.contextmanager
def recording_page(browser, viewport: dict):
    """A page that records every request (`page.requests`) and every console error (`page.errors`)."""
    context = browser.new_context(viewport=viewport)
    pg = context.new_page()
    pg.requests, pg.errors = [], []
    context.on("request", lambda r: pg.requests.append(r.url))
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    try:
        yield pg
    finally:
        context.close()


def roofline_legend_painted(page, timeout: int = 5000) -> None:
    """Wait until the roofline's legend reads as a person sees it: its box is `content-visibility: auto`, and while
    the browser skips the box its text reads as '' though it is in the DOM (the likely cause of one CI failure)."""
    page.wait_for_function("(document.querySelector('.cbsite-roofline-legend') || {}).innerText", timeout=timeout)


def draw_every(page, selector: str, ready: str = "svg", timeout: int = 30000) -> int:
    """Scroll to each chart matching `selector` in turn, as a reader would (charts.js draws a chart only as it nears
    the viewport), until it matches `ready` or holds an element that does; back to the top after. Returns how many."""
    n = page.locator(selector).count()
    for i in range(n):
        page.locator(selector).nth(i).scroll_into_view_if_needed()
        page.wait_for_function("([sel, i, ready]) => { const el = document.querySelectorAll(sel)[i];"
                               " return el.matches(ready) || el.querySelector(ready) !== null; }",
                               arg=[selector, i, ready], timeout=timeout)
    page.evaluate("window.scrollTo(0, 0)")
    return n


def outside(requests: list[str], allowed_ports: set[int]) -> list[str]:
    """The requests that left 127.0.0.1 or went to a port not in `allowed_ports` (a site is offline)."""
    out = []
    for url in requests:
        u = urlparse(url)
        if u.scheme in ("data", "blob", "about"):
            continue
        if u.hostname != "127.0.0.1" or u.port not in allowed_ports:
            out.append(url)
    return out


def check_short_lazy_diff_page(page, server_url: str, url: str) -> int:
    """The diff page, opened at 1400x1000 (the page's viewport): at most ~3.5 screens long (setup, totals,
    icicle and table first; the secondary sections collapsed), its first phase's data only on open, the backward
    phase fetched when the table's phase selector asks for it and then shown (table and icicle), every delta
    with at most 4 significant digits, a collapsed section that opens with its charts at full width, no console
    error. Returns the page's height."""
    page.goto(server_url + url)
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    page.wait_for_timeout(300)
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height <= 3.5 * page.viewport_size["height"], height
    assert page.evaluate("Array.from(document.querySelectorAll('details.cbsite-more')).every(d => !d.open)")
    loaded = [u.rsplit("/", 1)[-1] for u in page.requests if url in u and u.endswith(".json")]
    assert "diff.forward.json" in loaded and "diff.backward.json" not in loaded
    assert not any(u.endswith("components.json") for u in page.requests)

    def deltas() -> list[str]:
        return page.evaluate("""() => {
            const heads = Array.from(document.querySelectorAll('#cbsite-difftable thead th')).map(h => h.textContent);
            const cols = heads.map((h, i) => h.indexOf('\\u0394') === 0 ? i : -1).filter(i => i >= 0);
            return Array.from(document.querySelectorAll('#cbsite-difftable tbody tr')).flatMap(
                tr => cols.map(i => tr.children[i].textContent)); }""")

    def digits(text: str) -> int:
        number = re.search(r"[0-9][0-9.]*", text)
        return len(number.group(0).replace(".", "").lstrip("0")) if number else 0

    forward = deltas()
    assert len(forward) >= 20 and max(map(digits, forward)) <= 4, forward
    assert not any(re.search(r"\b0\.000", t) for t in forward), forward  # once "+0.000653 ms"
    # The backward phase: fetched when asked for, then its rows are shown.
    page.select_option("#cbsite-difftable select[aria-label='phase']", "backward")
    page.wait_for_function("window.cbsiteDiff.diff.backward !== undefined && "
                           "document.querySelector('#cbsite-diff').getAttribute('data-loading') === '0'", timeout=10000)
    assert any(u.endswith(url + "diff.backward.json") for u in page.requests)
    assert page.locator("#cbsite-difftable tbody tr").count() > 5
    assert page.evaluate("window.cbsiteDiff.table.spec.count") == page.evaluate("window.cbsiteDiff.diff.backward.path.length")
    backward = deltas()
    assert len(backward) >= 20 and max(map(digits, backward)) <= 4, backward
    assert not any(re.search(r"\b0\.000", t) for t in backward), backward
    # The icicle draws the backward phase too (its values placed on the tree by path).
    page.select_option("#cbsite-phase", "backward")
    page.wait_for_timeout(200)
    assert page.locator("#cbsite-icicle g.cbsite-node").count() > 5
    # A collapsed section opens, and its charts draw at full width.
    page.click("details#contributors > summary")
    page.wait_for_selector("details#contributors .cbsite-chart svg", timeout=15000)
    page.wait_for_timeout(300)
    assert page.evaluate("document.querySelector('details#contributors .cbsite-chart svg').getBoundingClientRect().width") > 300
    assert page.errors == []
    return height


PHONE = {"width": 390, "height": 844}  # the phone viewport of the 390 px tests (the `phone` fixture)
