"""What a page of a 10,000-component run moves, gzipped: at most 1 MB with its data.

The run page (its HTML, components.json, roofline.json) meets the bound. So does the diff page: on open it loads
its HTML, diff.json (an index), diff.forward.json (the first phase: the table's columns and the head run's values
the icicle draws, paths as parent row + last segment) and charts.json; diff.backward.json loads only when a
phase selector asks for it (tests/test_browser_site.py checks that it does). Measured 0.67 MB on open
(benchmarks/build_scale.py --bytes 10000), down from 1.84 MB when the page loaded both phases and the head run's
whole components.json.
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from cbsite.generator import build_site
from tests.helpers.site_archives import synthetic_run

MB = 1_000_000


def _gz(files: list[Path]) -> int:
    return sum(len(gzip.compress(f.read_bytes(), 6)) for f in files if f.is_file())


@pytest.fixture(scope="module")
def big_site(tmp_path_factory):
    base = tmp_path_factory.mktemp("big")
    for i in (1, 2):
        synthetic_run(base / "runs", "big", f"v{i}", n=10_000, seed=i, minutes=i, scale=1 + (i - 1) * 0.3,
                      trace_every=500, branching=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(base / "runs", base / "site", quiet=True)
    return base / "site"


def test_a_run_page_with_its_data_stays_under_one_megabyte_gzipped(big_site):
    run = next((big_site / "runs" / "big" / "v2").iterdir())
    files = [run / n for n in ("index.html", "components.json", "roofline.json", "ops.json")]
    assert len(json.loads((run / "components.json").read_text())["path"]) == 10_000
    assert _gz(files) <= 1 * MB


def test_a_diff_page_with_its_data_stays_under_one_megabyte_gzipped(big_site):
    diff = big_site / "diffs" / "big" / "v1" / "v2"
    index = json.loads((diff / "diff.json").read_text())
    assert index["phases"] == ["forward", "backward"]
    on_open = [diff / n for n in ("index.html", "diff.json", index["files"]["forward"], "charts.json")]
    assert all(f.is_file() for f in on_open[:3])
    assert len(json.loads(on_open[2].read_text())["name"]) >= 10_000
    html = on_open[0].read_text()
    assert "components.json" not in html  # the head run's whole data is no longer loaded for the icicle
    assert _gz(on_open) <= 1 * MB
    # The other phase is as large and loads only when asked for: on open it would not fit twice.
    assert _gz([diff / index["files"]["backward"]]) >= 0.25 * MB


def test_paths_are_written_as_parent_row_and_last_segment_and_read_back_whole():
    from cbsite.generator.diffdata import decode_paths, encode_paths

    # Pre-order with a removed subtree where it was, a component whose parent is not a row (kept whole), and a
    # repeated path (a removed and an added component may share it): the first row of a prefix is its parent.
    paths = ["", "a", "a.b", "a.b.c", "gone", "gone.x", "z.y", "a.d", "a.b", "top"]
    parent, name = encode_paths(paths)
    assert parent == [-1, 0, 1, 2, 0, 4, -1, 1, 1, 0]
    assert name == ["", "a", "b", "c", "gone", "x", "z.y", "d", "b", "top"]
    assert decode_paths(parent, name) == paths
    assert all(k < i for i, k in enumerate(parent))  # a parent precedes its children (the icicle needs it)
