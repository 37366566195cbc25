"""A bandwidth utilisation above 100 % is not believed, as MFU above 100 % is not (Debian's chromium, demo site):
the table cell is marked suspect with its reason, the row's bound is "suspect" (not "memory"), the icicle draws
no ramp colour for it and its tooltip says why, and "Read these numbers with care" names the rows."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make browser)"),
]
VIEWPORT = {"width": 1400, "height": 1000}


def _over_peak(built: Path) -> tuple[str, str, float]:
    """A run page and a component whose forward bandwidth utilisation is above 100 % (the largest such)."""
    best = None
    for comps in sorted((built / "runs").glob("*/*/*/components.json")):
        d = json.loads(comps.read_text())
        for i, v in enumerate(d.get("forward", {}).get("bandwidth_util", [])):
            if isinstance(v, (int, float)) and v > 1 and d["path"][i] and (best is None or v > best[2]):
                best = (comps.parent.relative_to(built).as_posix() + "/", d["path"][i], v)
    assert best, "the demo archive has a row above the bandwidth peak (the sharded row-wise lookup)"
    return best


def test_bandwidth_above_its_peak_is_marked_suspect(committed_site, page):
    server, built = committed_site
    rel, path, _ = _over_peak(built)
    page.goto(f"{server.url}{rel}#component={quote(path)}")
    page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
    row = page.locator("#cbsite-table tr.cbsite-linked")
    assert row.count() == 1
    cell = row.locator("td.cbsite-suspect", has_text="%").last
    assert cell.inner_text().startswith("\u26a0") and "bandwidth utilisation above 100 %" in cell.get_attribute("title")
    assert row.locator(".cbsite-bound").inner_text() == "suspect"
    # "Read these numbers with care" names the row and the likely causes; the key facts line links to it.
    box = page.locator("#warnings .cbsite-bandwidth-over")
    assert path in box.inner_text() and "cache" in box.inner_text() and "per rank" in box.inner_text()
    assert page.locator(".cbsite-keyfacts a[href='#warnings']").count() == 1
    # The icicle coloured by bandwidth utilisation: no ramp colour for it, and its tooltip says why.
    page.select_option("#cbsite-colour", "bandwidth_util")
    index = page.evaluate("(p) => window.cbsiteRun.data.path.indexOf(p)", path)
    node = page.locator(f"#cbsite-icicle g.cbsite-node[data-index='{index}']").first
    if node.count():
        fill = node.locator("rect").first.get_attribute("fill")
        assert fill == page.evaluate("window.CbsiteIcicle.fills().none")
        node.focus()
        assert "bandwidth utilisation above 100 %" in page.locator(".cbsite-tip").inner_text()
    assert page.errors == []
