"""The site build end to end: real archives, a real MkDocs build, the files a browser would get."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cbsite.errors import CbsiteError
from cbsite.generator import SiteWarning, build_site
from tests.helpers.site_archives import HOSTILE, synthetic_run, write_golden_archive, write_hostile_run

MAX_PAGE_BYTES = 2 * 1024 * 1024


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("archive") / "runs"
    write_golden_archive(root)
    synthetic_run(root, "toy", "v1", n=30, seed=1, trace_every=4, ops=True)
    synthetic_run(root, "toy", "v2", n=34, seed=2, minutes=5, scale=1.2, trace_every=4)
    return root


@pytest.fixture(scope="module")
def built(archive, tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("built")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SiteWarning)  # a clean archive builds without a warning
        site = build_site(archive, base / "site", project_dir=base / "project", quiet=True)
    return site, base / "project"


def test_pages_and_data_files_exist(built, archive):
    from tests.helpers import vega_specs

    site, _ = built
    assert (site / "index.html").is_file()
    for model in ("dlrm", "toy"):
        assert (site / "models" / model / "index.html").is_file()
        latency = json.loads((site / "models" / model / "trends.json").read_text())["latency_ms"]
        assert {m["type"] for m in vega_specs.drawn(latency)} >= {"line", "symbol"} and vega_specs.rows(latency)
    run_dirs = sorted((site / "runs").glob("*/*/*"))
    assert len(run_dirs) == 4
    for d in run_dirs:
        for name in ("index.html", "components.json", "components.parquet", "components.csv"):
            assert (d / name).is_file(), d / name
        data = json.loads((d / "components.json").read_text())
        assert data["path"][0] == "" and data["parent"][0] == -1
        assert all(p < i for i, p in enumerate(data["parent"]))  # pre-order: the icicle relies on it
    for pair in ("dlrm/v1/v2", "toy/v1/v2"):
        page = site / "diffs" / pair / "index.html"
        assert page.is_file()
        assert json.loads((page.parent / "diff.json").read_text())["phases"] == ["forward", "backward"]


def test_run_page_links_artifacts_and_downloads(built):
    site, _ = built
    run_dir = next((site / "runs" / "toy" / "v1").iterdir())
    data = json.loads((run_dir / "components.json").read_text())
    traces = [t for t in data["forward"]["trace_file"] if t]
    assert traces, "the synthetic run has traces"
    for t in traces:  # every linked trace is in the site, a gzip of Chrome JSON
        assert json.loads(gzip.decompress((run_dir / t).read_bytes()))["traceEvents"]
    assert any(data["forward"]["log_file"])
    assert (run_dir / "ops.json").is_file()
    html = (run_dir / "index.html").read_text()
    assert 'data-ops="ops.json"' in html and 'href="components.parquet"' in html and 'href="components.csv"' in html
    assert 'data-perfetto-origin="https://ui.perfetto.dev"' in html
    csv = (run_dir / "components.csv").read_text().splitlines()
    assert csv[0].startswith("run_id,model,version,path") and len(csv) == 1 + 2 * len(data["path"])


def test_generated_project_passes_mkdocs_strict(built, tmp_path):
    _, project = built
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(project / "mkdocs.yml"), "-d", str(tmp_path / "s")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    cfg = (project / "mkdocs.yml").read_text()
    assert "font: false" in cfg and "offline" not in cfg
    # Only home and model pages in the nav: run pages would make it grow with the square of the pages.
    assert "runs/" not in cfg.split("nav:")[1]


def test_offline_no_external_resources(built):
    site, _ = built
    external = re.compile(r"""<(?:script|link|img|iframe)[^>]+(?:src|href)=["'](?:https?:)?//""")
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert not external.search(text), page
        assert "fonts.googleapis" not in text
        assert page.stat().st_size < MAX_PAGE_BYTES
    # Two bundles: the Vega runtime alone for the model and study pages' Vega charts, and Vega-Lite with vega-embed
    # for the diff page's contributors.
    vega = (site / "assets/cbsite/vega.js").read_text()
    assert "window.cbsiteVega=" in vega.replace(" ", "") and vega.startswith("/*")
    assert "vegaEmbed" not in vega and "vega-lite" not in vega
    vega_lite = (site / "assets/cbsite/vega-lite.js").read_text()
    assert "window.cbsiteVegaLite=" in vega_lite.replace(" ", "") and vega_lite.startswith("/*") and "vega-lite" in vega_lite


