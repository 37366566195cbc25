"""The diff page on the demo archive (tests/data/runs): dlrm v1 -> v2, measured together (judged latency, 29
components), in Debian's chromium at 1400x1000. It opened 7.2 screens long with 1.84 MB of data at 10,000
components; now setup, totals, icicle and a 15-row table come first and the rest is collapsed (about 3 screens),
the page loads its first phase on open and the other when asked for, and deltas print with at most 4 significant
digits ("+653 ns", once "+0.000653 ms"). The checks are tests/helpers/browser.py check_short_lazy_diff_page."""

from __future__ import annotations

import pytest

from tests.helpers.browser import check_short_lazy_diff_page, outside

pytestmark = pytest.mark.browser  # skipped where chromium is missing (tests/conftest.py)
VIEWPORT = {"width": 1400, "height": 1000}


def test_committed_dlrm_diff_page_opens_short_and_loads_the_backward_phase_when_asked(committed_site, page):
    server, _ = committed_site
    height = check_short_lazy_diff_page(page, server.url, "diffs/dlrm/v1/v2/")
    assert height <= 3.2 * 1000, height  # about 3 screens
    assert outside(page.requests, {server.port}) == []
