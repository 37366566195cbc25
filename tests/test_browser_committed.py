"""The demo archive (tests/data/runs) in Debian's chromium at 1400x1000, as the screenshots saw it: run
ids on one line on the home page, icicle labels that read as names ("embedding_bags…", never "t…0"), chart axes
without exponent notation ("1e+1"), and study pages whose point labels never break inside a word and whose
configuration is a key = value table, not raw JSON."""

from __future__ import annotations

import json
import math
import re
from urllib.parse import unquote

import polars as pl
import pytest

from cbsite import archive
from cbsite import gate as cgate
from tests.helpers.browser import draw_every
from tests.helpers.readability import CONTRASTS, LABELS, NUMBERS, check_labels, unreadable

VIEWPORT = {"width": 1400, "height": 1000}
pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
EXPONENT = re.compile(r"\de[+-]?\d", re.I)


@pytest.fixture(scope="module")
def site(committed_site):
    return committed_site


def _fits_the_page(page, table_selector: str) -> None:
    widths = page.evaluate("""(sel) => { const t = document.querySelector(sel), c = t.closest('.md-content__inner');
        return [t.getBoundingClientRect().right, c.getBoundingClientRect().right, document.documentElement.scrollWidth]; }""",
                           table_selector)
    assert widths[0] <= widths[1] + 0.5 and widths[2] <= VIEWPORT["width"]


# Every match of `pattern` in the text under `selector`: the text and the number of lines it is drawn on (the
# distinct tops of its boxes), as a person sees it, whatever element holds it.
LINES = """([selector, pattern]) => { const out = [], re = new RegExp(pattern, 'g');
  document.querySelectorAll(selector).forEach(root => {
    const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      for (const m of n.data.matchAll(re)) {
        const r = document.createRange(); r.setStart(n, m.index); r.setEnd(n, m.index + m[0].length);
        const tops = new Set(Array.from(r.getClientRects()).filter(b => b.width > 0).map(b => Math.round(b.top)));
        out.push([m[0], tops.size]);
      }
    }
  });
  return out; }"""
RUN_ID = r"\d{8}T\d{6}Z-[0-9a-f]{6}"


def test_home_page_run_ids_are_on_one_line_and_the_table_fits(demo_runs, site, page):
    server, _ = site
    page.goto(server.url)
    found = page.evaluate(LINES, ["table.cbsite-models", RUN_ID])
    assert len(found) == len([p for p in demo_runs.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))])
    assert [(t, n) for t, n in found if n != 1] == []  # once three lines: "20261130T145640Z-" / ...
    assert [(t, n) for t, n in page.evaluate(LINES, [".md-content", RUN_ID]) if n != 1] == []  # the lists too
    # Not clipped: every cell shows all of its text.
    assert page.evaluate("() => Array.from(document.querySelectorAll('table.cbsite-models td')).every(td => td.scrollWidth <= td.clientWidth + 1)")
    _fits_the_page(page, "table.cbsite-models")
    assert page.errors == []


def _words(text: str) -> set[str]:
    return {w.strip(",.;:()").lower() for w in text.split()} - {""}  # a clause begun on its own line is capitalised


def test_home_page_what_changed_is_a_table_that_keeps_every_fact(demo_runs, site, page):
    """What changed was one paragraph per model (some 900 characters each). Now it is a table:
    model, versions (the link to the diff), the largest changes one per line (latency changes first), then every
    other fact of the diff's summary one per line; every word of the summary but its title ("dlrm v2 vs v1") is in
    the model's row, the table fits the page and no line of it is a paragraph."""
    server, _ = site
    page.goto(server.url)
    rows = page.evaluate("""() => Array.from(document.querySelectorAll('table.cbsite-changes tbody tr')).map(tr => ({
        model: tr.cells[0].innerText, href: tr.cells[1].querySelector('a').getAttribute('href'), text: tr.innerText,
        largest: Array.from(tr.cells[2].querySelectorAll('li')).map(li => [li.innerText, li.getClientRects().length,
          Math.round(li.getBoundingClientRect().height / parseFloat(getComputedStyle(li).lineHeight))]),
        facts: Array.from(tr.cells[3].querySelectorAll('li')).map(li => li.innerText) }))""")
    assert {r["model"] for r in rows} >= {"dlrm", "dlrm-sharded"}, rows
    assert page.locator("#changes ~ ul.cbsite-changes").count() == 0  # the paragraphs are gone
    _fits_the_page(page, "table.cbsite-changes")
    for r in rows:
        assert r["largest"] and all(lines == 1 for _, _, lines in r["largest"]), r["largest"]  # one line each
        assert all(len(f) < 500 for f in r["facts"]), r["facts"]  # the longest: five paths that lack numbers
        page.goto(server.url + r["href"])
        summary = page.inner_text(".cbsite-diff-summary")
        title, _, rest = summary.partition(": ")
        assert _words(rest) - _words(r["text"]) == set(), (r["model"], _words(rest) - _words(r["text"]))
    dlrm = next(r for r in rows if r["model"] == "dlrm")
    largest = [t for t, *_ in dlrm["largest"]]
    # Latency changes first, each with the verdict of the comparison session that measured the pair (derived from
    # the runs, never pinned: a re-collection changes the figures); then the totals that moved most.
    latency = [t for t in largest if " latency (" in t]
    assert largest[:len(latency)] == latency
    changed = {p: v for p, v in _dlrm_verdicts(demo_runs).items() if v in ("regressed", "improved")}
    assert {t.split(" latency (")[0].split(" ")[-1]: t for t in latency}.keys() == changed.keys(), (latency, changed)
    for t in latency:
        assert t.endswith(f", {changed[t.split(' latency (')[0].split(' ')[-1]]})"), t
    assert "3.0\u00d7 backward FLOPs (+24.7 MFLOP)" in largest  # FLOPs are counted, not measured
    assert page.errors == []


