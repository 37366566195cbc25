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
    """The build skips Altair's validation for speed; the golden specs are validated here."""
    import json

    specs = json.loads((project / FILES["diff_charts.json"]).read_text())
    specs.update(json.loads((project / "docs/models/dlrm/trends.json").read_text()))
    assert specs
    for spec in specs.values():
        alt.Chart.from_dict({"$schema": alt.SCHEMA_URL, **spec}) if "layer" not in spec else alt.LayerChart.from_dict(spec)


def test_golden_diff_page_says_what_changed(project):
    text = (project / FILES["diff_page.md"]).read_text()
    # The planted change (a 4x bigger embedding table) is attributed to its leaf, and shown as a ratio.
    assert "of the parameter memory growth" in text and "is in embedding.tables.t_cat_0" in text
    assert re.search(r"<strong>\d\.\d×</strong>", text)