def test_search_splits_paths_and_skips_tables(built):
    site, _ = built
    index = json.loads((site / "search/search_index.json").read_text())
    # A path is one search term (its parts "0", "1" would match every run id's tail); a sentence's dot splits.
    words = [w for w in re.split(index["config"]["separator"], "over_arch.model.0._mlp.1._linear took 0.05 ms. Then") if w]
    assert words == ["over_arch.model.0._mlp.1._linear", "took", "0.05", "ms", "Then"]
    texts = " ".join(d["text"] for d in index["docs"])
    assert "embedding.tables.t_cat_0" in texts  # the hottest paths are in the run page's text
    assert "cbsite-table" not in texts and "Device, provider" not in texts


def test_build_is_deterministic(archive, built, tmp_path):
    site, _ = built
    again = build_site(archive, tmp_path / "again", quiet=True)
    assert _tree_digest(site) == _tree_digest(again)
    with gzip.open(site / "sitemap.xml.gz") as f:  # the gzip header's mtime is the newest run's, not now
        f.read()
    mtime = int.from_bytes((site / "sitemap.xml.gz").read_bytes()[4:8], "little")
    assert mtime < 1_800_000_000


def test_hostile_strings_are_escaped(tmp_path):
    runs = tmp_path / "runs"
    write_hostile_run(runs)
    site = build_site(runs, tmp_path / "site", quiet=True)
    pages = [site / "index.html", *site.glob("runs/*/*/*/index.html"), site / "models/hostile/index.html"]
    for page in pages:
        text = page.read_text()
        assert "<script>alert" not in text and "<img src=x" not in text, page
        assert 'href="http://evil.example"' not in text, page  # Markdown links in notes are not rendered
    run_page = next(site.glob("runs/*/*/*/index.html")).read_text()
    assert "&lt;script&gt;alert(" in run_page and "*stars* _under_" in run_page and "{{ jinja }}" in run_page
    data = json.loads(next(site.glob("runs/*/*/*/components.json")).read_text())
    assert HOSTILE in data["module_type"] and HOSTILE in data["forward"]["error"]  # JSON keeps the text as is


def test_broken_run_is_skipped_with_a_warning(tmp_path):
    runs = tmp_path / "runs"
    write_golden_archive(runs)
    good = synthetic_run(runs, "toy", "v1", n=10, seed=5)
    broken = synthetic_run(runs, "toy", "v2", n=10, seed=6, minutes=3)
    (broken / "components.parquet").write_bytes(b"not parquet")
    no_json = synthetic_run(runs, "toy", "v3", n=10, seed=7, minutes=6)
    (no_json / "run.json").unlink()
    with pytest.warns(SiteWarning) as record:
        site = build_site(runs, tmp_path / "site", quiet=True)
    messages = [str(w.message) for w in record]
    assert any("toy/v2" in m and "unreadable" in m for m in messages)
    assert any("toy/v3" in m and "run.json is missing" in m for m in messages)
    assert (site / "runs/toy/v1" / good.name / "index.html").is_file()
    assert not (site / "runs/toy/v2").exists()
    assert str(tmp_path) not in (site / "index.html").read_text()  # warnings name runs, not local paths


def test_empty_archive_says_how_to_collect(tmp_path):
    site = build_site(tmp_path / "no-runs-yet", tmp_path / "site", quiet=True)
    text = (site / "index.html").read_text()
    assert "cbsite collect dlrm --version v1" in text


