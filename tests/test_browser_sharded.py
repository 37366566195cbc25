"""A sharded run's page in a real headless browser (Debian's chromium under playwright), on the committed
dlrm-sharded runs: the rank selector switches the table and the icicle to one rank's rows, communication
components are drawn in their own colour with a legend entry, and the page logs no console error."""

from __future__ import annotations

import shutil

import pytest

from cbsite.generator import build_site
from tests.test_browser_site import CHROMIUM, Server, _outside, launched_browser, recording_page
from tests.test_site_sharded import RUNS

COMMUNICATION = "#c2185b"  # runpage.js KIND
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make browser)"),
    pytest.mark.skipif(not (RUNS / "row-wise").is_dir(), reason="the committed sharded runs are absent"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("sharded-browser")
    shutil.copytree(RUNS, base / "runs" / "dlrm-sharded")
    built = build_site(base / "runs", base / "site", quiet=True)
    server = Server(built)
    yield server, built
    server.close()


def _rows(page):
    """(path, rank, fwd latency text) of the table rows shown."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-table tbody tr')).map(tr => {
        const cells = Array.from(tr.children), head = Array.from(document.querySelectorAll('#cbsite-table thead th'))
          .map(th => th.textContent.replace(/[\\u25b2\\u25bc\\u2195]/g, '').trim());
        const at = name => cells[head.indexOf(name)] ? cells[head.indexOf(name)].textContent : null;
        return [window.cbsiteRun.data.path[+tr.dataset.index], at('rank'), at('fwd latency'), at('kind')]; })""")


def test_rank_selector_and_communication_colour(site):
    server, built = site
    run_dir = next((built / "runs" / "dlrm-sharded" / "row-wise").iterdir())
    with launched_browser() as browser, recording_page(browser, {"width": 1400, "height": 900}) as page:
        page.goto(f"{server.url}runs/dlrm-sharded/row-wise/{run_dir.name}/")
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        # Communication nodes in their own colour, the default colouring, with a legend entry.
        assert page.eval_on_selector("#cbsite-colour", "s => s.value") == "kind"
        fills = page.evaluate("""() => { const d = window.cbsiteRun.data, out = {};
            document.querySelectorAll('#cbsite-icicle g.cbsite-node:not(.self):not(.ancestor)').forEach(g => {
              const i = +g.dataset.index, r = g.querySelector('rect');
              if (r && d.forward.kind[i]) (out[d.forward.kind[i]] = out[d.forward.kind[i]] || new Set()).add(r.getAttribute('fill')); });
            return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Array.from(v)])); }""")
        assert fills["communication"] == [COMMUNICATION]
        assert COMMUNICATION not in fills["compute"]
        legend = page.inner_text("#cbsite-legend")
        assert "communication" in legend and "compute" in legend
        swatch = page.eval_on_selector("#cbsite-legend .cbsite-legend-communication .cbsite-swatch",
                                       "e => getComputedStyle(e).backgroundColor")
        assert swatch == "rgb(194, 24, 91)"
        # The table marks the kind and shows the traffic of a communicating component.
        page.locator("#cbsite-icicle g.cbsite-node[data-index='0']").first.hover()
        tip = page.locator(".cbsite-tip").inner_text()
        assert "bytes sent" in tip and "collectives" in tip and "c10d::" in tip
        assert page.locator("#cbsite-table span.cbsite-kind.kind-communication").count() >= 5
        assert "c10d::_reduce_scatter_base_" in page.inner_text("#cbsite-table")

        everyone = _rows(page)
        ranks_all = {r[1] for r in everyone if r[1] not in ("\u2013", None)}
        assert ranks_all == {"0", "1"}  # the slowest rank differs between components
        for rank in ("0", "1"):
            page.select_option("#cbsite-rank", rank)
            assert page.get_attribute("#cbsite-run", "data-rank") == rank
            shown = _rows(page)
            assert {r[1] for r in shown if r[1] not in ("\u2013", None)} == {rank}
            assert [r[2] for r in shown] != [r[2] for r in everyone]  # another rank's latencies
            assert page.evaluate("window.cbsiteRun.data.forward.rank.every(r => r === null || r === %s)" % rank)
        page.select_option("#cbsite-rank", "all")
        assert _rows(page) == everyone
        page.select_option("#cbsite-phase", "backward")
        page.select_option("#cbsite-rank", "1")
        page.screenshot(path=str(built.parent / "sharded-run-page.png"), full_page=False)
        assert page.errors == []
        assert _outside(page.requests, {server.port}) == []
