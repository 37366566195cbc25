"""A sharded run's page in a real headless browser (Debian's chromium under playwright), on the committed
dlrm-sharded runs: the rank selector switches the table, the icicle, the Totals and the details panel to one rank's
rows, communication components are drawn in their own colour with a legend entry, and the page logs no console
error."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest

from tests.helpers.browser import outside, recording_page

COMMUNICATION = "#c2185b"  # rundata.js KIND
pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)


@contextlib.contextmanager
def _run_page(browser, address: str) -> Iterator[Any]:
    """A fresh page of the session's chromium at 1400 x 1000 on the run page at `address`, once its data are drawn."""
    with recording_page(browser, {"width": 1400, "height": 1000}) as page:
        page.goto(address)
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        yield page


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


def test_rank_selector_and_communication_colour(site, browser, tmp_path):
    server, built = site
    run_dir = next((built / "runs" / "dlrm-sharded" / "row-wise").iterdir())
    with recording_page(browser, {"width": 1400, "height": 900}) as page:
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
        tip = page.locator(".cbsite-tip:not([hidden])").inner_text()  # the icicle's (the roofline has its own)
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
        page.screenshot(path=str(tmp_path / "sharded-run-page.png"), full_page=False)  # the shared site is read-only
        assert page.errors == []
        assert outside(page.requests, {server.port}) == []


TOTALS = """() => Object.fromEntries(Array.from(document.querySelectorAll('#cbsite-totals tbody tr')).map(tr =>
    [tr.children[0].textContent, Array.from(tr.children).map(td => td.textContent)]))"""
DETAILS = """() => Object.fromEntries(Array.from(document.querySelectorAll('#cbsite-details table.cbsite-details tr')).slice(1)
    .map(tr => [tr.children[0].textContent, Array.from(tr.children).slice(1).map(td => td.textContent)]))"""


def test_rank_selector_also_switches_totals_and_details(demo_runs, site, browser):
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
    with recording_page(browser, {"width": 1400, "height": 1000}) as page:
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


# "Where the time goes" as a person reads it: per list its title, bound mix and items (text, path, badge, visible).
LISTS = """() => Array.from(document.querySelectorAll('#cbsite-run .cbsite-fact')).map(f => ({
    title: f.querySelector('h3').innerText,
    mix: f.querySelector('.cbsite-boundmix') ? f.querySelector('.cbsite-boundmix').innerText : null,
    items: Array.from(f.querySelectorAll('ol.cbsite-hot > li')).map(li => ({ text: li.innerText.trim(),
      path: li.querySelector('code').innerText, bound: li.querySelector('.cbsite-bound') ? li.querySelector('.cbsite-bound').innerText : null,
      visible: li.getClientRects().length > 0 && getComputedStyle(li).visibility === 'visible' })) }))"""


def _row_wise(built):
    run_dir = next((built / "runs" / "dlrm-sharded" / "row-wise").iterdir())
    return f"runs/dlrm-sharded/row-wise/{run_dir.name}/", run_dir.name


def _slowest_leaf(ranks, rank: int, phase: str):
    """(path, latency per forward, share of the rank's whole model) of a rank's slowest leaf, from ranks.parquet."""
    rows = [r for r in ranks.iter_rows(named=True) if r["rank"] == rank and r["phase"] == phase]
    root = next(r for r in rows if r["path"] == "")
    per = lambda r: r["latency_ms"] * max(r["call_count"] or 1, 1)  # noqa: E731
    leaf = max((r for r in rows if r["is_leaf"] and r["latency_ms"] is not None), key=per)
    return leaf["path"], per(leaf), per(leaf) / per(root), leaf["module_type"].split(".")[-1]


