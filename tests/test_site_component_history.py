"""A model's component history page: each component's latency, FLOPs, size and peak memory across its versions
(the newest run of each), a gap where a version has no component at that path, reached from the run table's
"history" link and kept right by the build cache."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from cbsite import archive
from cbsite.generator import build_site, historydata
from tests.helpers.browser import Server, outside
from tests.helpers.runfactory import make_run, write_archive

FULL = {"": {"enc": {"enc.a": None, "enc.b": None}, "c": None}}
NO_C = {"": {"enc": {"enc.a": None, "enc.b": None}}}
IDS = {"v1-old": "20250301T000000Z-0000d0", "v1": "20250302T000000Z-0000d1", "v2": "20250303T000000Z-0000d2",
       "v3": "20250304T000000Z-0000d3"}


def _runs() -> list:
    return [
        make_run(FULL, model="hist", version="v1", run_id=IDS["v1-old"], metrics={"enc.a": {"latency_ms": 9.0}}),
        make_run(FULL, model="hist", version="v1", run_id=IDS["v1"],
                 metrics={"enc.a": {"latency_ms": 0.10, "flops": 1000, "call_count": 3}}),
        # v2 has no component at "c": its history has a gap there, not a value taken from elsewhere.
        make_run(NO_C, model="hist", version="v2", run_id=IDS["v2"],
                 metrics={"enc.a": {"latency_ms": 0.20, "flops": 2000, "call_count": 3}}),
        make_run(FULL, model="hist", version="v3", run_id=IDS["v3"],
                 metrics={"enc.a": {"latency_ms": 0.30, "flops": 3000, "call_count": 3}}),
    ]


def _history(site: Path) -> tuple[dict, dict]:
    """The index and, per path, each series over every version (None where a version has no value)."""
    folder = site / "models" / "hist" / "history"
    index = json.loads((folder / "index.json").read_text())
    series: dict = {}
    for k, start in enumerate(index["starts"]):
        entries = json.loads((folder / f"{k}.json").read_text())
        assert entries[0]["path"] == index["paths"][start]  # each file starts where the index says
        for e in entries:
            series[e["path"]] = {key: [e[key][e["v"].index(i)] if i in e["v"] else None
                                       for i in range(len(index["versions"]))] for key in index["series"]}
    return index, series


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("history")
    write_archive(base / "runs", _runs())
    return build_site(base / "runs", base / "site", quiet=True)


def test_history_holds_each_versions_newest_run_per_forward_with_gaps(built):
    index, series = _history(built)
    assert index["versions"] == ["v1", "v2", "v3"]
    assert index["runs"] == [IDS["v1"], IDS["v2"], IDS["v3"]]  # v1's newer run stands for it, not the 9 ms one
    assert set(index["paths"]) == {"", "enc", "enc.a", "enc.b", "c"}
    # Latency and FLOPs per forward of the model: the per-call value times the calls, as the run table shows them.
    assert series["enc.a"]["forward.latency_ms"] == pytest.approx([0.30, 0.60, 0.90])
    assert series["enc.a"]["forward.flops"] == [3000, 6000, 9000]
    assert series["c"]["forward.latency_ms"][1] is None and None not in series["c"]["forward.latency_ms"][::2]
    assert series["c"]["param_bytes"][1] is None
    # Every value is the archive's own (rounded for display): read back from each newest run's Parquet file.
    for i, run_id in enumerate(index["runs"]):
        rows = pl.read_parquet(built.parent / "runs" / "hist" / index["versions"][i] / run_id / archive.COMPONENTS_FILE)
        for r in rows.iter_rows(named=True):
            key = f"{r['phase']}.peak_memory_bytes"
            assert series[r["path"]][key][i] == pytest.approx(r["peak_memory_bytes"], rel=1e-3)
            assert series[r["path"]]["param_bytes"][i] == r["param_bytes"]


def test_history_files_stay_small_whatever_the_number_of_versions(tmp_path):
    # 40 versions of 300 components: files of about NUMBERS_PER_FILE values each, never a path split across two.
    spec = {"": {f"m{i}": None for i in range(299)}}
    runs = [make_run(spec, model="hist", version=f"v{k}", run_id=f"202503{k // 24 + 10:02d}T{k % 24:02d}0000Z-0000{k:02x}")
            for k in range(40)]
    folder = tmp_path / "runs"
    write_archive(folder, runs)
    files = historydata.model_history("hist", [archive.read_run(p) for p in sorted(folder.glob("hist/*/*"))])
    index = json.loads(files["index.json"])
    assert len(index["paths"]) == 300 and len(files) - 1 == len(index["starts"]) > 1
    values_each = 40 * (len(historydata.SERIES) + 1)
    for k in range(len(index["starts"])):
        entries = json.loads(files[f"{k}.json"])
        assert len(entries) * values_each <= historydata.NUMBERS_PER_FILE + values_each


def test_history_follows_the_archive_through_the_build_cache(tmp_path):
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    write_archive(runs, _runs()[:3])
    build_site(runs, tmp_path / "site", quiet=True, cache=cache)
    index, _ = _history(tmp_path / "site")
    assert index["versions"] == ["v1", "v2"]
    write_archive(runs, _runs()[3:])  # a new version: the cached history of v1 and v2 must not stand
    build_site(runs, tmp_path / "site", quiet=True, cache=cache)
    cached = _history(tmp_path / "site")
    build_site(runs, tmp_path / "fresh", quiet=True)
    assert cached == _history(tmp_path / "fresh")
    assert cached[0]["versions"] == ["v1", "v2", "v3"]
    assert cached[1]["enc.a"]["forward.latency_ms"] == pytest.approx([0.30, 0.60, 0.90])


@pytest.mark.browser
def test_a_run_tables_row_links_to_a_history_that_a_person_can_read(built, page):
    server = Server(built)
    try:
        page.goto(server.url + f"runs/hist/v3/{IDS['v3']}/")
        page.wait_for_selector("#cbsite-table tbody tr")
        page.fill("#cbsite-table input.cbsite-filter", "enc.a")
        page.locator("#cbsite-table tbody tr td.path a").first.click(position={"x": 2, "y": 2})  # opens the details
        link = page.locator("#cbsite-details a.cbsite-history-link")
        link.wait_for(state="visible")
        assert link.is_visible() and link.inner_text() == "history across versions"
        link.click()
        page.wait_for_selector("#cbsite-history[data-ready='1']")
        assert page.inner_text("#cbsite-history-title") == "enc.a"
        charts = page.locator(".cbsite-history-chart")
        assert charts.count() == len(historydata.SERIES)
        first = charts.first
        assert first.locator("figcaption").inner_text() == "forward latency"
        box = first.bounding_box()
        assert box and box["y"] < 1000 and box["width"] > 200 and box["height"] > 80  # drawn, in the first screen
        assert first.locator("circle").count() == 3
        assert first.locator("text.cbsite-history-value").last.text_content() == "0.9 ms"
        rows = page.locator("#cbsite-history-table tbody tr")
        assert rows.count() == 3 and rows.first.locator("td").first.inner_text() == "v3"
        # A component absent from v2: two points and no line across the gap.
        page.fill("#cbsite-history-search", "c")
        matches = page.locator("#cbsite-history-matches a")
        assert matches.all_inner_texts() == ["c", "enc", "enc.a", "enc.b"]  # every path with a "c" in it
        page.locator("#cbsite-history-matches").get_by_role("link", name="c", exact=True).click()
        page.wait_for_function("document.getElementById('cbsite-history').dataset.shown === 'c'")
        chart = page.locator(".cbsite-history-chart").first
        assert chart.locator("circle").count() == 2
        assert chart.locator("path.cbsite-history-line").get_attribute("d").count("L") == 0
        v2 = page.locator("#cbsite-history-table tbody tr").nth(1)
        assert v2.locator("td").first.inner_text() == "v2" and v2.locator("td").nth(1).inner_text() == "\u2013"
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        assert page.errors == [] and outside(page.requests, {server.port}) == []
    finally:
        server.close()


@pytest.mark.browser
def test_history_of_a_path_no_version_has_says_so(built, page):
    server = Server(built)
    try:
        page.goto(server.url + "models/hist/history/#component=enc.renamed")
        page.wait_for_selector("#cbsite-history[data-ready='1']")
        assert "No component at the path" in page.inner_text("#cbsite-history-title")
        assert page.locator(".cbsite-history-chart").count() == 0
    finally:
        server.close()
