"""The MkDocs plugin `cbsite` inside a team's own docs: a small project with its own pages, theme settings and
nav, built with `mkdocs build --strict`; the archive's pages appear under the prefix, with their nav entry,
assets and artifacts, and the team's pages and theme stay as they were."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cbsite import archive

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "cbsite" / "generator" / "templates"


def _project(tmp_path: Path, nav: bool, runs: Path, font: bool = False, models: tuple[str, ...] = ()) -> Path:
    """The team's project, its archive a copy of `runs` (only the `models` named, where some are)."""
    proj = tmp_path / "team-docs"
    (proj / "docs").mkdir(parents=True)
    (proj / "docs" / "index.md").write_text("# Team docs\n\nOur [performance reports](perf/index.md).\n")
    (proj / "docs" / "guide.md").write_text("# Guide\n\nHow we work.\n")
    if models:
        for model in models:
            shutil.copytree(runs / model, proj / "runs" / model)
    else:
        shutil.copytree(runs, proj / "runs")
    nav_yaml = "nav:\n  - Home: index.md\n  - Guide: guide.md\n" if nav else ""
    # font: false keeps the team's pages offline; without it Material's default (Roboto from Google Fonts) applies.
    (proj / "mkdocs.yml").write_text(textwrap.dedent("""\
        site_name: Team docs
        theme:
          name: material
        {font}  palette:
            primary: teal
          features:
            - navigation.instant
        markdown_extensions:
          - admonition
        plugins:
          - search
          - cbsite:
              runs: runs
              prefix: perf
              cache: .cbsite-cache
        """).format(font="" if font else "  font: false\n") + nav_yaml)
    return proj


def _build(proj: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CBSITE_BUILD_JOBS": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=proj, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(("nav", "models"), [(True, ()), (False, ("dlrm",))], ids=["explicit-nav", "automatic-nav"])
def test_plugin_adds_the_archive_under_a_prefix(demo_runs, tmp_path, nav, models):
    # The explicit-nav project also keeps Material's default fonts (Google Fonts); the other has font: false. The
    # explicit-nav project holds the whole demo archive (every kind of page); the other only its dlrm runs, which
    # hold all that the rest checks (a model, its diff, runs with traces) in a much shorter build.
    proj = _project(tmp_path, nav, demo_runs, font=nav, models=models)
    proc = _build(proj)
    site = proj / "site"
    refs = archive.list_runs(proj / "runs")
    assert refs

    # The team's pages are there, untouched by cbsite's stylesheet and script.
    home = (site / "index.html").read_text()
    assert "Team docs" in home
    guide = (site / "guide" / "index.html").read_text()
    assert "cbsite.css" not in guide and "site.js" not in guide
    # The team's theme settings are theirs: palette, and the instant navigation cbsite build would drop.
    assert 'data-md-color-primary="teal"' in home
    assert "navigation.instant" in home

    # The archive's pages, under the prefix, each with cbsite's stylesheet and script (links that resolve).
    perf = site / "perf"
    pages = [perf / "index.html", perf / "models" / "dlrm" / "index.html", perf / "diffs" / "dlrm" / "v1" / "v2" / "index.html"]
    pages += [perf / "runs" / r.model / r.version / r.run_id / "index.html" for r in refs]
    for page in pages:
        text = page.read_text()
        for href in re.findall(r'(?:href|src)="([^"]*(?:cbsite\.css|site\.js|icicle\.js))"', text):
            assert (page.parent / href).resolve().is_file(), (page, href)
        assert re.search(r'<link rel="stylesheet" href="[^"]*assets/cbsite/cbsite\.css">', text), page
    for asset in TEMPLATES.joinpath("assets").iterdir():
        assert (perf / "assets" / "cbsite" / asset.name).read_bytes() == asset.read_bytes()
    assert (perf / "assets" / "cbsite" / "vega.js").is_file()
    run = refs[0]
    run_dir = perf / "runs" / run.model / run.version / run.run_id
    assert (run_dir / "components.json").is_file()
    assert any((run_dir / "artifacts").rglob("*.gz")), "the run's traces were not copied"

    # The nav: a Performance section (explicit nav) or the prefix's folder (automatic), with the models,
    # never the run or diff pages (reached from the model and home pages).
    nav_html = home.split('<nav class="md-nav md-nav--primary"', 1)[1].split('<div class="md-content"', 1)[0]
    assert ("Performance" if nav else "Perf") in nav_html
    assert "perf/models/dlrm/" in nav_html
    assert "perf/runs/" not in nav_html and "perf/diffs/" not in nav_html
    # The team's "Home" once: the archive's home is listed by its own title, in the explicit nav as in the automatic.
    labels = [re.sub(r"\s+", " ", t).strip() for t in re.findall(r'<span class="md-ellipsis">(.*?)</span>', nav_html, re.S)]
    assert labels.count("Home" if nav else "Team docs") == 1, labels
    assert "Component benchmarks" in labels and "Guide" in labels
    # Run and diff pages keep the team's left nav (cbsite's own site hides it there): shown, with the team's pages.
    for page in (pages[2], pages[3]):
        text = page.read_text()
        sidebar = re.search(r'<div class="md-sidebar md-sidebar--primary"[^>]*>', text)
        assert sidebar and "hidden" not in sidebar.group(0), page
        assert re.search(r'<a href="[./]*guide/"[^>]*>\s*<span class="md-ellipsis">\s*Guide', text), page
    # Material's default fonts come from Google: the build log says so once, and how to keep the pages offline.
    fonts_note = "loads its fonts from Google Fonts"
    assert proc.stderr.count(fonts_note) == (1 if nav else 0), proc.stderr[-2000:]
    if nav:
        assert "fonts.googleapis.com" in home and "theme: {font: false}" in proc.stderr
    else:
        assert "fonts.googleapis.com" not in home

    # The build cache (cache: .cbsite-cache) holds the runs' and diffs' data for the next build.
    assert len(list((proj / ".cbsite-cache" / "runs").iterdir())) == len(refs)
    assert list((proj / ".cbsite-cache" / "diffs").iterdir())

    # Search indexes the archive's pages next to the team's.
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {d["location"] for d in index["docs"]}
    assert any(loc.startswith("perf/runs/") for loc in locations)
    assert any(loc.startswith("guide/") for loc in locations)


def test_plugin_and_cbsite_build_share_the_page_generator(demo_runs, tmp_path, monkeypatch):
    """The same archive gives the same page Markdown and data files under the plugin's prefix as in the
    project `cbsite build` generates (both come from build.render_docs)."""
    from cbsite.generator import build
    from cbsite.generator.catalog import load_catalog
    from cbsite.generator.config import SiteConfig

    catalog = load_catalog(demo_runs.resolve(), ())
    site = SiteConfig(base={}, perfetto_origin="https://ui.perfetto.dev", source=None)
    a, b = tmp_path / "a", tmp_path / "b" / "perf"
    monkeypatch.setenv("CBSITE_BUILD_JOBS", "1")
    na, nav_a = build.render_docs(catalog, site, a, [])
    nb, nav_b = build.render_docs(catalog, site, b, [])
    assert na == nb and nav_a == nav_b
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files_a)