def test_rank_switch_changes_the_lists(demo_runs, site, browser):
    """The lists of "Where the time goes" follow the rank selector: on one rank they are that rank's slowest
    components and bound mix (its numbers, in the markup the page shows for all ranks), and back on all ranks they are
    as they were. Communication stages are badged "communication" in every view, compute components with a bound."""
    from cbsite import archive
    from cbsite.format import fmt_ms, fmt_pct

    server, built = site
    url, run_id = _row_wise(built)
    run = archive.read_run(demo_runs / "dlrm-sharded" / "row-wise" / run_id)
    ranks = run.ranks
    with _run_page(browser, server.url + url) as page:
        kinds = page.evaluate("(() => { const d = window.cbsiteRun.data; return Object.fromEntries(d.path.map((p, i) => "
                              "[p || d.model, d.forward.kind[i]])); })()")
        everyone = page.evaluate(LISTS)
        seen = {}
        for rank in (0, 1):
            page.select_option("#cbsite-rank", str(rank))
            lists = seen[rank] = page.evaluate(LISTS)
            assert lists != everyone
            forward = next(f for f in lists if f["title"] == "Slowest components (forward)")
            path, ms, share, module_type = _slowest_leaf(ranks, rank, "forward")
            first = forward["items"][0]
            assert first["visible"] and first["path"] == path
            assert first["text"] == f"{path} {fmt_ms(ms)} ({fmt_pct(share)}) communication {module_type}"
            assert "communication" in forward["mix"] and forward["mix"].startswith("Leaf time (")
            # The key facts line above the icicle: the whole model's latency on this rank.
            root = next(r for r in ranks.iter_rows(named=True) if r["rank"] == rank and r["phase"] == "forward" and r["path"] == "")
            assert page.inner_text(".cbsite-keytotal[data-phase='forward']") == fmt_ms(root["latency_ms"] * max(root["call_count"] or 1, 1))
        assert seen[0] != seen[1]  # each rank its own numbers
        page.select_option("#cbsite-rank", "all")
        assert page.evaluate(LISTS) == everyone
        slowest = next(r for r in run.rows.iter_rows(named=True) if r["phase"] == "forward" and r["path"] == "")
        assert page.inner_text(".cbsite-keytotal[data-phase='forward']") == fmt_ms(slowest["latency_ms"])  # the slowest rank's
        # One taxonomy: in every view, a communicating component is badged "communication", a computing one never is.
        for lists in (everyone, seen[0], seen[1]):
            for item in (i for f in lists for i in f["items"] if i["bound"]):
                assert (item["bound"] == "communication") == (kinds[item["path"]] == "communication"), item
            assert any(i["bound"] == "communication" for f in lists for i in f["items"])
            assert any(i["bound"] in ("compute", "memory") for f in lists for i in f["items"])
        # The table's "bound by" column and the icicle's bound colouring say the same.
        page.select_option("#cbsite-colour", "bound")
        fills = page.evaluate("""() => { const d = window.cbsiteRun.data, out = {};
            document.querySelectorAll('#cbsite-icicle g.cbsite-node:not(.self):not(.ancestor)').forEach(g => {
              const i = +g.dataset.index, r = g.querySelector('rect');
              if (d.forward.kind[i]) (out[d.forward.kind[i]] = out[d.forward.kind[i]] || new Set()).add(r.getAttribute('fill')); });
            return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Array.from(v)])); }""")
        assert fills["communication"] == [COMMUNICATION] and COMMUNICATION not in fills["compute"]
        assert "communication" in page.inner_text("#cbsite-legend")
        badges = page.evaluate("""() => { const d = window.cbsiteRun.data, head = Array.from(document.querySelectorAll('#cbsite-table thead th'))
            .map(th => th.textContent.replace(/[\\u25b2\\u25bc\\u2195]/g, '').trim()), at = head.indexOf('bound by');
            return Array.from(document.querySelectorAll('#cbsite-table tbody tr')).map(tr =>
              [d.forward.kind[+tr.dataset.index], tr.children[at].textContent]); }""")
        # The table's badge is short ("comm.", the word whole in its title) so that its rows stay one line.
        assert badges and all((b == "comm.") == (k == "communication") for k, b in badges), badges
        assert page.errors == []


