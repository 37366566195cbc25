"""Readability of the generator's data: what bounds each component, the roofline, the key facts a run page
leads with, the setup changes a diff page leads with, shares only where they mean something, search that
finds a component by its full path. The browser side is tests/test_browser_readability.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbsite import bound, provenance
from cbsite import format as cfmt
from cbsite.generator import build_site, diffdata, rundata
from tests.helpers.runfactory import make_run, write_archive
from tests.helpers.site_archives import readable_archive, synthetic_run


def test_bound_labels_follow_the_roofline():
    assert bound.classify(0.6, 0.2) == "compute"
    assert bound.classify(0.05, 0.4) == "memory"
    assert bound.classify(0.03, 0.05) == "overhead"  # the roofline explains under 10 % of the time
    assert bound.classify(None, 0.3) == "memory"  # a FLOP-free module (ReLU, LayerNorm)
    assert bound.classify(None, None) is None  # nothing to place on a roofline
    assert bound.classify(0.8, 0.1, latency_ms=1.0, device_time_ms=0.2) == "overhead"  # the GPU idles
    assert bound.classify(2.27, 0.1) == "compute"  # a suspect MFU still says which roof is nearer
    meta = {"dtype": "float32", "device": {"peak_flops": {"float32": 2e11}, "peak_bandwidth": 2e10}}
    assert bound.peaks(meta) == (2e11, 2e10) and bound.ridge(meta) == 10.0


_NUMBER = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3),
                    st.sampled_from([0.0, -0.0, 0.05, 0.1, 0.5, 1.0, 1.5]))
_ROW = st.tuples(_NUMBER, _NUMBER, _NUMBER, _NUMBER)
_ODD_ROW = st.tuples(*[st.one_of(_NUMBER, st.booleans(), st.just("1"))] * 4)  # the row-wise rules decide these


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(_ROW, max_size=12), st.lists(_ODD_ROW, max_size=4)))
def test_labels_of_whole_columns_are_the_rows_own(rows):
    """The build labels columns at once (numpy); each label is `classify` of its row, and a row beats a peak exactly
    where one of its ratios is a number above 1, whatever the columns hold (None, NaN, infinities, ints, bools)."""
    cols = [list(c) for c in zip(*rows)] if rows else [[], [], [], []]
    assert bound.classify_columns(*cols) == [bound.classify(*row) for row in rows]
    assert bound.above_a_peak(cols[0], cols[1]) == [any(isinstance(v, (int, float)) and v > 1 for v in row[:2])
                                                   for row in rows]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    base = tmp_path_factory.mktemp("readable")
    runs = base / "runs"
    readable_archive(runs)
    spec = {"": {"emb": None, "mlp": {"mlp.0": None, "mlp.1": None}}}
    a = make_run(spec, model="cfg", version="v1", run_id="20250301T000000Z-0000d1")
    b = make_run(spec, model="cfg", version="v2", run_id="20250302T000000Z-0000d2",
                 metrics={"emb": {"param_bytes": 8000}})
    a.meta["provider"] = {"name": "dlrm", "options": {"embedding_dim": 32, "num_tables": 8}}
    b.meta["provider"] = {"name": "dlrm", "options": {"embedding_dim": 64, "num_tables": 8}}
    a.meta["wall_time_s"], b.meta["wall_time_s"] = 10.0, 12.0
    a.meta["device"]["load_average"], b.meta["device"]["load_average"] = [1.0], [2.0]
    write_archive(runs, [a, b])
    site = build_site(runs, base / "site", project_dir=base / "project", quiet=True)
    return runs, site, base / "project" / "docs"


def _run_dir(site: Path, model: str, version: str) -> Path:
    return next((site / "runs" / model / version).iterdir())


def test_components_json_labels_each_component_by_what_bounds_it(built):
    _, site, _ = built
    data = json.loads((_run_dir(site, "toy", "v1") / "components.json").read_text())
    for phase in data["phases"]:
        cols = data[phase]
        assert cols["bound"] == [bound.classify(m, b, lat, g) for m, b, lat, g in zip(
            cols["mfu"], cols["bandwidth_util"], cols["latency_ms"], cols["device_time_ms"])]
        assert {"compute", "memory"} <= set(cols["bound"])
    assert data["roofline"] == {"peak_flops": 2e11, "peak_bandwidth": 2e10, "ridge": 10.0}


def test_roofline_chart_has_the_roofs_the_ridge_and_clickable_points(built):
    _, site, _ = built
    folder = _run_dir(site, "toy", "v1")
    data = json.loads((folder / "roofline.json").read_text())["roofline"]
    roof, points = data["roof"], data["points"]
    assert [q[1] for q in roof][1:] == [2e11, 2e11]  # flat at peak FLOP/s from the ridge on
    assert roof[1][0] == 10.0 and data["ridge"] == 10.0
    assert roof[0][1] == pytest.approx(roof[0][0] * 2e10)  # the bandwidth roof below the ridge
    assert data["x"][0] <= roof[0][0] and roof[2][0] == data["x"][1]  # drawn from where it enters to the right edge
    assert len(points["path"]) > 5 and all(len(col) == len(points["path"]) for col in points.values())
    assert set(points["bound"]) <= set(bound.BOUNDS)
    assert list(data["bounds"]) == list(bound.BOUNDS)
    assert all(data["x"][0] < ai < data["x"][1] for ai in points["ai"])
    page = (folder / "index.html").read_text()
    # Drawn by roofline.js as SVG: the run page loads no Vega at all.
    assert 'data-cbsite-roofline="roofline.json"' in page and "roofline.js" in page
    assert "vega.js" not in page and "charts.js" not in page


def test_run_page_leads_with_both_phases_slowest_bounds_and_notes(built):
    runs, site, docs = built
    url = _run_dir(site, "toy", "v1").relative_to(site)
    page = (docs / url / "index.md").read_text()
    assert page.index('id="icicle"') < page.index('id="facts"') < page.index('id="components"') < page.index('id="environment"')
    facts = page[page.index('id="facts"'):page.index('id="components"')]
    assert "Slowest components (forward)" in facts and "Slowest components (backward)" in facts
    assert re.search(r"Leaf time .*compute.*%", facts)
    # Totals: FLOP/s with a unit prefix, never TFLOP/s as 0.0008833.
    totals = page[page.index("cbsite-totals"):page.index("</table>", page.index("cbsite-totals"))]
    assert re.search(r"\d GFLOP/s", totals) and "TFLOP/s" not in totals


def test_key_facts_group_notes_and_summarise_compile():
    spec = {"": {"a": None, "b": None, "c": None}}
    run = make_run(spec, model="k", version="v1", run_id="20250401T000000Z-0000e1",
                   metrics={"c": {"latency_ms": 0.5}}, phase_metrics={"backward": {"c": {"latency_ms": 3.0}}})
    rows = run.rows.to_dicts()
    for r in rows:
        if r["path"] in ("a", "b") and r["phase"] == "backward":
            r["notes"] = ["dense embedding gradient: backward writes whole tables"]
        if r["path"] == "c":
            r["notes"] = ["estimated: sum of children"]  # routine: said by the status already
        r["compile_speedup"] = {"": 1.5, "a": 2.0, "b": 0.5, "c": 1.1}[r["path"]]
        r["compiled_latency_ms"] = 0.1
    import polars as pl

    run.rows = pl.DataFrame(rows, schema=run.rows.schema)
    comps = rundata.components_json(run, [])
    facts = rundata.key_facts(comps)
    assert set(facts["slowest"]) == {"forward", "backward"}
    assert facts["slowest"]["backward"][0]["path"] == "c"  # backward has its own list
    assert facts["notes"] == [{"note": "dense embedding gradient: backward writes whole tables",
                               "where": ["a (backward)", "b (backward)"], "more": 0}]
    fwd = facts["compile"]["forward"]
    assert fwd["model"] == 1.5 and fwd["best"][0]["path"] == "a" and fwd["worst"][0]["path"] == "b"


def test_setup_changes_name_what_differs_and_skip_timings():
    a = {"provider": {"name": "dlrm", "options": {"embedding_dim": 32, "sizes": [128, 32]}},
         "config": {"batch_size": 128, "plugins": {"compile": {"seconds": 110.3}}},
         "device": {"load_average": [1.0], "peak_flops": {"float32": 1.1e11}, "peak_source": {"flops": "calibrated"},
                    "calibration": {"end": {"flops": 1.1e11, "repeats": [{"flops": 1.0e11}]}}},
         "versions": {"torch": "2.5"}, "preprocessing": [{"step": "eval", "params": {}}]}
    b = {"provider": {"name": "dlrm", "options": {"embedding_dim": 64, "sizes": [128, 64]}},
         "config": {"batch_size": 256, "plugins": {"compile": {"seconds": 108.9}}},
         "device": {"load_average": [2.0], "peak_flops": {"float32": 2.0e11}, "peak_source": {"flops": "given"},
                    "calibration": {"end": {"flops": 1.2e11, "repeats": [{"flops": 0.9e11}]}}},
         "versions": {"torch": "2.6"}, "preprocessing": [{"step": "eval", "params": {}}, {"step": "half", "params": {}}]}
    changes = provenance.setup_changes(a, b)
    assert [(c["key"], c["base"], c["head"]) for c in changes] == [
        ("provider.options.embedding_dim", "32", "64"),
        ("provider.options.sizes", "[128, 32]", "[128, 64]"),
        ("preprocessing[1].params", None, "{}"),
        ("preprocessing[1].step", None, "half"),
        ("config.batch_size", "128", "256"),
        ("device.peak_source.flops", "calibrated", "given"),  # measured peaks are not setup; giving one is
        ("versions.torch", "2.5", "2.6"),
    ]


def test_diff_page_leads_with_the_setup_change(built):
    _, _, docs = built
    page = (docs / "diffs/cfg/v1/v2/index.md").read_text()
    setup = page[page.index('id="setup"'):page.index('id="totals"')]
    assert "<code>provider.options.embedding_dim</code></td><td>32</td><td>64</td>" in setup
    assert "wall_time" not in setup and "load_average" not in setup
    same = (docs / "diffs/dlrm/v1/v2/index.md").read_text()
    assert "The same setup" in same[same.index('id="setup"'):same.index('id="totals"')]


def test_shares_only_where_they_mean_something(built):
    _, _, docs = built
    data = diffdata.read_diff(docs / "diffs/toy/v1/v2")
    for phase in data["phases"]:
        cols = data[phase]
        assert "peak_memory_bytes" not in cols["share"]  # maxima do not add up: no share column
        for k, noise in enumerate(cols["noise"]["latency_ms"]):
            if noise:  # a latency change within noise gets no share
                assert cols["share"]["latency_ms"][k] is None
    page = (docs / "diffs/toy/v1/v2/index.md").read_text()
    # A change word follows the metric's own sign: never "increased: −0.05 ms".
    assert not re.search(r"increased: \u2212", page) and not re.search(r"grew: \u2212", page)
    assert not re.search(r"shrank: \+", page)


def test_search_indexes_full_paths_without_splitting_names(built):
    _, site, _ = built
    index = json.loads((site / "search" / "search_index.json").read_text())
    assert "_" not in index["config"]["separator"] and "\\." in index["config"]["separator"]
    run = _run_dir(site, "toy", "v2")
    # Every path of the newest run is its own search entry (a heading `find=PATH`), titled by the whole path.
    prefix = str(run.relative_to(site)) + "/#find="
    titles = {d["title"] for d in index["docs"] if d["location"].startswith(prefix)}
    data = json.loads((run / "components.json").read_text())
    assert titles == {p for p in data["path"] if p}
    home = next(d for d in index["docs"] if d["location"] == "#changes")
    summary = (site / "index.html").read_text().replace("<wbr>", "")  # paths carry break points after their dots
    assert "embedding.tables.t_cat_0" in summary  # the golden diff's summary names it on the home page ...
    assert "embedding.tables.t_cat_0" not in home["text"]  # ... out of the index: run pages rank first
    assert "assets/cbsite/site.js" in (site / "index.html").read_text()


def _never_exponent(fmt: str) -> bool:
    """A d3-format whose type never writes exponent notation: SI prefixes, decimals, percentages (not e, g or none)."""
    return re.fullmatch(r"[^a-z%]*[srf%d]", fmt) is not None


def test_charts_read_at_a_glance(built):
    import vl_convert

    from tests.helpers import vega_specs

    _, site, docs = built
    trends = json.loads((site / "models" / "toy" / "trends.json").read_text())
    for metric, spec in trends.items():
        assert "<svg" in vl_convert.vega_to_svg(spec)  # valid Vega: it draws
        (y,) = vega_specs.value_axes(spec, "y")
        assert y["format"] == (",.4~r" if metric == "latency_ms" else "~s")  # 40M, never 40,000,000
        assert _never_exponent(y["format"])  # "g" wrote a 10 ms tick as "1e+1"
        (x,) = vega_specs.value_axes(spec, "x")
        assert x["labelAngle"] == 0  # two versions: level labels, not 90 degrees
        assert spec["title"]["limit"] == 0  # a title is never cut
    band = vega_specs.drawn(trends["latency_ms"])[0]
    assert band["type"] == "area" and vega_specs.encoding(band)["y2"]["field"] == "hi"  # the spread of the runs
    charts = json.loads((docs / "diffs/toy/v1/v2/charts.json").read_text())
    assert charts["flops"]["encoding"]["x"]["axis"]["format"] == "~s"
    assert charts["latency_ms"]["encoding"]["x"]["axis"]["format"] == ",.4~r"
    assert all(_never_exponent(c["encoding"]["x"]["axis"]["format"]) for c in charts.values())


def test_a_single_version_model_has_no_trend_charts(tmp_path):
    runs = tmp_path / "runs"
    synthetic_run(runs, "solo", "v1", n=20, seed=3)
    site = build_site(runs, tmp_path / "site", project_dir=tmp_path / "project", quiet=True)
    assert json.loads((site / "models" / "solo" / "trends.json").read_text()) == {}
    page = (tmp_path / "project" / "docs" / "models" / "solo" / "index.md").read_text()
    assert "a trend needs two" in page and "data-cbsite-chart" not in page and "vega.js" not in page


def test_one_number_format_in_python_and_javascript():
    """The templates' filters (cbsite/format.py) and the browser's format.js write every number the same way."""
    import shutil
    import subprocess


    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    values = [None, 0, 0.0, 1, 7, 999, 999.4, 999.6, 1000, 1234, 99949, 99950, 123456, 1e6 - 1, 40_000_000,
              2.5e9, 1.2345e12, 7.2e18, 0.5, 0.125, 1.125, 2.675, 0.0123, 0.000123, 1.23e-5, 3.3e-8, 12.345,
              -0.00179, -48.1, 0.9996, 1.0004, 0.2149, 0.00058789, 123.45, 9.995]
    fmt = Path(__file__).parents[1] / "cbsite" / "generator" / "templates" / "assets" / "format.js"
    script = ("const F = require(process.argv[1]); const v = JSON.parse(process.argv[2]);"
              "process.stdout.write(JSON.stringify(v.map(x => [F.flops(x), F.bytes(x), F.ms(x), F.pct(x), F.num(x),"
              " F.time(x), F.signed(x, F.time), F.signed(x, F.bytes), F.signed(x, F.flops)])))")
    values += [8.14e-5, -8.14e-5, 0.00099996, 0.0009994, 9.9996e-7, 4.2e-10, -0.0123, 1234.5, -0.9996]
    out = subprocess.run([node, "-e", script, str(fmt), json.dumps(values)], capture_output=True, text=True, check=True)
    js = json.loads(out.stdout)
    py = [[cfmt.fmt_flops(v), cfmt.fmt_bytes(v), cfmt.fmt_ms(v), cfmt.fmt_pct(v), cfmt.fmt_num(v),
           cfmt.fmt_time(v), cfmt.fmt_signed(v, "time"), cfmt.fmt_signed(v, "bytes"), cfmt.fmt_signed(v, "flops")]
          for v in values]
    assert js == py
    # A latency change prints in the unit that keeps it short (never "+0.0000814 ms").
    assert cfmt.fmt_signed(8.14e-5, "time") == "+81.4 ns" and cfmt.fmt_signed(-0.0123, "time") == "\u221212.3 \u00b5s"
    assert cfmt.fmt_time(0.00099996) == "1 \u00b5s" and cfmt.fmt_time(0.9996) == "1 ms" and cfmt.fmt_time(1234.5) == "1.23 s"
    assert cfmt.fmt_flops(999.6) == "1 kFLOP"  # one spelling, never "1e+03 FLOP" or "1000 FLOP"


def test_key_facts_rank_a_containers_own_time_only_where_the_numbers_nest():
    """A measured container's own time (the part no child covers) is ranked with the slowest leaves, with its
    share of the phase and the leaves' share beside the bound mix; a container slower than its parent gives none
    (independent timings that disagree: their difference is no one's)."""
    spec = {"": {"a": {"a.x": None, "a.y": None}, "b": None}}
    run = make_run(spec, model="k", version="v1", run_id="20250401T000000Z-0000e2",
                   metrics={"a": {"status": "measured", "latency_ms": 4.0}, "a.x": {"latency_ms": 0.5},
                            "a.y": {"latency_ms": 0.25}, "b": {"latency_ms": 1.0}, "": {"status": "measured"}})
    facts = rundata.key_facts(rundata.components_json(run, []))
    first = facts["slowest"]["forward"][0]
    assert first["path"] == "a" and first["own"] and first["latency"] == pytest.approx(4.0)
    assert first["share"] == pytest.approx(4.0 / 5.75) and first["bound"] is None
    assert facts["leaf_share"]["forward"] == pytest.approx(1.75 / 5.75)
    assert not any(c["own"] for c in facts["slowest"]["forward"][1:])  # the root's own time is 0
    comps = rundata.components_json(run, [])
    comps["forward"]["latency_ms"][0] = 2.0  # the root now faster than its child a: nothing nests under it
    assert not any(c["own"] for c in rundata.key_facts(comps)["slowest"]["forward"])
