"""A sharded run's page in a real headless browser (Debian's chromium under playwright), on the committed
dlrm-sharded runs: the rank selector switches the table, the icicle, the Totals and the details panel to one rank's
rows, communication components are drawn in their own colour with a legend entry, and the page logs no console
error."""

from __future__ import annotations

import pytest

from tests.helpers.browser import launched_browser, outside, recording_page

COMMUNICATION = "#c2185b"  # runpage.js KIND
pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)


@pytest.fixture(scope="module")
def site(committed_site):
    """The demo archive's site: the dlrm-sharded pages are those of an archive holding only them."""
    return committed_site


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
        # (The kind and the collectives' traffic are the table's communication columns, behind its column choice.)
        page.select_option("#cbsite-table select.cbsite-table-group", "communication")
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
        assert outside(page.requests, {server.port}) == []


TOTALS = """() => Object.fromEntries(Array.from(document.querySelectorAll('#cbsite-totals tbody tr')).map(tr =>
    [tr.children[0].textContent, Array.from(tr.children).map(td => td.textContent)]))"""
DETAILS = """() => Object.fromEntries(Array.from(document.querySelectorAll('#cbsite-details table.cbsite-details tr')).slice(1)
    .map(tr => [tr.children[0].textContent, Array.from(tr.children).slice(1).map(td => td.textContent)]))"""


def test_rank_selector_also_switches_totals_and_details(demo_runs, site):
    """Choosing a rank shows that rank everywhere: the Totals are its root row, and the details panel of the open
    component shows that rank's row (its rank, latency, peak memory); back on all ranks, the page is as it was."""
    from cbsite import archive
    from cbsite.format import fmt_bytes, fmt_flops, fmt_ms

    server, built = site
    run_dir = next((built / "runs" / "dlrm-sharded" / "row-wise").iterdir())
    ranks = archive.read_run(demo_runs / "dlrm-sharded" / "row-wise" / run_dir.name).ranks
    rows = {(r["rank"], r["phase"], r["path"]): r for r in ranks.iter_rows(named=True)}
    # A component whose forward latency differs between the ranks, as the page shows it.
    path = next(p for (rk, ph, p) in rows if rk == 0 and ph == "forward" and p and rows[(0, ph, p)]["latency_ms"] is not None
                and fmt_ms(rows[(0, ph, p)]["latency_ms"]) != fmt_ms(rows[(1, ph, p)]["latency_ms"]))
    with launched_browser() as browser, recording_page(browser, {"width": 1400, "height": 1000}) as page:
        page.goto(f"{server.url}runs/dlrm-sharded/row-wise/{run_dir.name}/#component={path}")
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
        assert page.inner_text("#cbsite-details h3") == path
        everyone, details_all = page.evaluate(TOTALS), page.evaluate(DETAILS)
        phases, seen = page.evaluate("window.cbsiteRun.data.phases"), {}
        for rank in (0, 1):
            page.select_option("#cbsite-rank", str(rank))
            assert page.inner_text("#cbsite-totals-rank") == f" \u00b7 rank {rank}"
            totals = seen[rank] = page.evaluate(TOTALS)
            for phase in ("forward", "backward"):
                root = rows[(rank, phase, "")]
                cells = totals[phase]
                assert cells[1] == fmt_ms(root["latency_ms"] * max(root["call_count"] or 1, 1))
                assert cells[2] == f"{fmt_ms(root['latency_p25_ms'])} \u2013 {fmt_ms(root['latency_p75_ms'])}"
                assert cells[3] == fmt_flops(root["flops"]) and cells[9] == fmt_bytes(root["peak_memory_bytes"])
                assert cells[10] == root["status"]
            # The details panel: the same component, this rank's row.
            assert page.inner_text("#cbsite-details h3") == path
            shown = page.evaluate(DETAILS)
            assert shown["rank"] == [str(rank)] * len(phases)
            assert shown["latency (median, per call)"] == [fmt_ms(rows[(rank, ph, path)]["latency_ms"]) for ph in phases]
        assert seen[0] != everyone and seen[0] != seen[1]  # rank 1 is the slowest: rank 0's totals are its own ...
        page.select_option("#cbsite-rank", "all")
        assert page.evaluate(TOTALS) == everyone and page.evaluate(DETAILS) == details_all  # ... and back
        assert page.inner_text("#cbsite-totals-rank") == ""
        assert page.errors == []
