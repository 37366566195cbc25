"""Study pages: a built site (real MkDocs) shows each study's charts per axis, its points and configuration;
in a real browser (Debian's chromium) the charts are drawn with no console error and the log scale redraws them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from cbsite import schema
from cbsite import study as cstudy
from cbsite.generator import build_site
from tests.helpers.runfactory import make_run, write_archive

SPEC = {"": {"sparse_arch": {"sparse_arch.ebc": None}, "dense_arch": None, "over_arch": None}}
TYPES = {"sparse_arch": "torchrec.models.dlrm.SparseArch", "dense_arch": "torchrec.models.dlrm.DenseArch",
         "over_arch": "torchrec.models.dlrm.OverArch", "sparse_arch.ebc": "torchrec.EmbeddingBagCollection"}


# The archive's repeats: the dense_features=64 points collected with 4 rounds (every component's round medians
# these factors of its latency: the median of the medians is the latency), one point run twice (the older run's
# DenseArch 1.5x slower), the others measured once.
ROUND_FACTORS = (0.9, 1.0, 1.0, 1.2)
TWICE = "dense_features-512.sparse_features-4"
SINGLE = "dense_features-4096.sparse_features-4"


def _round_samples(run, factors) -> pl.DataFrame:
    """Blocks of len(factors) rounds per measured (path, phase): 6 clean blocks a round at factor x its latency."""
    rows = []
    for r in run.rows.filter(pl.col("status") == "measured").iter_rows(named=True):
        for rnd, factor in enumerate(factors):
            rows += [{"run_id": run.run_id, "model": run.model, "version": run.version, "session_id": run.run_id,
                      "path": r["path"], "key": r["path"], "phase": r["phase"], "process": rnd, "round": rnd, "pair": b,
                      "arm": "run", "position": 0, "seconds_per_call": r["latency_ms"] / 1e3 * factor * (1 + 0.001 * (b - 2)),
                      "calls": 10, "start_s": 1.7e9 + rnd, "wait_s": 0.0, "contended": False} for b in range(5)]
    return pl.from_arrow(pl.DataFrame(rows).to_arrow().cast(schema.SAMPLES_SCHEMA))


def _study_archive(root: Path) -> None:
    study = cstudy.Study.from_grid("dlrm-grid", "dlrm-synthetic", ["dense_features=64,512,4096", "sparse_features=4,32"],
                                   base_options={"size": "tiny"})
    runs = []
    for p in study.points:
        for older in ((True, False) if p.label == TWICE else (False,)):
            scale = p.options["dense_features"] / 64 * (1 + p.options["sparse_features"] / 32)
            metrics = {path: {"module_type": t} for path, t in TYPES.items()}
            metrics["dense_arch"].update(latency_ms=0.01 * scale * (1.5 if older else 1), flops=1000 * scale)
            metrics["sparse_arch.ebc"].update(latency_ms=0.02 * p.options["sparse_features"])
            run = make_run(SPEC, model=study.model, version=p.label, metrics=metrics, tags=study.tags(p),
                           config={"batch_size": 8})
            run.meta["study"] = study.run_meta(p)
            run.meta["step"] = {"batch_size": 8, "train": {"status": "measured", "examples_per_s": 8000 / scale},
                                "eval": {"status": "measured", "examples_per_s": 30000 / scale}}
            if p.options["dense_features"] == 64:
                run.samples = _round_samples(run, ROUND_FACTORS)
                run.meta["rounds"] = len(ROUND_FACTORS)
            if p.label != "dense_features-4096.sparse_features-32":  # one point failed: no run
                runs.append(run)
    write_archive(root, runs)
    record = cstudy.new_record(study, study.points, {r.version: {"run_id": r.run_id, "path": "x"} for r in runs},
                               {"executor": "local"})
    cstudy.update_point(record, "dense_features-4096.sparse_features-32", status="failed", error="MemoryError: planted")
    record["executor"] = {"executor": "local", "folder": "/secret/local/path"}
    cstudy.write_record(root, record)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("study-site")
    _study_archive(base / "runs")
    site = build_site(base / "runs", base / "site", quiet=True)
    return site


def test_study_page_has_charts_per_axis_points_and_configuration(built):
    from tests.helpers import vega_specs

    page = (built / "studies" / "dlrm-grid" / "index.html").read_text()
    specs = json.loads((built / "studies" / "dlrm-grid" / "charts.json").read_text())
    for axis in ("dense_features", "sparse_features"):
        for metric in ("latency_forward_ms", "examples_per_s", "mfu", "param_bytes"):
            assert {"linear", "log"} <= set(specs[f"{axis}|{metric}"])
        assert f'data-cbsite-study-chart="{axis}|latency_forward_ms"' in page
    spec = specs["dense_features|latency_forward_ms"]
    # One line per series (the model and each component class); one panel per value of the other axis.
    series = {r["series"] for r in vega_specs.rows(spec["linear"])}
    assert {"model", "SparseArch", "DenseArch", "OverArch"} <= series
    assert {r["held"] for r in vega_specs.rows(spec["linear"])} == {"sparse_features=4", "sparse_features=32"}
    assert vega_specs.scale(spec["log"], "y")["type"] == "log" and vega_specs.scale(spec["linear"], "y")["type"] == "linear"
    assert vega_specs.facet_order(spec["linear"]) == ["sparse_features=4", "sparse_features=32"]  # the grid's order, not text order
    # Examples/s: the whole model's step timing apart from the forward alone of the model and its parts, each series
    # saying what it measures (its tooltip too).
    step = vega_specs.rows(specs["sparse_features|step_examples_per_s"]["linear"])
    assert {r["series"] for r in step} == {"model: training step", "model: eval forward"}
    assert sorted(r["value"] for r in step if r["series"] == "model: training step") == pytest.approx(sorted(
        8000 / (d / 64 * (1 + f / 32)) for d in (64, 512, 4096) for f in (4, 32) if (d, f) != (4096, 32)))  # the runs' step
    forward = vega_specs.rows(specs["sparse_features|examples_per_s"]["linear"])
    assert {r["series"] for r in forward} == {"model: forward", "SparseArch: forward", "DenseArch: forward", "OverArch: forward"}
    assert all("forward of" in r["measures"] for r in forward) and all("step timing" in r["measures"] for r in step)
    tips = [vega_specs.tooltip_keys(m) for m in vega_specs.drawn(specs["sparse_features|examples_per_s"]["linear"])]
    assert tips == [["point", "series", "measures", "examples/s", "spread"]] * 3, tips  # line, points, spread bars
    # The table links every done point's run and says why the failed one has none.
    assert page.count('href="../../runs/dlrm-grid/') == 5
    assert "MemoryError: planted" in page and "failed" in page
    assert "/secret/local/path" not in page
    # The configuration as key = value rows, not JSON.
    # (the key is a path: it may break only after its dot, hence the <wbr>)
    assert ('<li><code><span class="cbsite-path">grid.<wbr>dense_features</span></code> = '
            '<span class="value">64, 512, 4096</span></li>') in page
    assert "&#34;grid&#34;" not in page.replace("&quot;", "&#34;") and "<pre>" not in page
    nav = (built / "index.html").read_text()
    assert "studies/dlrm-grid/" in nav


def test_study_charts_draw_the_spread_of_rounds_and_runs(built):
    """A point with rounds carries the min-max of its rounds' figures, one run twice that of its runs; the chart
    draws them as rule bars and its tooltip gives the interval and the number of repeats; a point measured once
    has none, and the page says how many such points there are."""
    from cbsite.generator import studydata
    from tests.helpers import vega_specs

    specs = json.loads((built / "studies" / "dlrm-grid" / "charts.json").read_text())
    spec = specs["sparse_features|latency_forward_ms"]["linear"]
    rows = {(r["label"], r["series"]): r for r in vega_specs.rows(spec)}
    # Rounds: the model (an estimated root, summed again per round) spans the lowest to the highest factor.
    model = rows[("dense_features-64.sparse_features-4", "model")]
    assert (model["lo"], model["hi"]) == pytest.approx((min(ROUND_FACTORS) * model["value"], max(ROUND_FACTORS) * model["value"]))
    assert model["interval"].endswith("min\u2013max of 4 rounds") and " ms" in model["interval"]
    assert model["lo"] <= model["value"] <= model["hi"]
    # Runs: the point run twice spans its two runs' DenseArch latency (the older 1.5x); the newest stands for it.
    dense = rows[(TWICE, "DenseArch")]
    assert (dense["lo"], dense["hi"]) == pytest.approx((dense["value"], 1.5 * dense["value"]))
    assert dense["interval"].endswith("of 2 runs")
    # Once: no bar, and the tooltip says so.
    single = rows[(SINGLE, "model")]
    assert "lo" not in single and single["interval"] == studydata.NO_SPREAD
    # Drawn: rules from lo to hi over the lines and their points, in the series' colours; the tooltip's last line
    # is the spread.
    line, points, rule = vega_specs.drawn(spec)
    assert (line["type"], points["type"], rule["type"]) == ("line", "symbol", "rule")
    enc = vega_specs.encoding(rule)
    assert (enc["y"]["field"], enc["y2"]["field"]) == ("lo", "hi")
    assert enc["stroke"] == vega_specs.encoding(line)["stroke"] == {"field": "series", "scale": "color"}
    colours = vega_specs.scale(spec, "color")
    assert set(colours["domain"]) == {r["series"] for r in rows.values()} and len(colours["range"]) == len(colours["domain"])
    assert vega_specs.tooltip_keys(line)[-1] == "spread" and '"spread": isValid(datum["interval"])' in vega_specs.encoding(line)["tooltip"]["signal"]
    # Rounds re-time, they do not re-measure memory or count parameters: no spread there from rounds.
    memory = vega_specs.rows(specs["sparse_features|peak_memory_bytes"]["linear"])
    assert not [r for r in memory if "lo" in r and r["label"] != TWICE]
    assert not any("lo" in r for r in vega_specs.rows(specs["sparse_features|param_bytes"]["linear"]))
    page = (built / "studies" / "dlrm-grid" / "index.html").read_text()
    assert "its runs where the point was run more than once (1), else its rounds, <code>--rounds N</code> (2); " \
           "2 of 5 points measured once have no bar." in page


def test_study_charts_sum_component_classes():
    from cbsite.generator import studydata

    run = make_run(SPEC, metrics={**{p: {"module_type": t} for p, t in TYPES.items()},
                                  "dense_arch": {"module_type": TYPES["dense_arch"], "latency_ms": 2.0, "flops": 4e9}},
                   config={"batch_size": 8})
    figures = studydata.point_figures(run)
    dense = figures["DenseArch"]
    assert dense["latency_forward_ms"] == pytest.approx(2.0)
    assert dense["examples_per_s"] == pytest.approx(8 / 2e-3)
    assert dense["mfu"] == pytest.approx(4e9 / 2e-3 / 1e12)  # the run's peak (runfactory: 1e12)
    root = run.table("forward").filter(run.table("forward")["path"] == "")["latency_ms"][0]
    assert figures["model"]["examples_per_s"] == pytest.approx(8 / (root / 1e3))  # the model's forward, like its parts'
    assert figures["model"]["param_bytes"] == run.table("forward").filter(run.table("forward")["path"] == "")["param_bytes"][0]


@pytest.mark.browser
def test_study_page_draws_its_charts_in_a_browser(built, browser):
    from tests.helpers.browser import Server, draw_every, recording_page

    server = Server(built)
    try:
        with recording_page(browser, {"width": 1280, "height": 720}) as page:
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            outside: list[str] = []
            page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(server.url) else None)
            page.goto(server.url + "studies/dlrm-grid/")
            charts = page.locator("[data-cbsite-study-chart]")
            n = charts.count()
            assert n >= 10
            draw_every(page, "[data-cbsite-study-chart]", "svg .mark-line")  # each drawn as it nears the viewport
            # The spread of the points with rounds or several runs: rule bars, drawn with a visible height.
            chart = page.locator('[data-cbsite-study-chart="sparse_features|latency_forward_ms"]')
            chart.scroll_into_view_if_needed()  # charts are drawn as they near the viewport
            selector = '[data-cbsite-study-chart="sparse_features|latency_forward_ms"] svg .mark-rule.role-mark line'
            page.wait_for_function("(s) => document.querySelectorAll(s).length >= 3", arg=selector, timeout=30000)
            bars = page.locator(selector)
            # A vertical line has no width, so playwright never calls it visible: its box is checked instead, a bar
            # of some height inside the window, stroked (2 px wide) in its series' colour.
            boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
            tallest = max(boxes, key=lambda b: b["height"] if b else 0)
            assert tallest and tallest["height"] > 2, boxes
            assert 0 <= tallest["y"] and tallest["y"] + tallest["height"] <= page.viewport_size["height"], tallest
            assert bars.first.get_attribute("stroke-width") == "2" and (bars.first.get_attribute("stroke") or "").startswith("#")
            before = page.locator("[data-cbsite-study-chart] svg").first.inner_html()
            page.check("#cbsite-study-log")
            page.wait_for_function(
                "(b) => { const s = document.querySelector('[data-cbsite-study-chart] svg'); return s && s.innerHTML !== b; }",
                arg=before, timeout=30000)
            assert page.locator("[data-cbsite-study-chart] svg").count() == n
    finally:
        server.close()
    assert not errors, errors
    assert not outside, outside


def test_study_configuration_is_key_value_rows():
    from cbsite.generator.studydata import config_rows

    rows = config_rows({"grid": [{"key": "dense_features", "values": [64, 512]}], "settings": {"request": {"seed": 0, "tags": []},
                        "options": {}}, "executor": {"core_sets": [[0, 1]]}, "zip": False})
    assert rows == [("executor.core_sets.0", [0, 1]), ("grid.dense_features", [64, 512]), ("settings.options", None),
                    ("settings.request.seed", 0), ("settings.request.tags", None), ("zip", False)]
