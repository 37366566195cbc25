"""The study record (runs/_studies/NAME/study.json) is never rewritten by a sweep that changed nothing, and a
partial re-run merges into it: keys of the previous record are kept, never dropped.

The record read is the demo study's, from the tests' archive; the executor is replaced by a recorder where a
point has to "run", so no model is measured here."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cbsite import study as cstudy
from cbsite.cli.demo import DEMO_STUDY, DEMO_STUDY_CONFIG
from cbsite.collector import CollectConfig, executors
from cbsite.collector.request import CollectRequest

PROVIDER, NAME, OPTIONS, GRID = DEMO_STUDY


@pytest.fixture
def study_archive(demo_runs, tmp_path) -> Path:
    """The demo study's runs and record (as `cbsite demo` left them) in an archive of their own."""
    runs = tmp_path / "runs"
    shutil.copytree(demo_runs / NAME, runs / NAME)
    shutil.copytree(demo_runs / cstudy.STUDIES_DIR / NAME, runs / cstudy.STUDIES_DIR / NAME)
    return runs


def _sweep():
    sweep = cstudy.Study.from_grid(NAME, PROVIDER, GRID, base_options=OPTIONS)
    request = CollectRequest(provider=PROVIDER, config=replace(CollectConfig(), **DEMO_STUDY_CONFIG), tags=("demo",))
    return sweep, request


def test_a_sweep_with_nothing_to_run_keeps_the_record_byte_for_byte(study_archive, monkeypatch):
    record_file = study_archive / cstudy.STUDIES_DIR / NAME / cstudy.STUDY_JSON
    before = record_file.read_bytes()
    recorded = json.loads(before)
    # The record as the demo left it: what this check is about is there to lose.
    assert recorded["executor"]["core_sets"] and recorded["last_sweep_s"] > 0
    assert all({"affinity", "threads", "job_id"} <= set(p) for p in recorded["points"])
    monkeypatch.setattr(executors, "run_jobs", lambda *a, **k: pytest.fail("nothing should run"))
    sweep, request = _sweep()
    lines = []
    record = executors.run_sweep(sweep, sweep.points, study_archive, request, say=lines.append)
    assert f"{len(sweep.points)} already done, 0 to run" in lines[0]
    assert record_file.read_bytes() == before
    assert record == recorded
    # Another executor or worker count asked for changes nothing either: nothing ran on it.
    executors.run_sweep(sweep, sweep.points, study_archive, request, workers=2, pin=False)
    assert record_file.read_bytes() == before


def test_a_partial_rerun_merges_into_the_record(study_archive, monkeypatch):
    record_file = study_archive / cstudy.STUDIES_DIR / NAME / cstudy.STUDY_JSON
    before = json.loads(record_file.read_text())
    sweep, request = _sweep()
    gone = sweep.points[-1].label
    shutil.rmtree(study_archive / NAME / gone)  # this point's run is no longer in the archive: it runs again
    ran = []

    def run_jobs(executor, jobs, workers, on_result, **kwargs):
        for job in jobs:
            ran.append(job.label)
            kwargs["on_start"](job.label)
            on_result({"label": job.label, "status": "done", "run_id": "20990101T000000Z-abcdef",
                       "path": f"runs/{NAME}/{job.label}/20990101T000000Z-abcdef", "error": None, "wall_s": 1.5,
                       "affinity": [0], "threads": 1})
        return {"executor": executor, "workers": workers, "pinned": True, "core_sets": [[0]], "devices": None}

    monkeypatch.setattr(executors, "run_jobs", run_jobs)
    record = executors.run_sweep(sweep, sweep.points, study_archive, request)
    assert ran == [gone]
    after = json.loads(record_file.read_text())
    assert after == json.loads(json.dumps(record, default=str))  # what was returned is what was written
    old = {p["label"]: p for p in before["points"]}
    new = {p["label"]: p for p in after["points"]}
    for label in old:
        if label != gone:
            assert new[label] == old[label], label  # untouched points keep every key and value
    assert new[gone]["run_id"] == "20990101T000000Z-abcdef" and new[gone]["affinity"] == [0]
    assert new[gone]["attempts"] == old[gone]["attempts"] + 1 and "job_id" in new[gone]  # kept, not dropped
    assert after["created_at"] == before["created_at"] and after["sweeps"] == before["sweeps"] + 1
    assert after["executor"]["core_sets"] == [[0]] and after["last_sweep_s"] >= 0
    assert set(before) <= set(after)  # no top-level key lost


def test_a_record_keeps_keys_it_does_not_know():
    """A record written by another cbsite (keys this one never sets) passes through new_record intact."""
    sweep, _ = _sweep()
    done = {p.label: {"run_id": f"20260101T00000{i}Z-00000{i}", "path": f"runs/x/{i}"} for i, p in enumerate(sweep.points)}
    previous = cstudy.new_record(sweep, sweep.points, done, {})
    previous["from_the_future"] = {"kept": True}
    previous["points"][0]["gpu_hours"] = 3
    record = cstudy.new_record(sweep, sweep.points, done, {"executor": "local"}, previous)
    assert record["from_the_future"] == {"kept": True} and record["points"][0]["gpu_hours"] == 3
    assert not cstudy.changes_anything(previous, record)
    moved = dict(done, **{sweep.points[0].label: {"run_id": "20260102T000000Z-000009", "path": "runs/x/9"}})
    assert cstudy.changes_anything(previous, cstudy.new_record(sweep, sweep.points, moved, {}, previous))
