"""What a page of a 10,000-component run moves, gzipped (issue 14: at most 1 MB with its data).

The run page (its HTML, components.json, roofline.json) meets the bound. The diff page (its HTML, diff.json and
the head run's components.json for the icicle) does not yet: 1.84 MB measured (benchmarks/build_scale.py
--bytes 10000), down from 3.6 MB; the bound here keeps it from growing back while per-phase loading is missing.
"""

from __future__ import annotations

import gzip
import json
import warnings
from pathlib import Path

import pytest

from cbsite.generator import build_site
from tests.conftest_site import synthetic_run

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


def test_a_diff_page_with_its_data_does_not_grow_back(big_site):
    diff = big_site / "diffs" / "big" / "v1" / "v2"
    head = next((big_site / "runs" / "big" / "v2").iterdir())
    files = [diff / "index.html", diff / "diff.json", diff / "charts.json", head / "components.json"]
    assert _gz(files[1:2]) <= 1.25 * MB  # diff.json: only the columns the page reads, 3 significant digits
    assert _gz(files) <= 2 * MB  # the bound is 1 MB: not met yet (see the module's docstring)
