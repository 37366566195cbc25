"""The demo runs (the tests' own copy, tests/data/runs): valid against the data contract, and the site builds from
them without torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from cbsite import archive, schema, study, tree
from cbsite.cli.demo import DEMO, DEMO_PLUGINS, DEMO_STUDY

ROOT = Path(__file__).resolve().parents[1]
STUDY_PROVIDER, STUDY_NAME, STUDY_OPTIONS, STUDY_GRID = DEMO_STUDY


def _is_study_run(meta):
    """A point of a study (`cbsite sweep`, the demo's small study among them): run.json has `study`."""
    return bool(meta.get("study"))


def test_demo_archive_has_the_demo_models(demo_runs):
    versions = {(r.model, r.version) for r in archive.list_runs(demo_runs)}
    assert {(name, version) for _, name, version, _ in DEMO} <= versions


def test_demo_archive_has_the_demo_study_with_every_point_done(demo_runs):
    """The demo's small study (cbsite demo runs it after the models): each point a run, its record in _studies."""
    sweep = study.Study.from_grid(STUDY_NAME, STUDY_PROVIDER, STUDY_GRID, base_options=STUDY_OPTIONS)
    assert len(sweep.axes) == 2 and len(sweep.points) >= 4
    done = study.done_points(demo_runs, sweep)
    assert set(done) == {p.label for p in sweep.points}
    record = study.read_record(demo_runs, STUDY_NAME)
    assert record is not None and record["provider"] == STUDY_PROVIDER
    assert {e["label"]: e["status"] for e in record["points"]} == {p.label: "done" for p in sweep.points}
    assert all(not Path(e["path"]).is_absolute() for e in record["points"])  # no path of the machine that ran it


def test_every_demo_run_is_valid(demo_runs):
    refs = archive.list_runs(demo_runs)
    assert refs
    for ref in refs:
        _check_demo_run(ref)


def _check_demo_run(ref):
    run = archive.read_run(ref.path)
    assert run.meta["schema_version"] == schema.SCHEMA_VERSION
    assert run.rows.columns == schema.COLUMNS
    for phase in run.rows["phase"].unique().to_list():
        t = tree.self_check(tree.build_tree(run.table(phase).to_dicts()))
        measured = [n for n in t if n["status"] == "measured"]
        assert measured and all(n["latency_ms"] > 0 for n in measured)
    if _is_study_run(run.meta):
        # A study point: collected without plugins (the demo study stays small); it must carry its study
        # labels (run.json `study`, tags, its label as version) and the whole model's step throughput.
        meta = run.meta["study"]
        assert meta["point"] == ref.version and ref.model == meta["name"]
        assert {study.study_tag(meta["name"]), study.point_tag(meta["point"])} <= set(run.meta["tags"])
        assert set(meta["axes"]) == set(meta["options"]) and meta["options"].items() <= run.meta["provider"]["options"].items()
        for kind in ("train", "eval"):
            assert run.meta["step"][kind]["examples_per_s"] > 0 and run.meta["step"][kind]["ms"] > 0, kind
    elif run.meta.get("distributed"):
        # A sharded run (torchrun, README "Sharded models"): no plugins; every rank's rows, the slowest rank's
        # row per component with its imbalance, communication rows that say what they send.
        world = run.meta["distributed"]["world_size"]
        assert world >= 2 and run.ranks is not None and run.ranks.height == world * run.rows.height
        comm = run.rows.filter((run.rows["kind"] == "communication") & (run.rows["status"] == "measured"))
        assert comm.height and (comm["comm_bytes_sent"] + comm["comm_bytes_received"] > 0).all()
        assert comm["imbalance"].drop_nulls().min() >= 1.0
    else:
        assert set(DEMO_PLUGINS) <= set(run.meta["config"]["plugins"])  # the demo's set
        for row in run.rows.filter(run.rows["status"] == "measured").to_dicts():
            assert row["trace_file"] and row["memory_file"], (row["path"], row["phase"])
    links = run.rows.select(["trace_file", "memory_file", "log_file"]).to_dicts()
    for link in (v for row in links for v in row.values() if v):
        assert (ref.path / link).is_file(), link


def test_site_builds_from_the_demo_runs_without_torch(demo_site):
    """`cbsite build` on a docs machine, where torch and torchrec cannot even be imported: `demo_site` is built so
    (tests/helpers/no_torch_build.py), and holds every kind of page."""
    site = demo_site
    assert (site / "diffs" / "dlrm" / "v1" / "v2" / "index.html").is_file()
    assert any((site / "runs" / "nanogpt" / "v1").iterdir())
    assert (site / "studies" / STUDY_NAME / "index.html").is_file()
    assert (site / "studies" / STUDY_NAME / "charts.json").is_file()


def _pr_example() -> tuple[Path, str] | None:
    """(file, its text) of the README or manual page that shows the PR example's comment, if one does."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text() if doc.is_file() else ""
        if "````markdown\n" in text and 'echo "gate: $?"' in text:
            return doc, text
    return None


def test_documented_pr_example_matches_what_the_commands_print(demo_runs, capsys):
    """The documented PR example, run on the demo runs, prints the comment and gate shown there."""
    from cbsite.cli import main

    found = _pr_example()
    if found is None:
        pytest.skip("neither the README nor the manual shows the PR example's comment")
    doc, text = found
    shown = text.split("````markdown\n", 1)[1].split("\n…\n````", 1)[0]
    code = main(
        ["diff", "dlrm@v1", "dlrm@v2", "--runs", str(demo_runs), "--format", "markdown",
         "--fail-on", "flops>+5%", "--fail-on", "param_bytes>+10%", "--fail-on", "over_arch.*:latency>+20%",
         "--site-url", "https://example.github.io/models/pr-42/"]
    )
    assert code == 1 and "prints `gate: 1`" in text, doc
    assert capsys.readouterr().out.startswith(shown), doc


@pytest.mark.parametrize("fmt", ["csv", "parquet", "json"])
def test_export_writes_every_row(demo_runs, tmp_path, fmt):
    """`cbsite export` of a run with plugin columns (lists of structs) in each format."""
    import json

    import polars as pl

    from cbsite.cli import main

    out = tmp_path / f"run.{fmt}"
    assert main(["export", "dlrm@v2", "--runs", str(demo_runs), "--format", fmt, "--out", str(out)]) == 0
    expected = archive.read_run(archive.resolve_run("dlrm@v2", demo_runs).path).rows.height
    if fmt == "csv":
        back = pl.read_csv(out)
        assert back.height == expected and back["plugin_metrics"].drop_nulls().str.starts_with("[{").all()
    elif fmt == "parquet":
        assert pl.read_parquet(out).height == expected
    else:
        assert len(json.loads(out.read_text())["rows"]) == expected
