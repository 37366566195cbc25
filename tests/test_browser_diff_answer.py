"""The diff page leads with the answer, in Debian's chromium at 1400x1000 on the tests' own archive: per phase the
judged latency changes (largest own change first, ratio and interval, verdict, bound, absolute medians), then FLOP
and memory growth, inside the first screen; the icicle coloured by own change, regressed nodes outlined, its
tooltip giving the bound on both sides where it changed; the runs' warnings in a box; setup changes with the option
that was turned before any per-table detail; a sharded diff's own changes that would mix ranks given per rank."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}
DLRM = "diffs/dlrm/v1/v2/"
SHARDED = "diffs/dlrm-sharded/table-wise/row-wise/"
STUDY = "diffs/demo-dense-sparse/dense_features-64.sparse_features-4/dense_features-64.sparse_features-16/"


def _open(page, server, url: str) -> None:
    page.goto(server.url + url)
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    page.wait_for_timeout(200)


def _answer_rows(page) -> list[dict]:
    """Every row of the answer's latency tables, with where it is drawn and how large its text is."""
    return page.evaluate("""() => Array.from(document.querySelectorAll('.cbsite-answer-phase')).flatMap(box =>
        Array.from(box.querySelectorAll('.cbsite-answer-latency tbody tr')).map(tr => {
            const r = tr.getBoundingClientRect(), cells = Array.from(tr.children);
            const badge = cells[4].querySelector('.cbsite-bound'), b = badge ? badge.getBoundingClientRect() : null;
            return { phase: box.dataset.phase, path: cells[0].textContent, own: cells[1].textContent,
                     ratio: cells[2].textContent, verdict: cells[3].textContent, bound: cells[4].textContent,
                     sides: cells[5].textContent, badge: b && badge.checkVisibility() ? [b.left, b.top, b.right, b.bottom] : null,
                     top: r.top, bottom: r.bottom, left: r.left, right: r.right,
                     font: Math.min(...cells.map(c => parseFloat(getComputedStyle(c).fontSize))),
                     visible: cells.every(c => c.checkVisibility() && c.getBoundingClientRect().width > 0),
                     clipped: cells.some(c => c.scrollWidth > c.clientWidth + 1) }; }))""")


def test_judged_regressions_of_both_phases_are_in_the_first_screen(committed_site, page):
    server, _ = committed_site
    _open(page, server, DLRM)
    rows = _answer_rows(page)
    phases = {r["phase"] for r in rows}
    assert phases == {"forward", "backward"}, rows
    for r in rows:
        assert r["verdict"] == "regressed", r  # dlrm v1 -> v2 only regressed
        assert r["visible"] and not r["clipped"] and r["font"] >= 11, r
        assert 0 <= r["top"] and r["bottom"] <= VIEWPORT["height"] and r["right"] <= VIEWPORT["width"], r
        assert r["own"].startswith("+") and "\u2192" in r["sides"] and "\u00d7" in r["ratio"], r
        # Compute- or memory-bound? Each listed component's bound, a badge drawn inside the first screen.
        assert r["bound"] in ("compute", "memory", "overhead"), r
        left, top, right, bottom = r["badge"]
        assert 0 <= left and right <= VIEWPORT["width"] and 0 <= top and bottom <= VIEWPORT["height"], r
    # The slowest regression listed first has the bound the head run's own columns give it (its run page's label).
    first = next(r for r in rows if r["phase"] == "forward")
    assert first["bound"] == page.evaluate("""(p) => { const c = window.cbsiteDiff.diff.forward;
        return c.run.bound[c.path.indexOf(p)]; }""", first["path"]), first
    backward = [r["path"] for r in rows if r["phase"] == "backward"]
    # The largest own change leads; ancestors whose change is their child's are folded into it.
    assert backward[0] == "sparse_arch.embedding_bag_collection", backward
    assert "dlrm" not in backward and "sparse_arch" not in backward, backward
    forward = [r["path"] for r in rows if r["phase"] == "forward"]
    assert "over_arch.model.0._mlp.1._linear" in forward and "over_arch.model.0._mlp.1" not in forward, forward
    # FLOP and memory growth follow the latency changes in each phase.
    growth = page.locator(".cbsite-answer-phase[data-phase='backward'] .cbsite-answer-growth").all_text_contents()
    assert any(g.startswith("FLOPs") for g in growth) and any(g.startswith("Peak memory") for g in growth), growth
    assert page.errors == []


