"""`cbsite sweep --executor ray` on a local Ray cluster the test starts (beside the local and submitit sweeps of
tests/test_study.py): every point runs as a Ray task and writes its own run; a failing point is recorded and
the others go on."""

from __future__ import annotations

import pytest

from cbsite import study as cstudy
from tests.helpers.sweeps import NANO, runs_by_version

ray = pytest.importorskip("ray")


@pytest.fixture
def local_ray():
    """A Ray cluster of this machine alone, two CPUs, no dashboard; shut down after the test."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_executor_runs_points_as_tasks(tmp_path, local_ray):
    from cbsite.cli import main

    runs = tmp_path / "runs"
    code = main(["sweep", *NANO, "--runs", str(runs), "--study", "on-ray", "--grid", "n_layer=1,0",
                 "--executor", "ray", "--workers", "2"])
    assert code == 1  # n_layer=0 is no model: that point fails, the other is collected
    record = cstudy.read_record(runs, "on-ray")
    status = {p["label"]: p for p in record["points"]}
    assert record["executor"] == {"executor": "ray", "workers": 2, "cpus_per_point": 1}
    assert status["n_layer-0"]["status"] == "failed" and "n_layer" in status["n_layer-0"]["error"]
    done = status["n_layer-1"]
    assert done["status"] == "done" and done["attempts"] == 1 and done["threads"] == 1  # its task's one CPU
    metas = runs_by_version(runs)
    assert set(metas) == {"n_layer-1"} and metas["n_layer-1"]["run_id"] == done["run_id"]
    meta = metas["n_layer-1"]
    assert {"study:on-ray", "point:n_layer-1"} <= set(meta["tags"]) and meta["model"] == "on-ray"
    assert meta["study"]["options"] == {"n_layer": 1}

    # Resumed on the same cluster: the done point is skipped and nothing runs, so the record stays as it was.
    record_file = runs / cstudy.STUDIES_DIR / "on-ray" / cstudy.STUDY_JSON
    before = record_file.read_bytes()
    assert main(["sweep", *NANO, "--runs", str(runs), "--study", "on-ray", "--grid", "n_layer=1,0",
                 "--executor", "ray", "--workers", "2", "-k", "n_layer-1"]) == 0
    assert record_file.read_bytes() == before
    assert set(runs_by_version(runs)) == {"n_layer-1"}