def test_child_above_its_parent_is_explained_in_words(site, browser):
    """In the all-ranks view sparse_arch shows more time than the whole model (each row is its own slowest rank):
    a visible line under the icicle and one under the Totals say so, with each row's rank; in one rank's view they
    go, and in the backward phase the line under the icicle names the backward pairs."""
    server, built = site
    url, _ = _row_wise(built)
    with _run_page(browser, server.url + url) as page:
        d = page.evaluate("""(() => { const d = window.cbsiteRun.data, i = d.path.indexOf('sparse_arch');
            return { rank: d.forward.rank[i], root_rank: d.forward.rank[0], ms: d.forward.latency_ms[i], root_ms: d.forward.latency_ms[0] }; })()""")
        assert d["rank"] != d["root_rank"] and d["ms"] > d["root_ms"]
        from cbsite.format import fmt_ms

        note = page.locator("#cbsite-rank-note")
        assert note.is_visible()
        text = note.inner_text()
        assert text.startswith("In the all-ranks view each row is its own slowest rank")
        assert (f"sparse_arch {fmt_ms(d['ms'])} on rank {d['rank']} under dlrm-sharded (root) {fmt_ms(d['root_ms'])} "
                f"on rank {d['root_rank']}") in text
        totals = page.locator("#cbsite-totals-note")
        totals.scroll_into_view_if_needed()
        assert totals.is_visible()
        assert (f"sparse_arch {fmt_ms(d['ms'])} on rank {d['rank']}" in totals.inner_text()
                and f"above the whole model's {fmt_ms(d['root_ms'])} on rank {d['root_rank']}" in totals.inner_text())
        page.select_option("#cbsite-phase", "backward")
        assert "(backward)" in note.inner_text() or note.is_hidden()
        page.select_option("#cbsite-rank", "0")
        assert note.is_hidden() and totals.is_hidden()
        page.select_option("#cbsite-rank", "all")
        assert totals.is_visible()
        assert page.errors == []


def test_rank_phase_and_zoom_are_in_the_address(site, browser):
    """`#rank=`, `#phase=` and `#zoom=` open the page in that state (with `#component=` too), and changing them
    writes them into the address without a scroll or a history entry."""
    server, built = site
    url, _ = _row_wise(built)
    zoom = "sparse_arch.embedding_bag_collection"
    with recording_page(browser, {"width": 1400, "height": 1000}) as page:
        page.goto(server.url + url + f"#rank=1&phase=backward&zoom={zoom}")
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        assert page.eval_on_selector("#cbsite-rank", "s => s.value") == "1"
        assert page.get_attribute("#cbsite-run", "data-rank") == "1"
        assert page.eval_on_selector("#cbsite-phase", "s => s.value") == "backward"
        assert page.evaluate("window.cbsiteRun.data.path[window.cbsiteRun.icicle.zoom]") == zoom
        assert page.locator("#cbsite-zoom").is_visible() and zoom in page.inner_text("#cbsite-zoom")
        assert page.locator("#cbsite-totals-rank").inner_text() == " \u00b7 rank 1"
        # The icicle draws rank 1's backward rows: the zoomed node's width is its rank-1 backward latency.
        assert page.evaluate("""(() => { const d = window.cbsiteRun.data, i = d.path.indexOf('%s');
            return d.backward.rank[i] === 1 && d.backward.latency_ms[i] === d.sharded.views['1'].backward.latency_ms[i]; })()""" % zoom)
        # Changes are written back, keeping the rest; no scroll, no new history entry.
        length, y = page.evaluate("history.length"), page.evaluate("window.scrollY")
        page.select_option("#cbsite-rank", "0")
        assert page.evaluate("location.hash") == f"#rank=0&phase=backward&zoom={zoom}"
        page.select_option("#cbsite-phase", "forward")
        assert page.evaluate("location.hash") == f"#rank=0&zoom={zoom}"
        page.click("#cbsite-reset")
        assert page.evaluate("location.hash") == "#rank=0"
        assert page.evaluate("history.length") == length and page.evaluate("window.scrollY") == y
        # With a component: its details on the rank asked for, and the rank kept when a list link is followed.
        page.goto(server.url + url + "#component=over_arch&rank=0")
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=15000)
        page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
        assert page.inner_text("#cbsite-details h3") == "over_arch"
        assert page.eval_on_selector("#cbsite-rank", "s => s.value") == "0"
        shown = page.evaluate(DETAILS)
        assert set(shown["rank"]) == {"0"}
        page.locator("#cbsite-run .cbsite-fact ol.cbsite-hot a").first.click()
        page.wait_for_function("location.hash.includes('rank=0')", timeout=5000)
        assert page.eval_on_selector("#cbsite-rank", "s => s.value") == "0"
        assert page.evaluate("location.hash").startswith("#component=")
        assert page.errors == []


