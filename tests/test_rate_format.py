"""One rate format: examples per second read "49080 examples/s" on the run page, "28460/s" on
the model page and "1e+03k examples/s" in the diff summary at 999.6k (`throughput.format_rate` used `.3g`).
Now `cbsite.format.rate` (a core module: `cbsite.throughput` may not import the generator) is the one rule,
`cfmt.fmt_rate` and format.js `rate` the same; and the torch.compile line gives 3 digits and its direction."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import polars as pl
import pytest

from cbsite import format as cfmt
from cbsite.generator import build_site
from tests.helpers.runfactory import make_run, write_archive

FORMAT_JS = Path(__file__).resolve().parents[1] / "cbsite" / "generator" / "templates" / "assets" / "format.js"
VALUES = [0, 7, 168.3, 999.6, 9381, 49080, 442200, 999600, 1.2e6, -49080]


def test_throughput_writes_rates_as_the_site_does():
    assert cfmt.examples_rate(999_600) == "1M examples/s"  # once "1e+03k examples/s"
    assert cfmt.examples_rate(999.6) == "1k examples/s" and cfmt.examples_rate(49080) == "49.1k examples/s"
    assert cfmt.examples_rate(None) == "n/a"
    for v in VALUES:
        assert cfmt.examples_rate(v) == f"{cfmt.fmt_rate(v)} examples/s" == f"{cfmt.rate(v)} examples/s"


def test_throughput_imports_no_generator():
    code = "import sys, cbsite.throughput, cbsite.format; print([m for m in sys.modules if m.startswith('cbsite.generator')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_speedup_and_ms_range():
    assert cfmt.fmt_speedup(0.7734) == "0.773\u00d7 (slower)" and cfmt.fmt_speedup(1.2949) == "1.29\u00d7 (faster)"
    assert cfmt.fmt_speedup(0.9996) == "1\u00d7 (no change)" and cfmt.fmt_speedup(None) == cfmt.DASH
    assert cfmt.fmt_ms_range(4.235, 6.063) == "4.24\u20136.06 ms" and cfmt.fmt_ms_range(950, 1200) == "950 ms\u20131.2 s"
    assert cfmt.fmt_ms_range(None, 2) == cfmt.DASH


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("rate")
    spec = {"": {"a": None, "b": None}}
    runs = []
    for version, eps in (("v1", 49080.0), ("v2", 28460.0)):
        run = make_run(spec, model="r", version=version)
        rows = run.rows.to_dicts()
        for r in rows:
            r["compile_speedup"] = {"": 0.7734, "a": 1.2949, "b": 0.5}[r["path"]]
            r["compiled_latency_ms"] = 0.1
        run.rows = pl.DataFrame(rows, schema=run.rows.schema)
        run.meta["step"] = {
            "batch_size": 64, "rounds": 1, "optimizer": {"name": "SGD"},
            "train": {"status": "measured", "ms": 5.1, "p25_ms": 4.235, "p75_ms": 6.063, "examples_per_s": eps},
            "eval": {"status": "measured", "ms": 0.2, "p25_ms": 0.19, "p75_ms": 0.21, "examples_per_s": 442200.0},
        }
        runs.append(run)
    write_archive(base / "runs", runs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(base / "runs", base / "site", project_dir=base / "project", quiet=True)
    return base / "project" / "docs"


def test_run_page_step_and_compile_lines(site):
    page = next((site / "runs" / "r" / "v1").glob("*/index.md")).read_text()
    assert "train step: 5.1 ms/iter (4.24\u20136.06 ms), 49.1k examples/s" in page  # once "49080 examples/s"
    assert "eval forward: 0.2 ms/iter (0.19\u20130.21 ms), 442k examples/s" in page
    assert "whole model compiled <strong>0.773\u00d7 (slower)</strong>" in page  # once "1.293× slower"
    assert "<code>a</code> 1.29\u00d7 (faster)" in page and "<code>b</code> 0.5\u00d7 (slower)" in page


def test_model_page_step_cells(site):
    page = (site / "models" / "r" / "index.md").read_text()
    # Once "(4.235–6.063) · 28460/s"; a line breaks between the three parts only, never inside "4.24–6.06 ms".
    cell = re.sub(r"<[^>]+>", "", page[page.index('<td class="cbsite-step"'):].split("</td>", 1)[0] + "</td>")
    assert "5.1 ms (4.24\u20136.06 ms) \u00b7 28.5k examples/s" in cell
    assert '<span style="white-space:nowrap">(4.24\u20136.06 ms)</span>' in page
    assert "49.1k examples/s" in page and "/s</td>" not in page.replace("examples/s</td>", "")


def test_diff_summary_rates(site):
    diff = (site / "diffs" / "r" / "v1" / "v2" / "index.md").read_text()
    assert "train 49.1k \u2192 28.5k examples/s" in diff


def test_rate_is_one_format_in_python_and_javascript():
    """Examples per second: the run page wrote "49080 examples/s" and "442200 examples/s", the model page
    "168.3/s", the diff summary "49.1k"; `rate` is the one form, "49.1k", in both languages."""
    values = [None, 0, 7, 168.3, 999.6, 9381, 49080, 442200, 999600, 1.2e6, -49080]
    assert [cfmt.fmt_rate(v) for v in values] == [cfmt.DASH, "0", "7", "168", "1k", "9.38k", "49.1k", "442k", "1M",
                                                  "1.2M", "-49.1k"]
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = ("const F = require(process.argv[1]); const v = JSON.parse(process.argv[2]);"
              "process.stdout.write(JSON.stringify(v.map(x => F.rate(x))))")
    out = subprocess.run([node, "-e", script, str(FORMAT_JS), json.dumps(values)],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [cfmt.fmt_rate(v) for v in values]
