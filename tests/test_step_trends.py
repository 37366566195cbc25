"""Step throughput on the site: the model page's trends chart the whole model's ms per training
iteration (with its p25-p75 band) and per inference forward, and examples per second, per version; the
versions table, the run summary and the diff summary give the figures."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from cbsite.generator import build_site
from tests.helpers.site_archives import synthetic_run


def _with_step(folder: Path, train_ms: float, eval_ms: float, batch: int = 64) -> None:
    """Give a synthetic run the step record the collector writes (cbsite/collector/step.py)."""
    meta = json.loads((folder / "run.json").read_text())
    meta["step"] = {
        "batch_size": batch, "rounds": 1, "optimizer": {"name": "SGD", "lr": 0.0},
        "train": {"status": "measured", "ms": train_ms, "p25_ms": train_ms * 0.95, "p75_ms": train_ms * 1.1,
                  "examples_per_s": batch / train_ms * 1000},
        "eval": {"status": "measured", "ms": eval_ms, "p25_ms": eval_ms * 0.98, "p75_ms": eval_ms * 1.02,
                 "examples_per_s": batch / eval_ms * 1000},
    }
    (folder / "run.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
    base = tmp_path_factory.mktemp("step")
    runs = base / "runs"
    _with_step(synthetic_run(runs, "toy", "v1", seed=1, minutes=1), train_ms=2.0, eval_ms=0.5)
    _with_step(synthetic_run(runs, "toy", "v2", seed=2, minutes=2, scale=1.3), train_ms=2.5, eval_ms=0.4)
    synthetic_run(runs, "toy", "v3", seed=3, minutes=3)  # a run without a step record: no point, no error
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_site(runs, base / "site", quiet=True)
    return base / "site"


def test_the_model_trends_chart_step_throughput_per_version(stepped):
    from tests.helpers import vega_specs

    specs = json.loads((stepped / "models" / "toy" / "trends.json").read_text())
    assert {"step_ms", "examples_per_s"} <= set(specs)
    data = vega_specs.rows(specs["step_ms"])
    train = {r["version"]: r for r in data if r["phase"] == "train step"}
    assert set(train) == {"v1", "v2"} and train["v2"]["value"] == 2.5 and train["v2"]["lo"] == pytest.approx(2.375)
    assert {r["version"] for r in data if r["phase"] == "eval forward"} == {"v1", "v2"}
    assert "band: p25-p75" in specs["step_ms"]["title"]["text"]
    band = next(m for m in vega_specs.drawn(specs["step_ms"]) if m["type"] == "area")
    assert (vega_specs.encoding(band)["y"]["field"], vega_specs.encoding(band)["y2"]["field"]) == ("lo", "hi")
    rates = vega_specs.rows(specs["examples_per_s"])
    assert {(r["version"], r["phase"]): r["value"] for r in rates}[("v1", "train step")] == pytest.approx(32000)
    html = (stepped / "models" / "toy" / "index.html").read_text()
    assert 'data-cbsite-chart="step_ms"' in html and 'data-cbsite-chart="examples_per_s"' in html
    assert "2.5 ms (2.38–2.75 ms) · 25.6k examples/s" in re.sub(r"<[^>]+>", "", html)  # the versions table, v2's train step (once "(2.375–2.75) · 25600/s")


def test_run_and_diff_pages_give_the_step_figures(stepped):
    run_page = next((stepped / "runs" / "toy" / "v2").glob("*/index.html")).read_text()
    assert "train step: 2.5 ms/iter" in run_page and "eval forward: 0.4 ms/iter" in run_page
    diff_page = (stepped / "diffs" / "toy" / "v1" / "v2" / "index.html").read_text()
    assert "Step throughput: train" in diff_page


@pytest.mark.browser
def test_the_step_trends_are_drawn_in_the_browser(stepped, browser):
    from tests.helpers.browser import Server, recording_page

    server = Server(stepped)
    try:
        with recording_page(browser, {"width": 1400, "height": 1000}) as page:
            page.goto(server.url + "models/toy/")
            for key in ("step_ms", "examples_per_s"):
                page.wait_for_selector(f"[data-cbsite-chart='{key}'] svg", timeout=20000)
                # Drawn: a line per mode (train step, eval forward) with points, not an empty frame.
                assert page.locator(f"[data-cbsite-chart='{key}'] svg path").count() > 2
            legend = page.inner_text("[data-cbsite-chart='step_ms']")
            assert "train step" in legend and "eval forward" in legend
            assert page.errors == []
    finally:
        server.close()
