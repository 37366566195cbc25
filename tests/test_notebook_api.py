"""The notebook API as the manual shows it: the marked cells of docs/api.md (each fenced python block right after an
`<!-- notebook-api -->` line) run as written in an empty folder, profiling a small MLP in two versions; then the
run's short repr and HTML summary, `read_run`'s spellings and `diff_report` against `cbsite diff --format json`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import cbsite
from cbsite.archive import Run, resolve_run
from cbsite.cli import main

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- notebook-api -->"
CELL = re.compile(re.escape(MARKER) + r"[ \t]*\n(?:[ \t]*\n)*```python[ \t]*\n(.*?)\n```", re.S)


def manual_cells() -> list[str]:
    return CELL.findall((ROOT / "docs" / "api.md").read_text())


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> dict[str, Any]:
    """The manual's cells run one after the other in one namespace, in an empty folder (where `runs/` lands);
    what they printed to stderr (the progress) under "stderr", the folder under "folder"."""
    folder = tmp_path_factory.mktemp("notebook")
    cells = manual_cells()
    assert len(cells) >= 3, "docs/api.md lost its notebook cells"
    namespace: dict[str, Any] = {"__name__": "notebook"}
    stderr = io.StringIO()
    here = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stderr(stderr):
            for i, cell in enumerate(cells):
                exec(compile(cell, f"docs/api.md cell {i + 1}", "exec"), namespace)
    finally:
        os.chdir(here)
    namespace.update(stderr=stderr.getvalue(), folder=folder)
    return namespace


def test_the_manuals_notebook_cells_run_and_archive_two_versions(notebook):
    refs = cbsite.list_runs(notebook["folder"] / "runs")
    assert [(r.model, r.version) for r in refs] == [("mlp", "v1"), ("mlp", "v2")]
    assert isinstance(notebook["run"], cbsite.Run)
    assert notebook["v1"].run_id == notebook["run"].run_id
    report = notebook["report"]
    assert report["base"]["version"] == "v1" and report["head"]["version"] == "v2"
    assert report["totals"]["forward"]["flops"]["ratio"] == pytest.approx(4.0, rel=0.01)


def test_profile_shows_progress_by_default(notebook):
    # The manual's config leaves `progress` alone: a collection says where it is (here a log, so lines).
    assert "cbsite: collecting" in notebook["stderr"]


def test_the_repr_is_short_and_names_the_whole_model(notebook):
    run = notebook["run"]
    text = repr(run)
    assert len(text) < 2000
    assert text.startswith(f"<cbsite.Run mlp@v1 {run.run_id}>")
    assert "mlp (whole model): forward " in text and "backward " in text
    assert "4 measured" in text and "peak 100 GFLOP/s (given)" in text
    # The root is named in the table too, the components by their paths; the data keeps path "".
    table = text.split("\n")[5:]
    assert table[1].split()[:3] == ["mlp", "(whole", "model)"]
    assert {line.split()[0] for line in table[2:-1]} == {"0", "1", "2"}
    assert run.rows.filter(pl.col("path") == "").height == 2
    assert f"saved at {run.path}" in text


def test_the_repr_stays_short_with_long_paths_and_many_components(notebook):
    run = notebook["run"]
    long_rows = run.rows.with_columns(
        pl.when(pl.col("path") == "").then(pl.lit("")).otherwise(pl.lit("tower." * 80) + pl.col("path")).alias("path"))
    text = repr(Run(meta=run.meta, rows=long_rows))
    assert len(text) < 2000
    assert "\u2026" in text and "not saved" in text


def test_the_html_summary_is_a_small_table_without_links(notebook):
    run = notebook["run"]
    page = run._repr_html_()
    assert page.count("<table>") == 1 and "<th>component</th>" in page
    assert "<td>mlp (whole model)</td>" in page and "<td>Linear</td>" in page
    assert "<a " not in page and "href" not in page
    assert len(page) < 4000
    odd = Run(meta=run.meta, rows=run.rows.with_columns(pl.lit("x.<Tower&Co>").alias("module_type")))
    assert "&lt;Tower&amp;Co&gt;" in odd._repr_html_() and "<Tower" not in odd._repr_html_()


def test_read_run_takes_every_spelling_of_a_run(notebook, monkeypatch, tmp_path):
    folder, run_id = notebook["folder"], notebook["run"].run_id
    runs = folder / "runs"
    ref = resolve_run("mlp@v1", runs)
    spellings: list[Any] = [ref, ref.path, str(ref.path)]
    read = [cbsite.read_run(s) for s in spellings]
    read += [cbsite.read_run(s, runs=runs) for s in ("mlp@v1", run_id)]
    monkeypatch.chdir(folder)  # runs="runs" by default, relative to the working directory
    read += [cbsite.read_run("mlp@v1"), cbsite.read_run(run_id), cbsite.read_run(resolve_run("mlp@v1"))]
    assert {r.run_id for r in read} == {run_id}
    assert cbsite.read_run("mlp", runs=runs).version == "v2"  # a model alone: its newest run
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cbsite.CbsiteError, match="no run matches 'mlp@v1'"):
        cbsite.read_run("mlp@v1")
    with pytest.raises(cbsite.CbsiteError, match="is missing"):
        cbsite.read_run(tmp_path / "nowhere")


def test_diff_report_is_what_the_cli_prints_as_json(notebook, monkeypatch, capsys):
    folder = notebook["folder"]
    runs = folder / "runs"
    monkeypatch.chdir(folder)
    capsys.readouterr()
    assert main(["diff", "mlp@v1", "mlp@v2", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    # NaN prints as NaN in both, so the JSON texts are compared rather than the dicts.
    expected = json.dumps(printed, sort_keys=True)
    assert json.dumps(notebook["report"], sort_keys=True) == expected
    base, head = cbsite.read_run("mlp@v1"), cbsite.read_run("mlp@v2")
    assert json.dumps(cbsite.diff_report(base, head, runs=runs), sort_keys=True) == expected

    gated = ["flops>+5%"]
    assert main(["diff", "mlp@v1", "mlp@v2", "--format", "json", "--fail-on", gated[0]]) == 1
    printed = json.loads(capsys.readouterr().out)
    report = cbsite.diff_report("mlp@v1", "mlp@v2", fail_on=gated)
    assert report["gate"]["passed"] is False
    assert json.dumps(report, sort_keys=True) == json.dumps(printed, sort_keys=True)


def test_the_api_is_exported_and_import_cbsite_needs_no_torch():
    assert {"profile", "CollectConfig", "Run", "read_run", "list_runs", "resolve_run", "diff_report",
            "CbsiteError"} <= set(cbsite.__all__)
    from cbsite.collector.config import CollectConfig

    assert cbsite.CollectConfig is CollectConfig
    assert cbsite.CollectConfig().progress is True
    code = ("import sys, cbsite; cbsite.read_run; cbsite.diff_report; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
