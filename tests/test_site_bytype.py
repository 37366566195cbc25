"""The run page's time by module type: self time and self FLOPs per forward summed by class over the whole tree,
so nothing is counted twice (speedscope's sandwich view), and a type chosen there filters the component table."""

from __future__ import annotations

from pathlib import Path

import pytest

from cbsite.generator import build_site, bytype, rundata
from tests.helpers.browser import Server, outside
from tests.helpers.runfactory import make_run, write_archive

SPEC = {"": {"enc": {"enc.a": None, "enc.b": None}, "c": None}}
LINEAR, RELU, SEQ = "torch.nn.modules.linear.Linear", "torch.nn.modules.activation.ReLU", "torch.nn.modules.container.Sequential"
RUN_ID = "20250401T000000Z-0000e1"


def _run():
    return make_run(SPEC, model="types", version="v1", run_id=RUN_ID, metrics={
        "enc.a": {"latency_ms": 0.10, "flops": 1000, "call_count": 2, "module_type": LINEAR},
        "enc.b": {"latency_ms": 0.05, "flops": 500, "module_type": LINEAR},
        "c": {"latency_ms": 0.08, "flops": 0, "module_type": RELU},
        # A measured container: its own 0.02 ms and 100 FLOPs are work its children do not cover.
        "enc": {"status": "measured", "latency_ms": 0.02, "flops": 100, "module_type": SEQ},
    })


def test_types_sum_self_time_and_flops_per_forward_without_counting_twice(tmp_path):
    run = _run()
    write_archive(tmp_path, [run])
    view = bytype.by_type(rundata.components_json(run, []))
    rows = {r["type"]: r for r in view["rows"]}
    assert [r["short"] for r in view["rows"]] == ["Linear", "ReLU", "Sequential"]  # by forward time
    linear = rows[LINEAR]
    assert (linear["components"], linear["calls"]) == (2, 3)
    assert linear["forward"]["latency_ms"] == pytest.approx(0.10 * 2 + 0.05)
    assert linear["forward"]["flops"] == 1000 * 2 + 500
    assert rows[SEQ]["forward"]["latency_ms"] == pytest.approx(0.02)  # the container's own part only
    assert rows[SEQ]["forward"]["flops"] == 100
    assert rows[RELU]["forward"]["flops"] == 0  # element-wise work is no FLOP by definition: zero, not unknown
    # The self times add up to the whole model's latency, once: leaves plus the container's own time.
    total = sum(r["forward"]["latency_ms"] for r in view["rows"])
    assert total == pytest.approx(0.10 * 2 + 0.05 + 0.08 + 0.02)
    assert view["covered"]["forward"] == pytest.approx(1.0)
    assert linear["forward"]["share"] == pytest.approx(0.25 / total)
    assert linear["backward"]["latency_ms"] > linear["forward"]["latency_ms"]  # each phase its own sums


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("bytype")
    write_archive(base / "runs", [_run()])
    return build_site(base / "runs", base / "site", quiet=True)


@pytest.mark.browser
def test_choosing_a_type_filters_the_component_table(built, page):
    server = Server(built)
    try:
        page.goto(server.url + f"runs/types/v1/{RUN_ID}/")
        page.wait_for_selector("#cbsite-table tbody tr")
        section = page.locator("table.cbsite-bytype")
        section.scroll_into_view_if_needed()
        first = section.locator("tbody tr").first
        assert first.locator("td").first.inner_text() == "Linear" and first.is_visible()
        assert first.locator("td").nth(3).inner_text() == "0.25 ms"
        page.click(".cbsite-bytype-pick[data-type='torch.nn.modules.linear.Linear']")
        rows = page.locator("#cbsite-table tbody tr")
        assert rows.count() == 2
        assert page.locator("#cbsite-table .cbsite-table-info").inner_text() == "2 of 5 rows"
        note = page.locator("#cbsite-table .cbsite-table-only")
        assert note.is_visible() and "only Linear" in note.inner_text()
        table_box = page.locator("#cbsite-table").bounding_box()
        assert table_box and 0 <= table_box["y"] < 1000  # the table is brought into view
        page.click("#cbsite-table .cbsite-table-only button")
        assert page.locator("#cbsite-table tbody tr").count() == 5
        assert page.errors == [] and outside(page.requests, {server.port}) == []
    finally:
        server.close()
