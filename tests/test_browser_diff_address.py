"""The diff page keeps its icicle's zoom and phase in its address (#zoom=PATH&phase=P, the run page's convention):
a link with them opens the page so, a change is written back, and back/forward to another such address applies it
again. In Debian's chromium at 1400x1000 on the tests' own archive (dlrm v1 -> v2)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}
DLRM = "diffs/dlrm/v1/v2/"
STATE = """() => { const d = window.cbsiteDiff, table = document.querySelector("#cbsite-difftable select[aria-label='phase']");
    return { zoom: d.head.path[d.icicle.zoom], phase: document.querySelector('#cbsite-phase').value, table: table.value,
             hash: decodeURIComponent(location.hash), crumb: document.querySelector('#cbsite-zoom').textContent,
             top: document.querySelector('#cbsite-icicle g.cbsite-node.zoom-root') !== null,
             loaded: document.querySelector('#cbsite-diff').getAttribute('data-loading') !== '1' }; }"""


def _state_is(page, zoom: str, phase: str) -> dict:
    page.wait_for_function(f"(() => {{ const s = ({STATE})(); return s.zoom === {zoom!r} && s.phase === {phase!r} "
                           f"&& s.table === {phase!r} && s.loaded; }})()", timeout=10000)
    return page.evaluate(STATE)


def test_zoom_and_phase_live_in_the_address_and_follow_back_and_forward(committed_site, page):
    server, _ = committed_site
    page.goto(server.url + DLRM + "#zoom=over_arch.model&phase=backward")
    page.wait_for_selector("#cbsite-diff[data-ready='1']", timeout=20000)
    state = _state_is(page, "over_arch.model", "backward")  # the icicle and the table both show backward
    # What a person sees: the crumb names the zoomed node, and the backward rows are drawn.
    assert "over_arch.model" in state["crumb"] and state["top"], state
    assert page.locator("#cbsite-difftable tbody tr").count() > 5
    # A click zooms further in: the address follows, defaults left out, no new history entry.
    length = page.evaluate("history.length")
    child = page.evaluate("window.cbsiteDiff.head.path.indexOf('over_arch.model.0')")
    page.locator(f'#cbsite-icicle g.cbsite-node[data-index="{child}"] rect').first.click()
    state = _state_is(page, "over_arch.model.0", "backward")
    assert state["hash"] == "#phase=backward&zoom=over_arch.model.0", state
    page.select_option("#cbsite-phase", "forward")
    page.wait_for_function("decodeURIComponent(location.hash) === '#zoom=over_arch.model.0'", timeout=5000)
    assert page.evaluate("history.length") == length
    # Another address (a link followed, an address typed) is applied; back and forward apply the earlier one again.
    page.evaluate("location.hash = 'zoom=dense_arch&phase=backward'")
    _state_is(page, "dense_arch", "backward")
    page.go_back()
    state = _state_is(page, "over_arch.model.0", "forward")
    assert state["hash"] == "#zoom=over_arch.model.0", state
    page.go_forward()
    _state_is(page, "dense_arch", "backward")
    # A plain anchor (a section's link) is not a state: the zoom and phase stay.
    page.evaluate("location.hash = 'latency'")
    page.wait_for_timeout(300)
    assert page.evaluate(STATE)["zoom"] == "dense_arch" and page.evaluate("document.querySelector('details#latency').open")
    assert page.errors == []