def _dlrm_verdicts(runs) -> dict[str, str]:
    """phase -> the whole model's latency verdict of the dlrm v1 -> v2 comparison in the archive."""
    from cbsite import archive
    from cbsite.diff import comparison
    from cbsite.diff import rundiff as cdiff

    base, head = (archive.read_run(archive.resolve_run(f"dlrm@{v}", runs).path) for v in ("v1", "v2"))
    rd = cdiff.diff_runs(base, head)
    evidence = comparison.evidence_for(runs, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    return cgate.root_verdicts(evidence, rd) or {}


def test_icicle_labels_are_names_or_their_start(site, page):
    server, built = site
    run = next((built / "runs" / "dlrm" / "v2").iterdir())
    page.goto(f"{server.url}runs/dlrm/v2/{run.name}/")
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    labels = page.evaluate(LABELS)
    check_labels(labels)
    assert any(t == "embedding_bag_collection" for t, *_ in labels)
    # Narrower: the page at 800 px draws shortened labels, each still the start of its name.
    wide = page.evaluate("+document.querySelector('#cbsite-icicle svg').getAttribute('width')")
    page.set_viewport_size({"width": 800, "height": 1000})
    page.wait_for_function(f"+document.querySelector('#cbsite-icicle svg').getAttribute('width') < {wide} - 300", timeout=5000)
    narrow = page.evaluate(LABELS)
    check_labels(narrow)
    assert any(t.endswith("\u2026") for t, *_ in narrow)
    # Zoomed into the embedding tables, their names are whole.
    page.set_viewport_size(VIEWPORT)
    index = page.evaluate("window.cbsiteRun.data.path.indexOf('sparse_arch.embedding_bag_collection.embedding_bags')")
    page.evaluate(f"window.cbsiteRun.icicle.zoomTo({index})")
    zoomed = page.evaluate(LABELS)
    check_labels(zoomed)
    assert {"t_cat_0", "t_cat_7"} <= {t for t, *_ in zoomed}
    assert page.errors == []


def _axis_labels(page, selector: str) -> list[str]:
    page.wait_for_function(f"document.querySelectorAll('{selector} svg .role-axis-label text').length > 0", timeout=30000)
    page.wait_for_timeout(300)
    return page.locator(f"{selector} svg .role-axis-label text").all_text_contents()


def test_trend_axes_never_use_exponent_notation(demo_runs, site, page):
    server, _ = site
    page.goto(server.url + "models/dlrm/")
    n = page.locator("[data-cbsite-chart]").count()
    assert n >= 4
    page.wait_for_function(f"document.querySelectorAll('[data-cbsite-chart] svg').length >= {n}", timeout=30000)
    labels = _axis_labels(page, "[data-cbsite-chart]")
    # A latency axis that reaches 10 ms once read "1e+1"; the archive's dlrm runs say whether this one does.
    roots = [r for ref in archive.list_runs(demo_runs) if ref.model == "dlrm"
             for r in archive.read_run(ref.path).rows.filter(pl.col("path") == "").to_dicts()]
    if max(r["latency_ms"] or 0 for r in roots) >= 10:
        assert "10" in labels
    assert [t for t in labels if EXPONENT.search(t)] == []
    assert [t for t in labels if re.fullmatch(r"0[kMGT]", t)] == []  # zero is "0", not "0M"
    # The run ids and times of the versions table are on one line too.
    found = page.evaluate(LINES, ["table.cbsite-versions", RUN_ID + r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"])
    assert len(found) >= 4 and [(t, n) for t, n in found if n != 1] == []
    assert [(t, n) for t, n in page.evaluate(LINES, [".md-content", RUN_ID]) if n != 1] == []  # comparisons too
    assert page.errors == []


def test_study_page_labels_whole_words_and_configuration_as_key_values(demo_runs, site, page):
    server, _ = site
    page.goto(server.url + "studies/demo-dense-sparse/")
    # Point labels: one line each, never broken inside a word; a cut one ends in an ellipsis and says all in its title.
    labels = [p.name for p in (demo_runs / "demo-dense-sparse").iterdir() if not p.name.startswith(".")]
    found = page.evaluate(LINES, ["table.cbsite-study-points tbody", "|".join(re.escape(x) for x in sorted(labels, key=len, reverse=True))])
    assert sorted(t for t, _ in found) == sorted(labels)
    assert [(t, n) for t, n in found if n != 1] == []  # once "dense_featu" / "res-64.spar" / ...
    cells = page.evaluate("""() => Array.from(document.querySelectorAll('table.cbsite-study-points tbody tr')).map(tr => {
        const td = tr.children[0]; return [td.textContent, td.getAttribute('title'), td.scrollWidth <= td.clientWidth + 1,
          getComputedStyle(td).textOverflow]; })""")
    for text, title, whole, overflow in cells:
        assert title == text and (whole or overflow == "ellipsis")
    _fits_the_page(page, "table.cbsite-study-points")
    # The configuration: key = value rows, no JSON.
    config = page.locator("#configuration ~ ul.cbsite-study-config")
    assert config.count() == 1
    lines = config.locator("li").all_inner_texts()
    assert all(" = " in t and "\n" not in t.strip() for t in lines)  # one line each: key = value
    rows = dict(t.strip().split(" = ", 1) for t in lines)
    assert rows["grid.dense_features"] == "64, 512" and rows["grid.sparse_features"] == "4, 16"
    assert rows["provider"] == "dlrm-synthetic" and rows["settings.request.config.max_depth"] == "2"
    assert "points" not in rows and not any(k.startswith("points.") for k in rows)
    text = page.inner_text("#cbsite-study")
    assert '"grid"' not in text and "{" not in text and page.locator("#cbsite-study pre").count() == 0
    # Chart axes: no exponent notation, linear or log.
    draw_every(page, "[data-cbsite-study-chart]", "svg .mark-line")  # charts are drawn as they near the viewport
    labels = _axis_labels(page, "[data-cbsite-study-chart]")
    assert labels and [t for t in labels if EXPONENT.search(t)] == []
    page.check("#cbsite-study-log")
    draw_every(page, "[data-cbsite-study-chart]", "[data-cbsite-scale='log']")
    logs = _axis_labels(page, "[data-cbsite-study-chart]")
    assert [t for t in logs if EXPONENT.search(t)] == []
    assert page.errors == []


def _search(page, query: str) -> list[str]:
    """Type `query` into Material's search box; the pages of its results, best first (each page's first link)."""
    page.click(".md-search__input")
    page.keyboard.type(query)  # Material searches on key events; fill() would not trigger it
    page.wait_for_selector(".md-search-result__item", timeout=15000)
    page.wait_for_timeout(500)  # the worker answers the whole query after the first keys' results
    return page.evaluate("""() => Array.from(document.querySelectorAll('.md-search-result__list > .md-search-result__item'))
        .map(li => new URL(li.querySelector('a.md-search-result__link').getAttribute('href'), location.href).pathname)""")


def test_search_for_a_full_path_finds_a_run_that_has_it(site, page):
    """`over_arch.model.0._mlp.1._linear` listed nanogpt, then dlrm-sharded, then dlrm v1 (the
    query's "0" and "1" matched the start of run ids' tails in page titles). Now the path is one search term: the
    first result is a run page that has the component, and following it opens that component."""
    server, built = site
    target = "over_arch.model.0._mlp.1._linear"
    page.goto(server.url)
    found = _search(page, target)
    first = found[0]
    assert first.startswith("/runs/"), found
    model = first.split("/")[2]
    assert model not in ("nanogpt", "deepfm"), found
    assert target in json.loads((built / first.lstrip("/") / "components.json").read_text())["path"], found
    # Every run page listed has it (no page is found by a part of the path).
    runs = [p for p in found if p.startswith("/runs/")]
    assert all(target in json.loads((built / p.lstrip("/") / "components.json").read_text())["path"] for p in runs), found
    page.locator(".md-search-result__link").first.click()
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    assert page.inner_text("#cbsite-details h3") == target
    assert page.errors == []


@pytest.mark.parametrize("query", ["model.0._mlp", "_mlp.1", "0._mlp.1._linear"])
def test_search_for_a_middle_part_of_a_path_lands_on_a_component_that_has_it(site, page, query):
    """A middle part of `over_arch.model.0._mlp.1._linear` ("model.0._mlp", "_mlp.1") found nothing
    (search matches the start of a word, and a path is one word). Now every run page it lists has a component
    whose path holds the query; following the first result opens such a component, its row marked and in the
    viewport, the table listing the components that hold the query."""
    server, built = site
    page.goto(server.url)
    found = _search(page, query)
    runs = [p for p in found if p.startswith("/runs/")]
    assert runs and found[0] == runs[0], found

    def holds(p: str) -> bool:  # a component path of that run holds the query, starting after a dot
        return any(("." + c).find("." + query) >= 0 for c in json.loads((built / p.lstrip("/") / "components.json").read_text())["path"])

    assert all(holds(p) for p in runs), found
    page.locator(".md-search-result__link").first.click()
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    opened = page.inner_text("#cbsite-details h3")
    assert ("." + opened).find("." + query) >= 0 and opened.endswith(query), (query, opened)
    row = page.locator("#cbsite-table tr.cbsite-linked")
    assert row.count() == 1 and row.is_visible()
    box = row.bounding_box()
    assert box and 0 <= box["y"] and box["y"] + box["height"] <= VIEWPORT["height"]
    # Seen, not covered: the search box is closed on the page landed on (Material reopens it for a ?q= address)
    # and the row's own cells are what is drawn at its middle.
    page.wait_for_timeout(300)
    assert not page.evaluate("document.querySelector('[data-md-toggle=\"search\"]').checked")
    assert page.evaluate("""() => { const r = document.querySelector('#cbsite-table tr.cbsite-linked').getBoundingClientRect(),
        hit = document.elementFromPoint(r.left + 40, r.top + r.height / 2); return !!hit && !!hit.closest('tr.cbsite-linked'); }""")
    assert row.inner_text().split()[0] in opened  # the row shows the component's last segment
    assert page.input_value("#cbsite-table input.cbsite-filter") == query
    shown = page.evaluate("""() => { const d = window.cbsiteRun.data; return Array.from(document.querySelectorAll(
        '#cbsite-table tbody tr[data-index]')).map(tr => d.path[+tr.dataset.index]); }""")
    assert len(shown) >= 1 and all(query in p for p in shown), shown
    assert page.errors == []


def test_search_for_a_last_name_and_a_word(site, page):
    server, built = site
    page.goto(server.url)
    found = _search(page, "t_cat_0")  # a component's own name, the last part of its path
    assert found[0].startswith("/runs/") and found[0].split("/")[2] in ("dlrm", "dlrm-sharded", "deepfm"), found
    paths = json.loads((built / found[0].lstrip("/") / "components.json").read_text())["path"]
    assert any(p.rsplit(".", 1)[-1] == "t_cat_0" for p in paths)
    page.fill(".md-search__input", "")
    found = _search(page, "latency")  # a plain word
    assert len(found) >= 3 and found[0].startswith("/models/"), found
    assert page.errors == []


def _run_page(page, server, built, model: str) -> None:
    run = sorted((built / "runs" / model).glob("*/*"))[-1]
    page.goto(f"{server.url}{run.relative_to(built).as_posix()}/")
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)


TABLE = """() => { const w = document.querySelector('#cbsite-table .cbsite-table-wrap'), t = w.querySelector('table'),
    all = Array.from(t.querySelectorAll('thead th')).map(th => th.textContent),
    head = Array.from(t.querySelectorAll('thead th')).filter(th => th.getClientRects().length).map(th => th.textContent);
    return { width: t.scrollWidth, room: w.clientWidth, right: t.getBoundingClientRect().right,
      content: t.closest('.md-content__inner').getBoundingClientRect().right, head: head,
      size: Array.from(t.querySelectorAll('tbody tr')).map(tr => tr.children[all.indexOf('size')].innerText),
      paths: Array.from(t.querySelectorAll('tbody td.path')).map(td => { const a = td.querySelector('a'), r = a.getBoundingClientRect();
        return { shown: Array.from(a.children).filter(e => e.getBoundingClientRect().width > 2).map(e => e.textContent).join(''),
          text: td.innerText, title: a.title, lines: Math.round(r.height / parseFloat(getComputedStyle(a).lineHeight)),
          indent: parseFloat(getComputedStyle(td).paddingLeft), index: +td.parentElement.dataset.index }; }) }; }"""


@pytest.mark.parametrize("model", ["dlrm", "dlrm-sharded"])
def test_run_table_fits_with_sizes_in_bytes_and_last_segments(site, page, model):
    """Once, "size MB" read 0.000576; path cells repeated the whole path in grey over 2-3 lines; the sharded
    run's table was 1,940 px wide in a 1,368 px box. Now sizes read "576 B" / "20.5 MB" under "size", a path cell
    shows its last segment indented by depth (the full path in its title, and in its text for find-in-page), and
    the default table fits the content width: a sharded run's communication columns are behind a column choice."""

    server, built = site
    _run_page(page, server, built, model)
    page.select_option("#cbsite-table select.cbsite-depth", "")
    t = page.evaluate(TABLE)
    assert t["width"] <= t["room"] and t["right"] <= t["content"] + 0.5, t["width"]
    assert "size" in t["head"] and "size MB" not in t["head"]
    assert all(re.fullmatch(r"\d+(\.\d+)? [kMG]?B|\u2013", s) for s in t["size"]), t["size"]
    assert unreadable(page.evaluate(NUMBERS, "#cbsite-table")) == []  # 4 significant digits at most
    d = page.evaluate("(() => { const d = window.cbsiteRun.data; return [d.path, d.depth, d.model]; })()")
    for p in t["paths"]:
        path = d[0][p["index"]]
        if path == "":
            continue
        assert p["shown"] == path.rsplit(".", 1)[-1], p  # the last segment only is drawn
        assert p["title"] == path and p["text"].replace("\n", "") == path, p  # the full path: title, text
        assert p["lines"] == 1, p
    indents = {d[1][p["index"]]: p["indent"] for p in t["paths"]}
    assert all(indents[k] < indents[k + 1] for k in range(max(indents)) if k in indents and k + 1 in indents)
    page.fill("#cbsite-table input.cbsite-filter", "embedding_bags.t_cat")  # still found by its full path
    assert page.locator("#cbsite-table tbody tr").count() == 8
    if model == "dlrm-sharded":
        assert not any(h in t["head"] for h in ("sent", "received", "comm GB/s", "collectives"))
        page.select_option("#cbsite-table select.cbsite-table-group", "communication")
        page.fill("#cbsite-table input.cbsite-filter", "")
        t = page.evaluate(TABLE)
        assert {"kind", "sent", "received", "comm GB/s", "collectives"} <= set(t["head"])
        assert "MFU" not in t["head"] and t["width"] <= t["room"]
        assert "c10d::" in page.inner_text("#cbsite-table")
    assert page.errors == []


def test_icicle_tells_siblings_apart(site, page):
    """Once, the eight embedding tables of dlrm all read "t_ca\u2026" and nanogpt's four c_attn "c_at\u2026".
    Now siblings that share a start and do not fit whole are labelled by the suffix that tells them apart
    ("\u2026_0" ... "\u2026_7"), and a name is drawn in a smaller font (10 px at least) before it is cut."""
    server, built = site
    _run_page(page, server, built, "dlrm")
    labels = page.evaluate(LABELS)
    check_labels(labels)
    tables = sorted(t for t, name, *_ in labels if name.startswith("t_cat_"))
    assert len(tables) == 8 and len(set(tables)) == 8, tables  # eight labels, all different
    assert not any(t.startswith("t_ca\u2026") for t in tables)
    _run_page(page, server, built, "nanogpt")
    labels = page.evaluate(LABELS)
    check_labels(labels)
    assert not any(t.endswith("\u2026") and name == "c_attn" for t, name, *_ in labels), labels
    assert page.errors == []


def test_diff_icicle_has_no_white_boxes_in_dark_mode(site, page):
    """The diverging scale's centre (no change) was #f7f7f7: white boxes on the dark page. In the dark scheme it is
    a neutral grey, and the labels keep 4.5:1."""

    server, _ = site
    page.goto(server.url + "diffs/dlrm/v1/v2/")
    page.wait_for_selector("#cbsite-icicle g.cbsite-node", timeout=20000)
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
    page.wait_for_timeout(300)
    fills = page.evaluate("""() => { const probe = document.createElement('span'); document.body.appendChild(probe);
        const out = Array.from(document.querySelectorAll('#cbsite-icicle g.cbsite-node:not(.self):not(.ancestor) > rect:first-child'))
          .map(r => { probe.style.color = r.getAttribute('fill'); return getComputedStyle(probe).color.match(/\\d+/g).slice(0, 3).map(Number); });
        probe.remove(); return out; }""")
    assert len(fills) > 10
    assert [f for f in fills if min(f) > 200] == []  # no white or near-white box
    assert page.evaluate("window.CbsiteIcicle.scale([-1, 0, 1], 'diverging').colour(0)") == "rgb(110,110,110)"
    assert [c for c in page.evaluate(CONTRASTS) if c[1] < 4.5] == []
    assert page.errors == []


def test_dark_charts_grid_under_the_data_plain_intensity_ticks_and_line_legends(site, page):
    """Dark scheme: the roofline's grid (Vega's dark theme) was brighter than its #555 roofs, its
    x ticks read "10m" and "200m", and the trend charts' legends drew the p25-p75 band's near-invisible swatches.
    Now the grid is dimmer than the roofs and ridge (as drawn: colour and opacity over the page's background),
    FLOP per byte reads "0.01", "0.2", and the legends are the lines' (opaque swatches)."""
    server, built = site
    _run_page(page, server, built, "dlrm")
    page.locator(".cbsite-roofline").scroll_into_view_if_needed()  # drawn only when it nears the viewport
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
    # roofline.js draws again in the dark scheme: the compute points in the lighter blue.
    page.wait_for_function("document.querySelector('.cbsite-roofline svg [fill=\"#4a9bd9\"]') !== null", timeout=20000)
    lum = """(c) => { const v = c.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number);
        return (0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]) / 255; }"""
    seen = page.evaluate("""(lum) => { lum = eval(lum); const s = document.querySelector('.cbsite-roofline svg');
        let bg = 'rgb(0, 0, 0)';
        for (let e = s; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor; if (!/rgba\\(.*, 0\\)|transparent/.test(c)) { bg = c; break; } }
        const drawn = (l) => { const st = getComputedStyle(l), a = parseFloat(st.strokeOpacity) * parseFloat(st.opacity);
          return a * lum(st.stroke) + (1 - a) * lum(bg); };
        const grid = Array.from(s.querySelectorAll('.cbsite-roof-grid line')).map(drawn);
        const roofs = Array.from(s.querySelectorAll('.cbsite-roof, .cbsite-ridge')).map(drawn);
        const x = Array.from(s.querySelectorAll('.cbsite-roof-x text')).map(t => t.textContent);
        return [grid, roofs, x]; }""", lum)
    grid, roofs, xticks = seen
    assert grid and roofs and max(grid) < min(roofs), (grid, roofs)
    assert "0.2" in xticks or "0.1" in xticks, xticks
    assert [t for t in xticks if re.search(r"\d[munkMG]$", t)] == [], xticks  # no "10m", "200m"
    page.goto(server.url + "models/dlrm/")
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
    page.wait_for_function("document.querySelectorAll('[data-cbsite-chart] svg').length >= 4", timeout=30000)
    page.wait_for_timeout(800)
    swatches = page.evaluate("""() => Array.from(document.querySelectorAll('[data-cbsite-chart] svg .role-legend-symbol path'))
        .map(p => [parseFloat(getComputedStyle(p).opacity), parseFloat(p.getAttribute('fill-opacity') || getComputedStyle(p).fillOpacity),
                   getComputedStyle(p).stroke, getComputedStyle(p).fill])""")
    assert swatches
    # every swatch is drawn solid: neither the band's 18 % fill nor a see-through symbol
    assert [s for s in swatches if s[0] < 0.9 or (s[1] < 0.5 and s[2] in ("none", "transparent"))] == [], swatches
    assert page.errors == []


def test_study_page_shows_its_points_on_the_first_screen(site, page):
    """The screenshots of the study page: the points (each run's latency, examples/s, MFU, parameters: what the
    sweep found) came after four screens of per-axis charts, at 4,300 px of 5,400. Now the points table is whole
    inside the first 1400x1000 screen, before the charts, with every point's row visible."""
    server, _ = site
    page.goto(server.url + "studies/demo-dense-sparse/")
    page.wait_for_load_state("networkidle")
    box = page.evaluate("""() => { const t = document.querySelector('table.cbsite-study-points').getBoundingClientRect();
        const c = document.querySelector('#charts').getBoundingClientRect(); return [t.top, t.bottom, c.top, scrollY]; }""")
    top, bottom, charts, scrolled = box
    assert scrolled == 0 and 0 < top and bottom <= VIEWPORT["height"] and bottom < charts, box
    rows = page.locator("table.cbsite-study-points tbody tr")
    assert rows.count() == 4 and all(rows.nth(i).is_visible() for i in range(4))
    assert page.errors == []


def test_study_charts_follow_the_dark_scheme(site, page):
    """The screenshots of the study page in the dark scheme: every chart a white box on the dark page (study.js drew
    Vega's light theme whatever the scheme). Now the study charts take the run pages' dark theme: a transparent
    background, titles and tick labels light on the dark page, drawn again when the palette is toggled either way."""
    server, _ = site
    page.goto(server.url + "studies/demo-dense-sparse/")
    n = page.locator("[data-cbsite-study-chart]").count()
    assert n >= 10
    draw_every(page, "[data-cbsite-study-chart]", "svg .mark-line")  # charts are drawn as they near the viewport
    looks = """() => Array.from(document.querySelectorAll('[data-cbsite-study-chart] svg')).map(s => {
        const v = getComputedStyle(s.querySelector('.role-title-text, .role-axis-label text')).fill.match(/\\d+/g).map(Number);
        return [s.style.backgroundColor, (0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]) / 255]; })"""
    light = page.evaluate(looks)
    assert len(light) == n and all(bg == "white" and ink < 0.5 for bg, ink in light), light
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'slate')")
    draw_every(page, "[data-cbsite-study-chart]", "[data-cbsite-scheme='dark']")  # each redrawn as it comes near
    dark = page.evaluate(looks)
    assert len(dark) == n and all(bg == "transparent" and ink > 0.6 for bg, ink in dark), dark
    page.evaluate("document.body.setAttribute('data-md-color-scheme', 'default')")
    draw_every(page, "[data-cbsite-study-chart]", "[data-cbsite-scheme='light']")
    assert all(bg == "white" for bg, _ in page.evaluate(looks))
    assert page.errors == []


# The run table's artifacts, per row: the row's height, a text line's height, the drawn lines of its links (distinct
# tops), whether any is clipped or covered, and each link: text, href or data-trace, title, accessible name.
ARTIFACTS = """() => { const d = window.cbsiteRun.data, wrap = document.querySelector('#cbsite-table .cbsite-table-wrap');
  const room = wrap.getBoundingClientRect();
  return Array.from(document.querySelectorAll('#cbsite-table tbody tr[data-index]')).map(tr => {
    tr.scrollIntoView({block: 'center'});
    const td = tr.querySelector('td.links'), cell = td.getBoundingClientRect(), line = parseFloat(getComputedStyle(td).lineHeight);
    const items = Array.from(td.querySelectorAll('a, button'));
    const tops = items.concat(Array.from(td.querySelectorAll('.cbsite-art-phase'))).map(e => e.getBoundingClientRect().top);
    const lines = tops.length ? Math.round((Math.max(...tops) - Math.min(...tops)) / line) + 1 : 0;
    return { path: d.path[+tr.dataset.index], index: +tr.dataset.index, height: tr.getBoundingClientRect().height, line: line, lines: lines,
      clipped: td.scrollWidth > td.clientWidth + 1 || items.some(e => { const r = e.getBoundingClientRect();
        return r.left < cell.left - 0.5 || r.right > cell.right + 0.5 || r.right > room.right + 0.5 || r.width < 4; }),
      covered: items.filter(e => { const r = e.getBoundingClientRect(), hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        return !hit || (hit !== e && !e.contains(hit)); }).map(e => e.textContent),
      items: items.map(e => ({ text: e.textContent, tag: e.tagName, href: e.getAttribute('href'), trace: e.getAttribute('data-trace'),
        title: e.title, name: e.getAttribute('aria-label'), group: (e.closest('[role=group]') || {getAttribute: () => null}).getAttribute('aria-label') })) };
  }); }"""


def test_run_table_rows_are_one_line_with_every_artifact_named(site, page):
    """The screenshots of the dlrm v2 run page: the "artifacts" cell took three lines a row ("fwd trace [Perfetto]
    memory" / "bwd ..." / "[ops]", 94 px a row, the table 2,700 px tall) while 140 px right of the table stayed empty.
    Now every row is one text line high, its artifacts on that line ("fwd trace Perfetto mem | bwd trace Perfetto mem
    | ops"), none clipped or covered, the table within the page; every artifact of the run is still there, each with a
    title and an accessible name that say what it is, of which phase and component."""
    server, built = site
    _run_page(page, server, built, "dlrm")
    page.select_option("#cbsite-table select.cbsite-depth", "")
    t = page.evaluate(TABLE)
    assert t["width"] <= t["room"] and t["right"] <= t["content"] + 0.5, t["width"]
    rows = page.evaluate(ARTIFACTS)
    d = page.evaluate("(() => { const d = window.cbsiteRun.data; return { phases: d.phases, model: d.model, files: Object.fromEntries("
                      "d.phases.map(p => [p, { trace: d[p].trace_file, memory: d[p].memory_file, log: d[p].log_file }])) }; })()")
    ops = page.evaluate("(() => window.cbsiteRun.ops ? Object.keys(window.cbsiteRun.ops.components || {}) : [])()")
    assert len(rows) == 29 and d["phases"] == ["forward", "backward"]
    line = rows[0]["line"]
    with_links = [r for r in rows if r["items"]]
    assert len(with_links) >= 28
    for r in rows:
        assert r["height"] < 2 * line, (r["path"], r["height"], line)  # one text line (and its padding): once 94 px
        assert r["lines"] <= 1 and not r["clipped"] and r["covered"] == [], r
    assert max(r["height"] for r in rows) - min(r["height"] for r in rows) < 1
    table = page.evaluate("document.querySelector('#cbsite-table table').getBoundingClientRect().height")
    assert table < 29 * 2 * line, table  # once 2,700 px
    for r in with_links:
        i, who = r["index"], (r["path"] or d["model"] + " (root)")
        expected = []
        for phase in d["phases"]:
            f = d["files"][phase]
            if f["trace"][i]:
                expected += [("A", "trace", f["trace"][i], phase), ("BUTTON", "Perfetto", f["trace"][i], phase)]
            if f["memory"][i]:
                expected.append(("A", "mem", f["memory"][i], phase))
        log = next((d["files"][p]["log"][i] for p in d["phases"] if d["files"][p]["log"][i]), None)
        if log:
            expected.append(("A", "log", log, None))
        if r["path"] in ops:
            expected.append(("BUTTON", "ops", None, None))
        got = r["items"]
        assert [(e["tag"], e["text"]) for e in got] == [(e[0], e[1]) for e in expected], (r["path"], got)
        for e, (tag, text, file, phase) in zip(got, expected):
            if text == "mem":
                assert "memory.html?data=" in e["href"] and e["href"].endswith(file.rsplit("/", 1)[-1]), e
            elif tag == "A":
                assert e["href"] == file, e
            elif text == "Perfetto":
                assert e["trace"] == file, e
            assert e["title"] and e["name"] and who in e["title"] and who in e["name"], e  # whose it is
            what = {"trace": "trace", "Perfetto": "Perfetto UI", "mem": "memory timeline", "log": "printed or warned",
                    "ops": "op breakdown"}[text]
            assert what in e["title"] and what in e["name"], e  # what it is
            if phase:  # and of which phase, in its name and its group's
                assert phase in e["title"] and phase in e["name"] and e["group"] == f"{phase} artifacts of {who}", e
    # The links work: "mem" opens the site's memory viewer, "ops" the component's op breakdown.
    root = next(r for r in with_links if r["path"] == "")
    mem = next(e for e in root["items"] if e["text"] == "mem")
    assert page.request.get(server.url.rstrip("/") + unquote(mem["href"].split("?data=", 1)[1])).ok
    first = next(r for r in with_links if any(e["text"] == "ops" for e in r["items"]))
    page.locator("#cbsite-table tbody tr[data-index] td.links button", has_text="ops").first.click()
    page.wait_for_function("!document.getElementById('cbsite-details').hidden", timeout=5000)
    assert page.inner_text("#cbsite-details h3") == (first["path"] or d["model"] + " (root)")
    assert page.errors == []


# The study charts of examples/s: per chart its key, accessible name, title, legend labels, and every point's tooltip
# (series, measures, value) as Vega draws it.
EPS_CHARTS = """() => Array.from(document.querySelectorAll('[data-cbsite-study-chart]'))
  .filter(c => /examples_per_s$/.test(c.dataset.cbsiteStudyChart)).map(c => ({ key: c.dataset.cbsiteStudyChart,
    name: c.getAttribute('aria-label'), title: Array.from(c.querySelectorAll('svg .role-title-text')).map(t => t.textContent).pop(),
    legend: Array.from(c.querySelectorAll('svg .role-legend-label text')).map(t => t.textContent),
    axis: Array.from(c.querySelectorAll('svg .role-axis-title text')).map(t => t.textContent) }))"""


def test_study_examples_per_second_says_what_each_series_measures(demo_runs, site, page):
    """The screenshots of the study page: one "Examples per second" chart drew the whole model's training step (a
    series named just "model", 16k examples/s) beside its parts' forward alone (DenseArch 380k, InteractionArch 526k):
    unlike things, read as like. Now they are two charts: the whole model's training step and eval forward (step
    timing), then the forward alone of the model and of each component class (batch / forward latency); every legend
    entry says what it measures ("model: training step", "DenseArch: forward"), and so does every point's tooltip,
    with its value in examples/s, the training step's the run's own step figure."""
    server, _ = site
    page.goto(server.url + "studies/demo-dense-sparse/")
    # The examples-per-second charts, each drawn as it nears the viewport (the others are other tests' subject).
    draw_every(page, "[data-cbsite-study-chart$='examples_per_s']", "svg .mark-line")
    charts = page.evaluate(EPS_CHARTS)
    axes = ["dense_features", "sparse_features"]
    assert sorted(c["key"] for c in charts) == sorted(f"{a}|{m}" for a in axes for m in ("examples_per_s", "step_examples_per_s"))
    classes = ["DenseArch", "InteractionArch", "OverArch", "SparseArch"]
    for c in charts:
        assert "examples per second" in c["axis"], c
        assert c["name"].startswith(c["title"]) and c["name"].endswith("against " + c["key"].split("|")[0]), c  # its accessible name
        if c["key"].endswith("|step_examples_per_s"):
            assert "whole model" in c["title"] and c["legend"] == ["model: training step", "model: eval forward"], c
        else:
            assert "forward only" in c["title"], c
            assert c["legend"] == ["model: forward"] + [f"{k}: forward" for k in classes], c
        assert "model" not in c["legend"], c  # never a bare "model" beside its parts
    # Every point's tooltip says which run, what the value measures and its unit.
    steps = {}
    for run in (demo_runs / "demo-dense-sparse").glob("*/*/run.json"):
        meta = json.loads(run.read_text())
        steps[meta["study"]["point"]] = meta["step"]
    for key, series, words in [("dense_features|step_examples_per_s", "model: training step", "training step"),
                               ("dense_features|step_examples_per_s", "model: eval forward", "eval mode"),
                               ("dense_features|examples_per_s", "DenseArch: forward", "forward of DenseArch alone"),
                               ("dense_features|examples_per_s", "model: forward", "forward of model alone")]:
        tips = _tooltips(page, key, series)
        assert len(tips) == 4, (key, series, tips)
        for tip in tips:
            assert tip["series"] == series and words in tip["measures"] and "examples/s" in tip, tip
            if series == "model: training step":
                want = steps[tip["point"]]["train"]["examples_per_s"]
                assert _si(tip["examples/s"]) == pytest.approx(want, rel=1e-3), (tip, want)
    assert page.errors == []


def _si(text: str) -> float:
    return float(text[:-1]) * {"k": 1e3, "M": 1e6, "G": 1e9}[text[-1]] if text[-1] in "kMG" else float(text)


def _tooltips(page, key: str, series: str) -> list[dict[str, str]]:
    """Hover every point of `series` in the chart `key` (found by its colour in the legend); each tooltip's rows."""
    colour = page.evaluate("""([key, series]) => { const c = document.querySelector(`[data-cbsite-study-chart="${key}"]`);
        const labels = Array.from(c.querySelectorAll('svg .role-legend-label text')).map(t => t.textContent);
        const symbols = Array.from(c.querySelectorAll('svg .role-legend-symbol path'));
        return getComputedStyle(symbols[labels.indexOf(series)]).fill; }""", [key, series])
    points = page.locator(f"[data-cbsite-study-chart='{key}'] svg .mark-symbol.role-mark path")
    out = []
    for i in range(points.count()):
        p = points.nth(i)
        if p.evaluate("e => getComputedStyle(e).stroke") != colour and p.evaluate("e => getComputedStyle(e).fill") != colour:
            continue
        p.scroll_into_view_if_needed()
        box = p.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_selector("#vg-tooltip-element.visible", timeout=5000)
        rows = page.evaluate("""() => Array.from(document.querySelectorAll('#vg-tooltip-element tr'))
            .map(tr => [tr.querySelector('.key').textContent, tr.querySelector('.value').textContent])""")
        out.append(dict(rows))
        page.mouse.move(0, 0)
    return out


# The roofline as drawn (roofline.js): the plot area, each axis's domain, every point's box, the ridge's rule and
# the roofs' line.
ROOFLINE = """() => { const s = document.querySelector('.cbsite-roofline svg'), box = e => { const b = e.getBoundingClientRect();
    return { left: b.left, right: b.right, top: b.top, bottom: b.bottom, x: (b.left + b.right) / 2, y: (b.top + b.bottom) / 2 }; };
  const dom = (sel) => s.querySelector(sel).getAttribute('data-domain').split(' ').map(Number);
  return { plot: box(s.querySelector('.cbsite-roof-plot')), x: dom('.cbsite-roof-x'), y: dom('.cbsite-roof-y'),
    points: Array.from(s.querySelectorAll('.cbsite-roof-point')).map(box), ridge: Array.from(s.querySelectorAll('.cbsite-ridge')).map(box),
    roof: Array.from(s.querySelectorAll('.cbsite-roof')).map(box) }; }"""


@pytest.mark.parametrize("model", ["dlrm", "nanogpt", "deepfm", "dlrm-sharded"])
def test_roofline_axes_follow_the_data(site, page, model):
    """The screenshots of the dlrm v2 run page: the roofline's log axes ran from 0.01 to 1000 FLOP/byte and 1G to 1T
    FLOP/s (Vega's whole decades around roofs drawn 4x past the data) while its points spanned 0.2-25 FLOP/byte: more
    than a decade empty on the left, two on the right, the points crowded in the middle. Now the domains are the data's:
    every point and the ridge with half a decade to spare (widened to 1, 2 or 5 x 10^k), so every point lies inside
    the plot and the points spread over most of it; the ridge and both roofs are drawn inside too."""
    server, built = site
    _run_page(page, server, built, model)
    page.locator(".cbsite-roofline").scroll_into_view_if_needed()
    page.wait_for_selector(".cbsite-roofline svg .cbsite-roof-point", timeout=20000)
    r = page.evaluate(ROOFLINE)
    plot, points = r["plot"], r["points"]
    width, height = plot["right"] - plot["left"], plot["bottom"] - plot["top"]
    assert width > 800 and height > 250, plot
    drawn = json.loads((sorted((built / "runs" / model).glob("*/*"))[-1] / "roofline.json").read_text())["roofline"]
    assert len(points) == len(drawn["points"]["path"]) > 5
    inside = lambda b, pad=0.5: (plot["left"] - pad <= b["left"] and b["right"] <= plot["right"] + pad  # noqa: E731
                                 and plot["top"] - pad <= b["top"] and b["bottom"] <= plot["bottom"] + pad)
    assert [p for p in points if not inside(p)] == [], plot  # no point cut by an edge or drawn outside the axes
    # The ridge (the roofs' corner) inside, well clear of the edges; the roofs drawn from edge to edge, inside.
    assert len(r["ridge"]) == 1 and plot["left"] + 20 < r["ridge"][0]["x"] < plot["right"] - 20, (r["ridge"], plot)
    assert len(r["roof"]) == 1 and inside(r["roof"][0], pad=2) and r["roof"][0]["right"] >= plot["right"] - 2, r["roof"]
    # Half a decade (to under 0.85 of one) between the data and each edge: no empty decades, in either direction.
    (x0, x1), (y0, y1) = r["x"], r["y"]
    per_x, per_y = width / math.log10(x1 / x0), height / math.log10(y1 / y0)
    left = min([p["x"] for p in points] + [r["ridge"][0]["x"]])
    right = max([p["x"] for p in points] + [r["ridge"][0]["x"]])
    top, bottom = min([p["y"] for p in points] + [r["roof"][0]["top"] + 1]), max(p["y"] for p in points)
    margins = [(left - plot["left"]) / per_x, (plot["right"] - right) / per_x,
               (top - plot["top"]) / per_y, (plot["bottom"] - bottom) / per_y]
    assert all(0.45 <= m <= 0.85 for m in margins), (model, margins, r["x"], r["y"])
    if model != "nanogpt":  # nanogpt's points lie within a factor of 2.3 of each other, 7x right of the ridge
        spread = max(p["x"] for p in points) - min(p["x"] for p in points)
        assert spread >= width / 3, (model, spread, width)  # dlrm v2: 0.21-25.6 FLOP/byte, 63 % of the axis (once 42 %)
    assert page.errors == []


# The run table's module types, per shown cell: the title (the full dotted name), the text drawn (the abbreviation's
# span where there is one), the cell's whole text, whether the cell is clipped, the drawn text's right edge and the
# cell's content edge.
TYPES = """() => Array.from(document.querySelectorAll('#cbsite-table tbody td.type')).map(td => {
  const short = td.querySelector('.cbsite-type-short'), shown = short || td, r = document.createRange();
  r.selectNodeContents(shown); const st = getComputedStyle(td);
  return { title: td.title, shown: shown.textContent, text: td.textContent, clipped: td.scrollWidth > td.clientWidth,
    overflow: st.textOverflow, right: r.getBoundingClientRect().right,
    edge: td.getBoundingClientRect().right - parseFloat(st.paddingRight) - parseFloat(st.borderRightWidth) }; })"""


def _check_types(cells) -> dict[str, str]:
    """Every type cell whole and unclipped: its class name, or an abbreviation that keeps the name's start and its
    last word(s) whole, dropping whole middle words where it has three or more ("Sharded\u2026Collection"); the full
    dotted name in its title, the class name in its text; two names never read the same. Returns {name: shown}."""
    assert cells
    shown: dict[str, str] = {}
    for c in cells:
        name = c["title"].rsplit(".", 1)[-1]
        assert c["title"] and name and name in c["text"], c  # the full name: title, and text for find-in-page
        assert not c["clipped"] and c["right"] <= c["edge"] + 0.5, c  # nothing cut off at the cell's edge
        if c["shown"] != name:
            head, sep, tail = c["shown"].partition("\u2026")
            assert sep and "\u2026" not in tail, c
            assert name.startswith(head) and name.endswith(tail) and len(head) + len(tail) < len(name), c
            assert len(head) >= 2 and len(tail) >= 3 and tail[0].isupper(), c  # its start, its last word(s) whole
            if sum(ch.isupper() for ch in name) >= 3:  # three CamelCase words or more: whole words dropped ("Tw…")
                assert name[len(head)].isupper(), c
            else:
                assert len(head) >= 3, c
        shown[name] = c["shown"]
    assert len(set(shown.values())) == len(shown), shown  # two types never look alike
    return shown


@pytest.mark.parametrize("model", ["dlrm", "dlrm-sharded"])
def test_run_table_module_types_are_whole_or_cut_in_the_middle(site, page, model):
    """The screenshots of the dlrm v2 run page: the component table cut module types at 5rem with an ellipsis
    ("EmbeddingB\u2026"; the sharded run's "ShardedEmb\u2026", "GroupedPool\u2026", "RwPooledE\u2026") while the type tells
    what a component is. Now the type column takes the room the other columns leave (their headers on two lines
    where the table needs it): dlrm v2 shows every type whole ("EmbeddingBagCollection"); a name that still does not
    fit keeps its start and end and drops whole middle words ("Sharded\u2026Collection", the full name in its title).
    Nothing is clipped, every row is one line and the table fits the page; so at 1,100 px, where it scrolls."""
    server, built = site
    _run_page(page, server, built, model)
    page.select_option("#cbsite-table select.cbsite-depth", "")
    shown = _check_types(page.evaluate(TYPES))
    t = page.evaluate(TABLE)
    assert t["width"] <= t["room"] and t["right"] <= t["content"] + 0.5, t["width"]
    rows = page.evaluate("""() => Array.from(document.querySelectorAll('#cbsite-table tbody tr')).map(tr =>
        [tr.getBoundingClientRect().height, parseFloat(getComputedStyle(tr.querySelector('td')).lineHeight),
         tr.innerText])""")
    assert not [r for r in rows if r[0] >= 2 * r[1]], [r for r in rows if r[0] >= 2 * r[1]]  # one line a row
    if model == "dlrm":
        assert shown["EmbeddingBagCollection"] == "EmbeddingBagCollection"  # once "EmbeddingB\u2026"
        assert all(v == k for k, v in shown.items()), shown
    else:
        assert {"ShardedEmbeddingBagCollection", "GroupedPooledEmbeddingsLookup"} <= set(shown), shown
        assert shown["SparseArch"] == "SparseArch" and shown["InteractionArch"] == "InteractionArch"
    # Sorted by type, filtered, or in a narrower window: never clipped.
    page.click("#cbsite-table th[data-key='module_type']")
    _check_types(page.evaluate(TYPES))
    page.set_viewport_size({"width": 1100, "height": 1000})
    page.wait_for_timeout(400)
    _check_types(page.evaluate(TYPES))
    assert page.errors == []