def test_diff_icicle_colours_own_change_and_outlines_regressions(committed_site, page):
    server, _ = committed_site
    _open(page, server, DLRM)
    page.select_option("#cbsite-colour", "delta_latency_ms")
    page.select_option("#cbsite-phase", "backward")
    page.wait_for_function("window.cbsiteDiff.diff.backward !== undefined && "
                           "document.querySelector('#cbsite-diff').getAttribute('data-loading') === '0'", timeout=10000)
    page.wait_for_timeout(200)
    fill = page.evaluate("""(paths) => paths.map(p => {
        const i = window.cbsiteDiff.head.path.indexOf(p);
        const g = document.querySelector('#cbsite-icicle g.cbsite-node[data-index="' + i + '"]');
        return g ? [g.querySelector('rect').getAttribute('fill'), g.classList.contains('regressed')] : null; })""",
        ["over_arch.model.0._mlp.1._linear", "dense_arch.model._mlp.0._linear", "over_arch.model.0"])
    regressed_leaf, unchanged_leaf, ancestor = fill
    # Judged latency is drawn as the log of the verdict's ratio: a regressed leaf (about 3x backward) and a
    # regressed container (about 2.6x) are coloured and outlined; an unchanged leaf is drawn as no change.
    assert regressed_leaf[1] and ancestor[1] and not unchanged_leaf[1], fill
    assert regressed_leaf[0] != unchanged_leaf[0] and ancestor[0] != unchanged_leaf[0], fill
    assert page.errors == []


def test_sharded_diff_opens_on_a_colouring_that_shows_a_change(committed_site, page):
    server, _ = committed_site
    _open(page, server, SHARDED)
    fills = page.evaluate("Array.from(document.querySelectorAll('#cbsite-icicle g.cbsite-node > rect:first-child'))"
                          ".map(r => r.getAttribute('fill'))")
    assert len(set(fills)) >= 3, sorted(set(fills))  # not a white icicle
    # Both runs' own warnings (load, peak swings) are carried over into a box.
    box = page.locator("#run-warnings").inner_text()
    assert "base (table-wise)" in box and "head (row-wise)" in box and "load average" in box, box
    setup = page.locator("table.cbsite-setup tbody tr td:first-child").all_text_contents()
    assert setup[0] == "provider.options.sharding", setup
    assert sum("t_cat_" in s for s in setup) == 1, setup  # the 16 per-table rows, folded into one
    assert page.errors == []


def test_study_diff_shows_the_axis_before_per_table_detail(committed_site, page):
    server, _ = committed_site
    _open(page, server, STUDY)
    setup = page.locator("table.cbsite-setup tbody tr td:first-child").all_text_contents()
    assert setup[0] == "provider.options.sparse_features", setup
    assert page.locator("table.cbsite-setup tbody tr").first.is_visible()
    tables = [s for s in setup if "tables[" in s]
    assert len(tables) == 1 and "tables[4] \u2026 [15]" in tables[0], setup  # numeric order, one line
    assert len(setup) <= 10, setup
    assert page.errors == []


def _tooltip(page, path: str) -> dict[str, str]:
    """The icicle tooltip of the node at `path` as a pointer resting on it shows it: its "name: value" lines."""
    index = page.evaluate("(p) => window.cbsiteDiff.head.path.indexOf(p)", path)
    page.locator(f'#cbsite-icicle g.cbsite-node[data-index="{index}"] rect').first.hover()
    page.wait_for_selector(".cbsite-tip:not([hidden])", timeout=5000)
    assert page.locator(".cbsite-tip").is_visible()
    lines = [line.split(": ", 1) for line in page.inner_text(".cbsite-tip").splitlines()]
    return {pair[0]: pair[1] for pair in lines if len(pair) == 2}


def test_diff_icicle_tooltip_gives_the_bound_on_both_sides_where_it_changed(committed_site, page):
    server, _ = committed_site
    _open(page, server, DLRM)
    page.locator("#cbsite-icicle").scroll_into_view_if_needed()
    tip = _tooltip(page, "")  # the whole model, forward: memory-bound in v1, compute-bound in v2
    assert tip["bound by"] == "compute" and tip["bound, base \u2192 head"] == "memory \u2192 compute", tip
    leaf = _tooltip(page, "over_arch.model.0._mlp.1._linear")  # compute-bound on both sides: one label
    assert leaf["bound by"] == "compute" and "bound, base \u2192 head" not in leaf, leaf
    assert page.errors == []


def test_sharded_diff_gives_own_changes_that_would_mix_ranks_per_rank(committed_site, page):
    server, _ = committed_site
    _open(page, server, SHARDED)
    root = page.locator(".cbsite-answer-phase[data-phase='forward'] tr.cbsite-answer-mixed",
                        has=page.locator("code", has_text="dlrm-sharded"))
    assert root.is_visible() and "rank 0" in root.inner_text() and "rank 1" in root.inner_text()
    assert "12.3" not in page.inner_text("#answer + .cbsite-answer")  # the mixed own change is never shown
    words = page.locator("#mixed-ranks")
    assert words.is_visible() and "each row is its own slowest rank" in words.inner_text()
    page.locator("#cbsite-icicle").scroll_into_view_if_needed()
    tip = _tooltip(page, "")
    per_rank = tip["own \u0394 latency per rank"]
    assert "rank 0 \u2212" in per_rank and "rank 1 \u2212" in per_rank and "different ranks" in per_rank, tip
    assert tip["bound by"] == "communication", tip  # the site's one taxonomy: never a roofline bound
    assert page.errors == []
