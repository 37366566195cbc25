"""Golden files of a small run page and diff page: the Markdown/HTML the generator writes and the JSON the
browser reads, byte for byte (nothing normalised: the build is deterministic).

Regenerate after an intended change, then review the diff of tests/golden/:

    CBSITE_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_generator_golden.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import altair as alt
import pytest

from cbsite.generator import build_site
from tests.helpers.site_archives import write_golden_archive

GOLDEN = Path(__file__).parent / "golden"
REGEN = os.environ.get("CBSITE_REGEN_GOLDEN") == "1"
RUN = "runs/dlrm/v2/20250102T000000Z-00000b"
DIFF = "diffs/dlrm/v1/v2"
FILES = {
    "run_page.md": f"docs/{RUN}/index.md",
    "run_components.json": f"docs/{RUN}/components.json",
    "diff_page.md": f"docs/{DIFF}/index.md",
    "diff.json": f"docs/{DIFF}/diff.json",
    "diff_forward.json": f"docs/{DIFF}/diff.forward.json",
    "diff_backward.json": f"docs/{DIFF}/diff.backward.json",
    "diff_charts.json": f"docs/{DIFF}/charts.json",
    "model_page.md": "docs/models/dlrm/index.md",
    "home.md": "docs/index.md",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("golden")
    runs = write_golden_archive(base / "runs")
    build_site(runs, base / "site", project_dir=base / "project", quiet=True,
               config=Path(__file__).parents[1] / "cbsite" / "generator" / "templates" / "mkdocs.defaults.yml")
    return base / "project"


@pytest.mark.parametrize("name", sorted(FILES))
def test_golden(project, name):
    produced = (project / FILES[name]).read_text()
    golden = GOLDEN / name
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(produced)
    assert golden.exists(), f"missing {golden}: run CBSITE_REGEN_GOLDEN=1 .venv/bin/python -m pytest {__file__}"
    assert produced == golden.read_text(), f"{name} differs from {golden}; if intended, regenerate (see module docstring)"


def test_golden_chart_specs_are_valid_vega_lite(project):
    """The build skips Altair's validation for speed; the golden specs are validated here: the diff's contributors
    as the page holds them (Vega-Lite), the trends as the Vega-Lite they are compiled from (every chart and layer:
    band, lines, points, step throughput) and as the Vega the page holds, which draws."""
    import json

    import vl_convert

    from cbsite.generator import charts
    from tests.helpers.site_archives import golden_runs

    diff = json.loads((project / FILES["diff_charts.json"]).read_text())
    assert diff
    for spec in diff.values():
        alt.Chart.from_dict({"$schema": alt.SCHEMA_URL, **spec})
    runs = golden_runs()
    versions = sorted({r.version for r in runs})
    totals = {r.run_id: {"forward": {"latency_ms": 2.0, "latency_p25_ms": 1.9, "latency_p75_ms": 2.2, "flops": 4e9,
                                     "param_bytes": 1e6, "peak_memory_bytes": 1e7},
                         "backward": {"latency_ms": 4.0, "flops": 8e9, "peak_memory_bytes": 2e7}} for r in runs}
    for r in runs:
        r.meta["step"] = {"batch_size": 8, **{mode: {"status": "measured", "ms": 3.0, "p25_ms": 2.8, "p75_ms": 3.3,
                                                     "examples_per_s": 2666.0} for mode in ("train", "eval")}}
    newest = {max(r.run_id for r in runs if r.version == v) for v in versions}
    sources = {**charts.trend_charts(versions, runs, newest, totals), **charts.step_trend_charts(versions, runs, newest)}
    assert set(sources) == {"latency_ms", "flops", "param_bytes", "peak_memory_bytes", "step_ms", "examples_per_s"}
    assert [len(sources[m]["layer"]) for m in ("latency_ms", "flops", "step_ms")] == [3, 2, 3]  # the band where p25-p75
    for spec in sources.values():
        alt.LayerChart.from_dict(spec)
    trends = json.loads((project / "docs/models/dlrm/trends.json").read_text())
    assert trends
    for spec in trends.values():
        assert "<path" in vl_convert.vega_to_svg(spec)  # valid Vega: it draws its marks


def test_golden_diff_page_says_what_changed(project):
    text = (project / FILES["diff_page.md"]).read_text()
    # The planted change (a 4x bigger embedding table) is attributed to its leaf, and shown as a ratio.
    assert "of the parameter memory growth" in text and "is in embedding.tables.t_cat_0" in text
    assert re.search(r"<strong>\d\.\d×</strong>", text)