def test_plugin_refuses_a_missing_archive(demo_runs, tmp_path):
    proj = _project(tmp_path, nav=False, runs=demo_runs)
    shutil.rmtree(proj / "runs")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=proj, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "does not exist; set `runs:` relative to mkdocs.yml" in proc.stderr


@pytest.mark.parametrize("option", [None, True, False, ".cbsite-cache"])
def test_plugin_caches_by_default_in_the_users_cache_directory(tmp_path, monkeypatch, option):
    """As `cbsite build`: with no `cache:` (or `cache: true`) the plugin keeps its build cache in the user's cache
    directory, one per project and prefix; `cache: false` builds without; a named folder is relative to mkdocs.yml."""
    from types import SimpleNamespace

    from cbsite.generator.cache import MARKER, plugin_cache_dir
    from cbsite.generator.plugin import CbsitePlugin

    monkeypatch.setenv("CBSITE_CACHE_DIR", str(tmp_path / "user-cache"))
    proj = tmp_path / "team-docs"
    (proj / "docs").mkdir(parents=True)
    plugin = CbsitePlugin()
    errors, _ = plugin.load_config({} if option is None else {"cache": option}, str(proj / "mkdocs.yml"))
    assert errors == []
    config = SimpleNamespace(config_file_path=str(proj / "mkdocs.yml"), site_dir=str(proj / "site"),
                             docs_dir=str(proj / "docs"))
    store = plugin._open_cache(config, proj / "runs", "perf")
    if option is False:
        assert store is None
        return
    assert store is not None and (store.folder / MARKER).is_file()
    if isinstance(option, str):
        assert store.folder == proj / ".cbsite-cache"
    else:
        assert store.folder == plugin_cache_dir(proj / "mkdocs.yml", "perf")
        assert store.folder.is_relative_to(tmp_path / "user-cache")
        assert store.folder != plugin_cache_dir(proj / "mkdocs.yml", "other")
