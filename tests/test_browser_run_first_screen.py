"""The first screen of a run page (1400x1000) in Debian's chromium answers "what is slow" before anything else:
the key facts line (totals per phase, device, warnings), the whole icicle and the top of "Where the time goes"
(its slowest component and that component's bound) are inside the viewport without scrolling; the run's
summary and metadata follow below."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make browser)"),
]
VIEWPORT = {"width": 1400, "height": 1000}


def _run_pages(built: Path) -> list[str]:
    """The newest run page of every model in the built demo site."""
    return [max(m.glob("*/*")).relative_to(built).as_posix() + "/" for m in sorted((built / "runs").iterdir())]


def _inside(box) -> bool:
    return (box is not None and box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= VIEWPORT["width"]
            and box["y"] + box["height"] <= VIEWPORT["height"])


def test_first_screen_holds_key_facts_icicle_and_slowest_component(committed_site, page):
    server, built = committed_site
    pages = _run_pages(built)
    assert len(pages) >= 4
    for rel in pages:
        page.goto(server.url + rel)
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)
        facts = page.locator(".cbsite-keyfacts")
        assert _inside(facts.bounding_box()), rel
        text = facts.inner_text()
        assert "forward" in text and " ms" in text, text  # the totals, each phase's latency
        assert _inside(page.locator("#cbsite-icicle svg").bounding_box()), rel  # the whole icicle
        assert _inside(page.locator("h2#facts").bounding_box()), rel
        first = page.locator(".cbsite-hot li").first  # the slowest component, with its bound where it has one
        assert _inside(first.bounding_box()), rel
        # The metadata comes after: the summary table starts below the first screen's answers.
        summary = page.locator("h2#summary").bounding_box()
        assert summary["y"] > page.locator("h2#facts").bounding_box()["y"], rel
        if page.locator("#warnings").count():  # warnings are named (and linked) from the key facts line
            assert "warning" in text and facts.locator("a[href='#warnings']").count() == 1
    assert page.errors == []