def test_labels_name_the_phase_quantity(site, browser):
    """In the backward phase the width and colour choices, the legend and the tooltip say "backward latency per
    forward of the model", never a bare "latency per forward" that reads as the forward's."""
    server, built = site
    url, _ = _row_wise(built)
    with _run_page(browser, server.url + url) as page:
        for phase in ("forward", "backward"):
            page.select_option("#cbsite-phase", phase)
            words = f"{phase} latency per forward of the model"
            assert page.eval_on_selector("#cbsite-width", "s => s.selectedOptions[0].textContent") == words
            assert f"width: {words}" in page.inner_text("#cbsite-legend")
            page.locator("#cbsite-icicle g.cbsite-node[data-index='0']").first.hover()
            assert f"{words}:" in page.locator(".cbsite-tip:not([hidden])").inner_text()
            page.select_option("#cbsite-colour", "latency_ms")
            assert f"colour: {words}" in page.inner_text("#cbsite-legend")
            page.select_option("#cbsite-colour", "kind")
        assert page.errors == []


def _contrast(a, b) -> float:
    def lum(c):
        v = [x / 255 for x in c]
        v = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in v]
        return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]
    x, y = lum(a), lum(b)
    return (max(x, y) + 0.05) / (min(x, y) + 0.05)


def test_overflow_outline_contrasts_with_every_fill(site, browser):
    """The outline of a node whose children add up to more than it was orange, invisible on the orange of a
    memory-bound fill. Drawn on a node of every fill the colourings give (each bound, each kind, the ramps' ends, no
    value), in both schemes, the outline has a line that contrasts 3:1 or more with the fill, and the legend shows it."""
    server, built = site
    url, _ = _row_wise(built)
    with _run_page(browser, server.url + url) as page:
        for scheme in ("default", "slate"):
            page.evaluate(f"document.body.setAttribute('data-md-color-scheme', '{scheme}')")
            # One icicle per fill: a parent (the fill) whose two children add up to twice its value.
            drawn = page.evaluate("""() => { const I = window.CbsiteIcicle, dark = I.dark(), fills = ['#1f6fb4', '#d9730d', '#7f7f7f',
                '#7b3294', '#c2185b', I.fills().none].concat(...['green', 'purple'].map(r => { const s = (dark ? I.RAMPS_DARK : I.RAMPS)[r];
                return [s[0], s[s.length - 1]]; }));
              const box = document.createElement('div'); box.style.width = '600px'; document.body.appendChild(box);
              const out = fills.map(fill => { box.textContent = '';
                const ic = new I.Icicle(box, { parent: [-1, 0, 0], label: i => 'n' + i, status: () => 'measured', width: i => [1, 1, 1][i],
                  colour: i => i, colourKind: 'category', categories: { 0: fill, 1: '#888888', 2: '#888888' }, tooltip: () => [] });
                ic.render();
                const g = box.querySelector("g.cbsite-node.overflow[data-index='0']");
                const lines = Array.from(g.querySelectorAll('rect.overflow-line')).map(r => { const s = getComputedStyle(r);
                  return { stroke: s.stroke, width: parseFloat(s.strokeWidth), shown: s.visibility === 'visible' && s.display !== 'none' }; });
                return { fill: getComputedStyle(g.querySelector('rect')).fill, lines: lines }; });
              box.remove(); return out; }""")
            rgb = lambda s: tuple(int(x) for x in s[s.index("(") + 1:s.index(")")].split(",")[:3])  # noqa: E731
            assert len(drawn) == 10
            for d in drawn:
                assert len(d["lines"]) == 2 and all(ln["shown"] and ln["width"] >= 1 for ln in d["lines"]), d
                best = max(_contrast(rgb(ln["stroke"]), rgb(d["fill"])) for ln in d["lines"])
                assert best >= 3, (scheme, d)
            page.select_option("#cbsite-colour", "bound")
            legend = page.locator("#cbsite-legend .cbsite-swatch.overflow")
            assert legend.is_visible() and "black and white outline" in page.inner_text("#cbsite-legend")
        assert page.errors == []
