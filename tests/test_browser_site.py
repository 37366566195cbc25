"""The built site in a real headless browser (Debian's chromium driven by playwright), served over HTTP on
127.0.0.1: pages render with no console errors and no request leaving localhost, the icicle zooms, the table
sorts, search finds a component, the version selector lists published versions, and "Open in Perfetto"
hands the trace to a stub Perfetto UI on another local port after the PING/PONG handshake."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest

from cbsite.generator import build_site, publish_site
from tests.helpers.browser import Server, check_short_lazy_diff_page, outside, recording_page, served, served_html
from tests.helpers.site_archives import synthetic_run, write_golden_archive

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)

# A stand-in for the Perfetto UI: answers PING with PONG and keeps what it receives.
STUB = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>stub perfetto</title></head><body><script>
window.pings = 0; window.received = null;
window.addEventListener("message", function (e) {
  if (e.data === "PING") { window.pings++; e.source.postMessage("PONG", e.origin); return; }
  if (e.data && e.data.perfetto) {
    var p = e.data.perfetto;
    var b = new Uint8Array(p.buffer);
    window.received = { title: p.title, fileName: p.fileName, size: b.byteLength, magic: [b[0], b[1]], origin: e.origin };
  }
});
</script></body></html>"""


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    with served_html(tmp_path_factory.mktemp("stub"), STUB) as server:
        yield server


@pytest.fixture(scope="module")
def site(tmp_path_factory, stub):
    base = tmp_path_factory.mktemp("browser")
    runs = base / "runs"
    write_golden_archive(runs)
    synthetic_run(runs, "toy", "v1", n=60, seed=11, trace_every=5, ops=True)
    synthetic_run(runs, "toy", "v2", n=64, seed=12, minutes=5, scale=1.3, trace_every=5)
    built = build_site(runs, base / "site", perfetto_origin=stub.url.rstrip("/"), quiet=True)
    server = Server(built)
    yield server, built, runs
    server.close()


VIEWPORT = {"width": 1300, "height": 900}  # the page fixture's (tests/conftest.py)


def _run_url(server, built, model="toy", version="v1") -> str:
    run_dir = next((built / "runs" / model / version).iterdir())
    return f"{server.url}runs/{model}/{version}/{run_dir.name}/"


