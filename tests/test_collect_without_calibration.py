"""`cbsite collect --no-calibrate`: with both peaks given, a CPU collection starts no calibration worker and measures
no peak, and its run.json says that neither the calibration nor the drift check ran; without both peaks the option is
refused before anything starts."""

from __future__ import annotations

import json

import pytest

from cbsite.cli import USAGE_ERROR, main
from cbsite.collector import clean_worker, device, peaks

# Peaks far above what any CPU reaches: no row beats them, so no peak check starts a worker of its own either.
GIVEN = ["--peak-flops", "1e15", "--peak-bandwidth", "1e13"]
# The per-component cap bounds the waits for a quiet machine beside the rest of the suite.
SMALL = ["tests.session_models:mlp", "-o", "width=32", "-o", "batch=8", "--model", "mlp", "--max-depth", "1",
         "--budget", "0.005", "--max-component-s", "0.5", "--no-step", "--no-progress", "-q"]


@pytest.fixture
def started(monkeypatch) -> list[str]:
    """What the command ran outside its own process (the jobs handed to a worker) and the calibrations it made."""
    seen: list[str] = []
    spawn, calibrate = clean_worker.spawn_pool, device.calibrate_cpu

    def spawn_pool(*args, **kwargs):
        pool = spawn(*args, **kwargs)
        submit = pool.submit

        def recorded(fn, /, *fn_args, **fn_kwargs):
            seen.append(f"worker job {getattr(fn, '__name__', fn)}")
            return submit(fn, *fn_args, **fn_kwargs)

        pool.submit = recorded  # type: ignore[method-assign]
        return pool

    def calibrate_cpu(*args, **kwargs):
        seen.append("calibration")
        return calibrate(*args, **kwargs)

    monkeypatch.setattr(clean_worker, "spawn_pool", spawn_pool)
    monkeypatch.setattr(device, "calibrate_cpu", calibrate_cpu)
    monkeypatch.setattr(peaks, "calibrate_cpu", calibrate_cpu)
    return seen


def test_no_calibrate_skips_both_calibrations_and_the_run_says_no_drift_was_checked(tmp_path, started):
    runs = tmp_path / "runs"
    assert main(["collect", *SMALL, *GIVEN, "--no-calibrate", "--runs", str(runs), "--version", "v1"]) == 0
    assert started == []  # no calibration worker, no calibration in this process either
    (run_json,) = runs.glob("mlp/v1/*/run.json")
    meta = json.loads(run_json.read_text())
    assert meta["calibration"] == {"calibrated": False, "drift_checked": False,
                                   "skipped": "calibration off: both peaks were given and are used as they are"}
    assert meta["config"]["calibrate"] is False
    assert "calibration" not in meta["device"]  # nothing measured, so no start, end or repeats
    assert meta["device"]["peak_source"] == {"flops": "given", "bandwidth": "given"}
    assert meta["device"]["peak_flops"] == {"float32": 1e15} and meta["device"]["peak_bandwidth"] == 1e13
    assert not [w for w in meta["warnings"] if "calibrat" in w]  # no drift warning can come from a check never made


@pytest.mark.parametrize("given", [[], ["--peak-flops", "1e11"], ["--peak-bandwidth", "1e10"]])
def test_no_calibrate_without_both_peaks_is_refused_before_anything_starts(tmp_path, capsys, started, given):
    assert main(["collect", *SMALL, *given, "--no-calibrate", "--runs", str(tmp_path / "runs")]) == USAGE_ERROR
    err = capsys.readouterr().err
    assert "--no-calibrate needs both peaks" in err and len(err.strip().splitlines()) == 1, err
    missing = [flag for flag in ("--peak-flops", "--peak-bandwidth") if flag not in given]
    assert f"give {' and '.join(missing)} too" in err
    assert started == [] and not (tmp_path / "runs").exists()
