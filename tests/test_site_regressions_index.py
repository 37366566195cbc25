"""The regressions index: every judged latency regression of the archive on one page, newest head run first, with
its ratio, interval and milliseconds, linked from the home page; unjudged diffs are counted, never listed."""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cbsite.generator import build_site
from tests.helpers.browser import Server, outside
from tests.helpers.latency_archive import EXPECTED, IDS, write_latency_archive


class _Rows(HTMLParser):
    """The text of each cell of the page's regressions table, row by row, and each row's links."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.links: list[list[str]] = []
        self.inside = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "cbsite-regressions" in (a.get("class") or ""):
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
            self.links.append([])
        elif self.inside and tag == "td":
            self.rows[-1].append("")
        elif self.inside and tag == "a" and self.links:
            self.links[-1].append(a.get("href") or "")

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


@pytest.fixture(scope="module")
def built(latency_site) -> Path:
    return latency_site[1]


def _table(site: Path) -> _Rows:
    parser = _Rows()
    parser.feed((site / "regressions" / "index.html").read_text())
    parser.rows = [r for r in parser.rows if r]  # the header row has no td
    parser.links = [links for links in parser.links if links]
    return parser


def test_every_judged_regression_is_listed_newest_first_and_nothing_else(built):
    table = _table(built)
    listed = [(r[0], r[1], r[2].split()[0], r[3]) for r in table.rows]
    # The comparison of cmp v1 -> v3: exactly its components judged regressed (the root is shown as the model).
    cmp = {(r[2], r[3]) for r in listed if r[0] == "cmp"}
    assert cmp == {("cmp" if p == "" else p, ph) for (p, ph), v in EXPECTED.items() if v == "regressed"}
    assert {r[1] for r in listed if r[0] == "cmp"} == {"v1 \u2192 v3"}
    # The runs collected with rounds: enc.a 1.5 times slower in both phases, judged on the rounds.
    assert sorted(r[2:] for r in listed if r[0] == "rounds") == [("enc.a", "backward"), ("enc.a", "forward")]
    # Newest head run first: the rounds' r2 was collected after cmp's v3.
    assert [r[0] for r in listed] == ["rounds"] * 2 + ["cmp"] * 3
    # Ratio, interval and the per-forward times of each side, as the diff page shows them.
    enc = next(r for r in table.rows if r[0] == "cmp" and r[2].startswith("enc.a"))
    assert [c.strip() for c in enc[4:]] == ["1.301\u00d7", "1.287\u20131.315\u00d7", "0.1 ms", "0.13 ms", "+0.03 ms"]
    # Each row links to its diff page's verdicts and to the component's history.
    links = table.links[table.rows.index(enc)]
    assert f"../diffs/runs/{IDS['v1']}/{IDS['v3']}/#latency" in links
    assert "../models/cmp/history/#component=enc.a" in links
    for href in links:
        assert (built / href.split("#")[0].replace("../", "", 1) / "index.html").is_file()


def test_unjudged_diffs_are_counted_not_listed_and_the_home_page_links_the_index(built):
    text = re.sub(r"<[^>]+>", "", (built / "regressions" / "index.html").read_text())
    # cmp v1 -> v2 and v2 -> v3 were measured once each: counted as not judged, none of their changes listed.
    assert "2 diffs judged; 2 diffs not judged" in text
    home = re.sub(r"<[^>]+>", "", (built / "index.html").read_text())
    assert "Regressions: 5 judged latency regressions in 2 diffs, newest first (2 diffs judged, 2 not judged)." in home
    assert 'href="regressions/"' in (built / "index.html").read_text()


def test_an_archive_without_evidence_lists_no_regression(tmp_path):
    site = build_site(write_latency_archive(tmp_path / "runs", rounds=False), tmp_path / "site", quiet=True)
    assert len(_table(site).rows) == 3  # only the comparison's
    shutil.rmtree(tmp_path / "runs" / "_comparisons")
    site = build_site(tmp_path / "runs", tmp_path / "site", quiet=True)
    assert _table(site).rows == []
    text = re.sub(r"<[^>]+>", "", (site / "regressions" / "index.html").read_text())
    assert "0 diffs judged; 2 diffs not judged" in text and "No judged regression: no diff of this archive was judged" in text


@pytest.mark.browser
@pytest.mark.parametrize("viewport", [{"width": 1400, "height": 1000}, {"width": 390, "height": 844}])
def test_a_person_finds_the_regressions_from_the_home_page(built, browser, viewport):
    from tests.helpers.browser import recording_page

    server = Server(built)
    try:
        with recording_page(browser, viewport) as page:
            page.goto(server.url)
            page.click("p.cbsite-regressions-link a")
            page.wait_for_selector("table.cbsite-regressions")
            first = page.locator("table.cbsite-regressions tbody tr").first
            box = first.bounding_box()
            assert first.is_visible() and box is not None and 0 <= box["y"] < viewport["height"]
            assert "enc.a" in first.inner_text()
            # No sideways scroll of the page on a phone: the wide table scrolls inside its own box.
            assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
            page.locator("table.cbsite-regressions tbody tr", has_text="cmp").first.locator("td").nth(1).locator("a").click()
            page.wait_for_selector("details#latency[open]")
            assert page.locator("table.cbsite-verdicts").is_visible()
            assert page.errors == [] and outside(page.requests, {server.port}) == []
    finally:
        server.close()