def test_run_page_icicle_zoom_and_table_sort(site, page):
    server, built, _ = site
    page.goto(_run_url(server, built))
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
    nodes = page.locator("#cbsite-icicle g.cbsite-node:not(.self)")
    assert nodes.count() > 10
    assert page.locator("#cbsite-icicle g.status-failed").count() >= 1  # failed nodes are marked
    assert page.locator("#cbsite-icicle g.status-estimated").count() >= 1

    # Zoom: click the widest child of the root; it becomes the top of the drawing below an ancestor bar.
    first_child = page.evaluate("""() => {
        const d = window.cbsiteRun.data, ic = window.cbsiteRun.icicle, L = ic.layout;
        let best = -1, w = -1;
        for (let i = 1; i < d.parent.length; i++) if (d.parent[i] === 0 && d.parent.indexOf(i) >= 0) {
            const width = L.x1[i] - L.x0[i]; if (width > w) { w = width; best = i; } }
        return best; }""")
    assert first_child > 0
    page.locator(f"#cbsite-icicle g.cbsite-node[data-index='{first_child}']").first.click()
    assert page.evaluate("window.cbsiteRun.icicle.zoom") == first_child
    assert page.locator("#cbsite-icicle g.ancestor").count() == 1
    assert page.locator("#cbsite-icicle g.zoom-root").get_attribute("data-index") == str(first_child)
    page.locator("#cbsite-icicle g.ancestor").click()  # back out
    assert page.evaluate("window.cbsiteRun.icicle.zoom") == 0

    # Tooltip on hover.
    page.locator(f"#cbsite-icicle g.cbsite-node[data-index='{first_child}']").first.hover()
    assert "latency per forward" in page.locator(".cbsite-tip").inner_text()

    # Sort by forward latency, descending: the root (the whole model) comes first, then values fall.
    header = page.locator("#cbsite-table th", has_text="fwd latency")
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    values = page.evaluate("""() => {
        const d = window.cbsiteRun.data;
        return Array.from(document.querySelectorAll('#cbsite-table tbody tr')).map(tr => {
            const i = +tr.dataset.index, v = d.forward.latency_ms[i];
            return v === null ? null : v * Math.max(d.call_count[i], 1); }); }""")
    known = [v for v in values if v is not None]
    assert known == sorted(known, reverse=True) and values.index(known[0]) == 0
    header.click()
    assert header.get_attribute("aria-sort") == "ascending"

    # Filter by path text and depth.
    page.fill("#cbsite-table input.cbsite-filter", "block")
    shown = page.locator("#cbsite-table tbody tr td.path").all_inner_texts()
    assert shown and all("block" in s for s in shown)
    page.fill("#cbsite-table input.cbsite-filter", "")
    page.select_option("#cbsite-table select.cbsite-depth", "1")
    depths = page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-table tbody tr')).map(
        tr => window.cbsiteRun.data.depth[+tr.dataset.index])""")
    assert set(depths) <= {0, 1} and 1 in depths

    # Width and colour metrics are selectable and redraw without errors.
    page.select_option("#cbsite-width", "flops")
    page.select_option("#cbsite-colour", "bandwidth_util")
    page.select_option("#cbsite-phase", "backward")
    assert "bandwidth utilisation" in page.inner_text("#cbsite-legend")
    assert page.errors == []
    assert outside(page.requests, {server.port}) == []
    page.screenshot(path=str(built.parent / "run-page.png"), full_page=False)


def test_model_diff_and_home_pages_render_offline(site, page):
    server, built, _ = site
    for path, ready in (("models/toy/", ".cbsite-chart svg"), ("diffs/toy/v1/v2/", "#cbsite-diff[data-ready='1']"),
                        ("", "#cbsite-home")):
        page.goto(server.url + path)
        page.wait_for_selector(ready, timeout=20000, state="attached" if path.startswith("diffs/") else "visible")
    page.goto(server.url + "diffs/dlrm/v1/v2/")
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    # The diff page's charts are inside a collapsed section: drawn when it is opened (charts.js).
    page.click("#contributors > summary")
    page.wait_for_selector("#contributors .cbsite-chart svg", timeout=20000)
    assert page.locator("#cbsite-difftable tbody tr").count() > 5
    assert page.locator("#cbsite-icicle g.cbsite-node").count() > 5
    assert page.errors == []
    assert outside(page.requests, {server.port}) == []


def test_search_finds_a_path_segment(site, page):
    server, built, _ = site
    page.goto(server.url)
    page.click(".md-search__input")
    page.keyboard.type("t_cat_0")  # Material searches on key events; fill() would not trigger it
    page.wait_for_selector(".md-search-result__item", timeout=15000)
    assert "dlrm" in page.inner_text(".md-search-result__list")
    assert page.errors == []
    assert outside(page.requests, {server.port}) == []


def test_open_in_perfetto_posts_the_trace_after_the_handshake(site, page, stub):
    server, built, _ = site
    page.goto(_run_url(server, built))
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
    page.select_option("#cbsite-table select.cbsite-depth", "")
    button = page.locator("button.cbsite-perfetto").first
    trace = button.get_attribute("data-trace")
    with page.context.expect_page() as popup_info:
        button.click()
    popup = popup_info.value
    popup.wait_for_function("window.received !== null", timeout=15000)
    got = popup.evaluate("window.received")
    size = (built / urlparse(page.url).path.lstrip("/") / trace).stat().st_size
    assert got["size"] == size and got["magic"] == [0x1F, 0x8B]  # the gzipped trace, as served
    assert got["fileName"] == Path(trace).name and "toy v1" in got["title"]
    assert got["origin"] == server.url.rstrip("/")
    assert popup.evaluate("window.pings") >= 1
    assert popup.url.startswith(stub.url)
    assert page.errors == []


@pytest.fixture(scope="module")
def published(site, tmp_path_factory) -> Path:
    """The archive published twice in mike's layout: 1.0 without the toy v2 run, then 2.0 (the whole archive) as
    the default, aliased latest. The version tests only read it."""
    _, _, runs = site
    base = tmp_path_factory.mktemp("published")
    older = base / "older"
    shutil.copytree(runs, older)
    shutil.rmtree(older / "toy" / "v2")  # version 1.0 of the site has no toy v2 run
    out = base / "published"
    publish_site(older, out, "1.0", quiet=True)
    publish_site(runs, out, "2.0", aliases=["latest"], set_default=True, quiet=True)
    return out


def test_version_selector_lists_published_versions_and_their_aliases(published, browser):
    out = published
    with served(out) as server, recording_page(browser, VIEWPORT) as pg:
        pg.goto(server.url)  # the root redirects to the default alias
        pg.wait_for_url("**/latest/", timeout=10000)
        pg.wait_for_selector(".md-version__list .md-version__item", state="attached", timeout=10000)
        items = [t.strip() for t in pg.locator(".md-version__list .md-version__link").all_text_contents()]
        assert any("1.0" in i for i in items) and any("2.0" in i for i in items)
        assert any("2.0" in i and "latest" in i for i in items)  # the alias beside its version
        assert outside(pg.requests, {server.port}) == []


def _switch_version(pg, version: str) -> None:
    """Pick `version` in Material's version selector (its list opens on hover)."""
    pg.wait_for_selector(".md-version__list .md-version__item", state="attached", timeout=10000)
    pg.hover(".md-version")
    pg.locator(".md-version__link", has_text=version).first.click()


