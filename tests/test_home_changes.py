"""The home page's "What changed" table answers "what got slower" first: the models whose newest diff judged a
latency regression come before the others (then by name), on the tests' committed archive."""

from __future__ import annotations

import re
from pathlib import Path


def _rows(site: Path) -> list[tuple[str, str]]:
    """(model, largest-changes cell text) of each "What changed" row, in page order."""
    html = (site / "index.html").read_text()
    table = html.split('<table class="cbsite-changes', 1)[1].split("</table>", 1)[0]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", table.split("<tbody>", 1)[1], flags=re.S):
        model = re.search(r'<td class="cbsite-model[^"]*">([^<]+)</td>', tr).group(1)
        largest = re.sub(r"<[^>]+>", "", re.findall(r'<td class="cbsite-card-answer[^"]*">(.*?)</td>', tr, re.S)[0])
        rows.append((model, largest))
    return rows


def test_models_with_a_judged_regression_come_first(demo_site):
    rows = _rows(demo_site)
    regressed = [bool(re.search(r"latency \([^)]*regressed\)", text)) for _, text in rows]
    assert any(regressed) and not all(regressed), rows  # the archive has both kinds, so the order is tested
    assert regressed == sorted(regressed, reverse=True), rows  # no regressed row after one that is not
    assert rows[0][0] == "dlrm"  # dlrm v1 -> v2: forward and backward latency judged regressed
    for group in (True, False):  # within each group, by model name
        names = [m for (m, _), r in zip(rows, regressed) if r is group]
        assert names == sorted(names)
