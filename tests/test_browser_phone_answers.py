"""On a phone (390x844, touch) in Debian's chromium, each page's answer is the first thing a person sees: the run
page's first screen holds the key facts line and the slowest component of "Where the time goes" with its bound
(the icicle follows), and the home, study and regressions tables show one card per row with the answering values
(what changed, the latency, the verdict's ratio and change) at its top, inside the screen, with no table to pan."""

from __future__ import annotations

import pytest

from tests.helpers.browser import PHONE
from tests.test_browser_phone import page_urls

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)


def _open(page, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state("load")
    if page.locator("#cbsite-run").count():
        page.wait_for_selector("#cbsite-run[data-ready='1']", timeout=20000)


def _on_screen(box) -> bool:
    return (box is not None and box["width"] > 0 and box["x"] >= -0.5 and box["y"] >= -0.5
            and box["x"] + box["width"] <= PHONE["width"] + 0.5 and box["y"] + box["height"] <= PHONE["height"] + 0.5)


@pytest.mark.parametrize("kind", ["run", "sharded run"])
def test_run_page_first_screen_on_a_phone_holds_the_slowest_component_and_its_bound(committed_site, phone, kind):
    server, built = committed_site
    _open(phone, server.url + page_urls(built)[kind])
    assert phone.evaluate("window.scrollY") == 0
    facts = phone.locator(".cbsite-keyfacts")
    assert _on_screen(facts.bounding_box())
    assert "forward" in facts.inner_text() and " ms" in facts.inner_text()
    assert _on_screen(phone.locator("h2#facts").bounding_box())
    first = phone.locator(".cbsite-fact ol.cbsite-hot > li").first
    assert _on_screen(first.bounding_box()), first.bounding_box()
    badge = first.locator(".cbsite-bound")
    assert badge.count() == 1 and badge.is_visible() and _on_screen(badge.bounding_box()), badge.bounding_box()
    assert badge.inner_text().strip() in {"compute", "memory", "overhead", "communication", "suspect"}
    # Readable at arm's length: the item's text is no smaller than 12 px.
    assert phone.evaluate("parseFloat(getComputedStyle(document.querySelector('.cbsite-hot > li')).fontSize)") >= 12
    # The icicle follows the lists, drawn across the screen's width.
    icicle = phone.locator("#cbsite-icicle svg").bounding_box()
    assert icicle["y"] > first.bounding_box()["y"] and icicle["width"] >= PHONE["width"] - 60, icicle
    assert phone.errors == []


# Each card (a table row) of `table`: every cell's box, its text and the column name drawn before it (::before).
CARDS = """(sel) => Array.from(document.querySelectorAll(sel + ' tbody tr')).map(tr => Array.from(tr.cells).map(td => {
    const r = td.getBoundingClientRect(), label = getComputedStyle(td, '::before').content;
    return { cls: td.className, text: td.innerText.trim(), x: r.left, right: r.right, top: r.top,
             clipped: td.scrollWidth > td.clientWidth + 1, label: label === 'none' ? '' : label.replace(/"/g, '').trim() }; }))"""


def _cards(page, table: str) -> list[list[dict]]:
    assert page.evaluate("(sel) => { const t = document.querySelector(sel); return t.scrollWidth <= t.clientWidth + 1 "
                         "&& t.getBoundingClientRect().right <= document.documentElement.clientWidth + 0.5; }", table), table
    cards = page.evaluate(CARDS, table)
    assert cards, table
    for card in cards:
        for cell in card:  # every value inside the screen, whole: nothing to pan, nothing cut
            assert cell["x"] >= -0.5 and cell["right"] <= PHONE["width"] + 0.5 and not cell["clipped"], (table, cell)
    return cards


def _cell(card: list[dict], label: str) -> dict:
    return next(c for c in card if c["label"] == label)


def test_home_cards_put_what_changed_and_the_latency_first(committed_site, phone):
    server, _ = committed_site
    _open(phone, server.url)
    # "What changed" comes before the models on a phone: its first card (the newest judged regression) on the first
    # screen. The HTML keeps the models first, as a desktop shows them.
    first_change = phone.locator("table.cbsite-changes tbody tr").first.bounding_box()
    assert first_change["y"] + min(first_change["height"], 120) <= PHONE["height"], first_change
    assert first_change["y"] < phone.locator("table.cbsite-models").bounding_box()["y"]
    for card in _cards(phone, "table.cbsite-changes"):
        model, versions, largest, other = card
        assert largest["text"] and largest["top"] < other["top"]  # the largest changes before the other facts
        assert model["top"] <= largest["top"] and versions["top"] < largest["top"]
    for card in _cards(phone, "table.cbsite-models"):
        latency, versions = _cell(card, "fwd latency"), _cell(card, "versions")
        assert latency["text"].endswith(("ms", "s")) and latency["top"] < versions["top"]  # the latency on the name's line
        assert abs(latency["top"] - card[0]["top"]) < 4
    assert phone.errors == []


def test_regressions_cards_show_the_component_its_ratio_and_change_first(committed_site, phone):
    server, _ = committed_site
    _open(phone, server.url + "regressions/")
    cards = _cards(phone, "table.cbsite-regressions")
    for card in cards:
        component = next(c for c in card if "cbsite-card-head" in c["cls"])
        ratio, change, model = _cell(card, "ratio"), _cell(card, "change"), card[0]
        assert component["top"] < ratio["top"] <= change["top"] + 2 and change["top"] <= model["top"] + 2, card
        assert ratio["text"].endswith("\u00d7") and change["text"].startswith(("+", "\u2212")), card
    # The first card's answer is on the first screen of its own.
    phone.locator("table.cbsite-regressions tbody tr").first.scroll_into_view_if_needed()
    first = phone.locator("table.cbsite-regressions tbody tr").first
    assert _on_screen(first.bounding_box())
    assert phone.errors == []


def test_study_cards_put_the_latency_and_throughput_after_the_point(committed_site, phone):
    server, built = committed_site
    _open(phone, server.url + page_urls(built)["study"])
    for card in _cards(phone, "table.cbsite-study-points"):
        point, latency, status = card[0], _cell(card, "fwd latency"), _cell(card, "status")
        assert point["top"] < latency["top"] <= status["top"] + 2, card
    assert phone.errors == []


def test_history_heading_is_sized_as_a_subheading_on_a_phone(committed_site, phone):
    """The component's path heads the history page: at most a quarter larger than the text, on a few lines."""
    server, built = committed_site
    _open(phone, server.url + page_urls(built)["history"])  # its longest path
    phone.wait_for_selector("#cbsite-history[data-shown]", timeout=20000)
    sizes = phone.evaluate("""() => { const h = document.getElementById('cbsite-history-title'), r = h.getBoundingClientRect();
        const p = document.querySelector('#cbsite-history > p:not(.cbsite-crumbs)'), fs = e => parseFloat(getComputedStyle(e).fontSize);
        return { title: fs(h), text: fs(p), lines: Math.round(r.height / parseFloat(getComputedStyle(h).lineHeight)), right: r.right }; }""")
    assert sizes["title"] <= 1.25 * sizes["text"], sizes
    assert sizes["lines"] <= 3 and sizes["right"] <= PHONE["width"], sizes
    assert phone.errors == []