def test_extra_diffs_and_user_errors(archive, tmp_path):
    v1 = next((archive / "toy" / "v1").iterdir()).name
    site = build_site(archive, tmp_path / "site", extra_diffs=[("dlrm@v1", f"{v1}")], quiet=True)
    assert list(site.glob("diffs/runs/*/*/index.html"))
    with pytest.raises(CbsiteError, match="no run matches"):
        build_site(archive, tmp_path / "s2", extra_diffs=[("dlrm@v9", "dlrm@v1")], quiet=True)
    bad = tmp_path / "mkdocs.yml"
    bad.write_text("site_name: x\nextra:\n  cbsite:\n    perfetto_origin: ftp://nope\n    colour: red\n")
    with pytest.raises(CbsiteError) as err:
        build_site(archive, tmp_path / "s3", config=bad, quiet=True)
    assert "extra.cbsite.colour" in str(err.value) and "ftp://nope" in str(err.value)  # every bad key at once
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("x")
    with pytest.raises(CbsiteError, match="does not look like a built site"):
        build_site(archive, tmp_path / "precious", quiet=True)


def test_perfetto_origin_from_config(archive, tmp_path):
    cfg = tmp_path / "mkdocs.yml"
    cfg.write_text("site_name: mine\nextra:\n  cbsite:\n    perfetto_origin: http://perfetto.internal:9000\n")
    site = build_site(archive, tmp_path / "site", config=cfg, quiet=True)
    page = next(site.glob("runs/toy/v1/*/index.html")).read_text()
    assert 'data-perfetto-origin="http://perfetto.internal:9000"' in page
    site2 = build_site(archive, tmp_path / "site2", config=cfg, perfetto_origin="http://other:1", quiet=True)
    assert 'data-perfetto-origin="http://other:1"' in next(site2.glob("runs/toy/v1/*/index.html")).read_text()


def test_csv_download_flattens_plugin_columns():
    """Lists of structs (plugin metrics) become JSON text in the CSV; lists of strings are joined."""
    import polars as pl

    from tests.helpers.runfactory import make_run

    run = make_run({"": {"a": None}})
    metrics = [[{"name": "thirdparty.score", "value": 1.5}] if r["path"] == "a" else None for r in run.rows.to_dicts()]
    run.rows = run.rows.with_columns(
        pl.Series("plugin_metrics", metrics, dtype=run.rows.schema["plugin_metrics"]),
        pl.Series("graph_break_reasons", [["x", "y"]] * run.rows.height, dtype=pl.List(pl.String)),
    )
    flat = run.flat_table()
    cells = dict(zip(flat["path"].to_list(), flat["plugin_metrics"].to_list()))
    assert cells["a"] == '[{"name": "thirdparty.score", "value": 1.5}]' and cells[""] is None
    assert set(flat["graph_break_reasons"].to_list()) == {"x;y"}
    flat.write_csv(io.StringIO())  # CSV takes it: nothing nested is left


def test_run_warnings_are_shown_on_the_run_page(tmp_path):
    """A run timed on a busy machine says so on its page, escaped like every run-provided string."""
    from tests.helpers.runfactory import make_run, write_archive

    run = make_run({"": {"a": None}}, model="busy")
    run.meta["warnings"] = ["the machine was busy before timing <load 3.1>"]
    write_archive(tmp_path / "runs", [run])
    site = build_site(tmp_path / "runs", tmp_path / "site", quiet=True)
    page = (site / "runs" / "busy" / "v1" / run.run_id / "index.html").read_text()
    assert "Read these numbers with care" in page
    assert "the machine was busy before timing &lt;load 3.1&gt;" in page


def test_relative_out_folder_lands_in_the_working_directory(tmp_path, monkeypatch):
    """`cbsite build --out site` (the demo's call) writes ./site, not a folder inside the generated project."""
    from cbsite.cli import main
    from tests.helpers.runfactory import make_run, write_archive

    write_archive(tmp_path / "runs", [make_run({"": {"a": None}}, model="rel")])
    monkeypatch.chdir(tmp_path)
    assert main(["build", "--runs", "runs", "--out", "site"]) == 0
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "models" / "rel" / "index.html").is_file()


def test_cbsite_serve_serves_the_built_site_on_localhost(tmp_path):
    import urllib.request

    from tests.helpers.runfactory import make_run, write_archive

    write_archive(tmp_path / "runs", [make_run({"": {"a": None}}, model="served")])
    site = build_site(tmp_path / "runs", tmp_path / "site", quiet=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cbsite", "serve", str(site), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "models/served/", timeout=30) as response:
            assert response.status == 200 and b"served" in response.read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
