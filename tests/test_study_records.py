"""A study's record matches what ran: a sweep whose options differ from the points already in the archive is refused
naming the keys, never a silent "already done" that relabels study.json with options no run used."""

from __future__ import annotations

import json

import pytest

from cbsite import study as cstudy
from cbsite.cli import main
from cbsite.errors import CbsiteError
from tests.helpers.runfactory import make_run, write_archive


def _archive_with_points(root, study, options_of):
    """Runs standing for a finished sweep of `study`: each point's run records `options_of(point)` as collected."""
    runs = []
    for p in study.points:
        run = make_run({"": None}, model=study.model, version=p.label, tags=study.tags(p))
        run.meta["provider"] = {"name": study.provider, "options": options_of(p)}
        runs.append(run)
    write_archive(root, runs)
    record = cstudy.new_record(study, study.points, cstudy.done_points(root, study), {})
    cstudy.write_record(root, record)
    return record


def test_points_done_with_the_same_options_are_resumed(tmp_path):
    study = cstudy.Study.from_grid("s", "tests.session_models:mlp", ["width=32,48"], base_options={"batch": 4})
    # The run records the provider's effective options, defaults too: keys this sweep does not give are not compared.
    _archive_with_points(tmp_path, study, lambda p: {**study.options_of(p), "repeat": 0, "seed": 0})
    assert set(cstudy.done_points(tmp_path, study)) == {p.label for p in study.points}


def test_a_sweep_with_other_options_than_its_recorded_points_is_refused_naming_the_keys(tmp_path, capsys):
    old = cstudy.Study.from_grid("s", "tests.session_models:mlp", ["width=32,48"], base_options={"batch": 4})
    _archive_with_points(tmp_path, old, old.options_of)
    before = (tmp_path / "_studies" / "s" / "study.json").read_text()

    changed = cstudy.Study.from_grid("s", "tests.session_models:mlp", ["width=32,48"], base_options={"batch": 8})
    with pytest.raises(CbsiteError, match=r"batch \(recorded 4, now 8\).*--study s-2"):
        cstudy.done_points(tmp_path, changed)
    dropped = cstudy.Study.from_grid("s", "tests.session_models:mlp", ["width=32,48"])
    with pytest.raises(CbsiteError, match=r"batch \(recorded 4, now not given\)"):
        cstudy.done_points(tmp_path, dropped)

    # The CLI: one line, exit 2, before anything runs, and study.json left as it was.
    code = main(["sweep", "tests.session_models:mlp", "--grid", "width=32,48", "-o", "batch=8", "--study", "s",
                 "--runs", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "batch (recorded 4, now 8)" in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "_studies" / "s" / "study.json").read_text() == before
    record = json.loads(before)
    assert {p["options"]["width"] for p in record["points"]} == {32, 48} and record["base_options"] == {"batch": 4}