def test_version_switch_from_a_run_page_keeps_the_page(published, browser):
    """From a run page, another version in the selector opened that version's home (its
    sitemap listed no page, so Material's selector could not find the same page). Now it opens the same run
    page in that version, and that version's home where it has no such page."""
    out = published
    v2 = out / "2.0"
    assert "<loc>" in (out / "1.0" / "sitemap.xml").read_text()
    with served(out) as server, recording_page(browser, VIEWPORT) as pg:
        kept = f"runs/toy/v1/{next((v2 / 'runs' / 'toy' / 'v1').iterdir()).name}/"
        assert (out / "1.0" / kept / "index.html").is_file()
        pg.goto(server.url + "2.0/" + kept)
        _switch_version(pg, "1.0")
        pg.wait_for_url(server.url + "1.0/" + kept, timeout=10000)
        pg.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        # From the alias too, and back: the same page in 2.0.
        pg.goto(server.url + "latest/" + kept)
        _switch_version(pg, "1.0")
        pg.wait_for_url(server.url + "1.0/" + kept, timeout=10000)
        _switch_version(pg, "2.0")
        pg.wait_for_url(server.url + "2.0/" + kept, timeout=10000)
        # A page the other version does not have: that version's home.
        gone = f"runs/toy/v2/{next((v2 / 'runs' / 'toy' / 'v2').iterdir()).name}/"
        pg.goto(server.url + "2.0/" + gone)
        _switch_version(pg, "1.0")
        pg.wait_for_url(server.url + "1.0/", timeout=10000)
        assert outside(pg.requests, {server.port}) == []


def test_diff_page_opens_short_loads_the_other_phase_when_asked_and_prints_short_deltas(site, browser):
    server, _, _ = site
    with recording_page(browser, {"width": 1400, "height": 1000}) as page:
        check_short_lazy_diff_page(page, server.url, "diffs/dlrm/v1/v2/")
        assert outside(page.requests, {server.port}) == []
