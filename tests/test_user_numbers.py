"""Every number a user gives is checked before any work: one line, exit 2 (exit 1 is kept for "regressed").

A zero magnitude floor is legitimate: every change is judged by its significance alone (`unchanged` can then not be
shown, equivalence needs a margin), for `compare --floor 0` and for a gate rule `latency>+0%` alike.
"""

from __future__ import annotations

import time

import pytest

from cbsite import gate as cgate
from cbsite import stats
from cbsite.cli import main
from tests.helpers.latency_archive import IDS, write_latency_archive

BAD = [
    (["collect", "dlrm", "--budget", "nan"], "--budget"),
    (["collect", "dlrm", "--budget", "-1"], "--budget"),
    (["collect", "dlrm", "--rounds", "0"], "--rounds"),
    (["collect", "dlrm", "--threads", "0"], "--threads"),
    (["collect", "dlrm", "--max-depth", "-1"], "--max-depth"),
    (["collect", "dlrm", "--batches", "0"], "--batches"),
    (["collect", "dlrm", "--peak-flops", "inf"], "--peak-flops"),
    (["collect", "dlrm", "--peak-bandwidth", "0"], "--peak-bandwidth"),
    (["collect", "dlrm", "--max-component-s", "0"], "--max-component-s"),
    (["collect", "dlrm", "--shrink-factor", "-2"], "--shrink-factor"),
    (["collect", "dlrm", "--shrink-cap", "0"], "--shrink-cap"),
    (["collect", "dlrm", "--batch-size", "-4"], "--batch-size"),
    (["collect", "dlrm", "--dist-timeout", "0"], "--dist-timeout"),
    (["collect", "dlrm", "--memory-limit=0GB"], "memory limit"),
    (["compare", "dlrm", "dlrm", "--floor", "-0.1"], "--floor"),
    (["compare", "dlrm", "dlrm", "--floor", "nan"], "--floor"),
    (["compare", "dlrm", "dlrm", "--alpha", "0"], "--alpha"),
    (["compare", "dlrm", "dlrm", "--alpha", "0.7"], "--alpha"),
    (["compare", "dlrm", "dlrm", "--processes", "1"], "--processes"),
    (["compare", "dlrm", "dlrm", "--pairs", "0"], "--pairs"),
    (["compare", "dlrm", "dlrm", "--block-time", "0"], "--block-time"),
    (["compare", "dlrm", "dlrm", "--fail-on", "latency>-5%"], "gate rule"),
    (["sweep", "dlrm", "--grid", "size=tiny", "--workers", "0"], "--workers"),
    (["diff", "a", "b", "--top", "-1"], "--top"),
    (["serve", "--port", "70000"], "--port"),
]


@pytest.mark.parametrize("argv,named", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_a_bad_number_is_refused_in_one_line_with_exit_2_before_any_work(argv, named, capsys, tmp_path):
    started = time.perf_counter()
    assert main([*argv, "--runs", str(tmp_path / "runs")] if argv[0] != "serve" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cbsite: error:") and named in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()  # nothing collected, nothing staged
    assert time.perf_counter() - started < 60  # refused up front, not after a session (a bound, not a timing)


def test_every_bad_number_is_named_at_once(capsys, tmp_path):
    assert main(["compare", "dlrm", "dlrm", "--floor", "-1", "--alpha", "2", "--pairs", "0", "--runs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--floor" in err and "--alpha" in err and "--pairs" in err


def test_a_zero_floor_judges_by_significance_alone():
    clear = stats.paired([0.010, 0.012, 0.011, 0.009, 0.011, 0.010], floor=0)  # +1 %, tight: significant
    assert clear.verdict == "regressed"
    assert stats.paired([0.010, 0.012, 0.011, 0.009, 0.011, 0.010]).verdict != "regressed"  # below the default 5 %
    tiny = stats.paired([0.001, -0.002, 0.0, 0.001, -0.001, 0.0], floor=0)
    assert tiny.verdict == "inconclusive"  # not significant, and no margin to show "unchanged" with
    flat = stats.paired([0.0, 0.0, 0.0], floor=0)  # no spread, no change: nothing decides it, nothing crashes
    assert flat.verdict == "inconclusive"
    assert stats.unpaired([0.0, 0.01, 0.02], [0.0, 0.01, 0.02], floor=0).verdict == "inconclusive"
    # The same for gate rules: latency>+0% and a drop rule throughput<-0% (any significant drop); a rise is refused.
    from cbsite.errors import CbsiteError

    assert [r.limit for r in cgate.parse_rules(["latency>+0%", "throughput<-0%"])] == [0.0, 0.0]
    with pytest.raises(CbsiteError, match="the limit is a drop"):
        cgate.parse_rules(["throughput<+0%"])
    # A comparison made with --floor 0 is read back with its own floor, not the default's.
    from cbsite.diff.comparison import from_record

    assert from_record({"comparison_id": "c", "alpha": 0.01, "floor": 0, "components": []}).floor == 0


def test_a_zero_latency_rule_gates_on_the_regressions_and_does_not_crash(tmp_path, capsys):
    root = write_latency_archive(tmp_path / "runs")
    # v1 -> v3 holds regressed components (about +22 % and +30 %): a zero floor fails the gate (exit 1) ...
    assert main(["diff", IDS["v1"], IDS["v3"], "--runs", str(root), "--fail-on", "latency>+0%"]) == 1
    # ... and a rule on an unchanged component passes (exit 0), never a traceback.
    assert main(["diff", IDS["v1"], IDS["v3"], "--runs", str(root), "--fail-on", "enc.b:latency>+0%"]) == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.slow
def test_a_memory_limit_near_the_starting_memory_is_refused_with_the_figure_it_needs_and_that_figure_runs(tmp_path):
    """Limits just above what the process holds once the model is loaded crashed cbsite itself (a segfault, an abort,
    a MemoryError in its bookkeeping). Now: refused before any measurement, one line naming the figure it needs;
    that figure collects (the cap covers measurement, not the run's record)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}

    def collect(limit: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cbsite", "collect", "tests.session_models:mlp", "-o", "width=32", "-o", "batch=4",
             "--memory-limit", limit, "--budget", "0.01", "--no-progress", "--peak-flops", "1e11",
             "--peak-bandwidth", "1e10", "--no-calibrate", "--runs", str(tmp_path / "runs")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)

    for limit in ("350MB", "420MB"):
        done = collect(limit)
        assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
        line = done.stderr.strip().splitlines()
        assert len(line) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
        needed = re.search(r"give --memory-limit (\d+)MiB or more", line[0])
        assert needed and "already holds" in line[0], line
    done = collect(f"{needed[1]}MiB")
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "saved" in done.stdout


def test_an_internal_error_is_not_read_as_a_regression(monkeypatch, capsys):
    """Exit 1 is "a gate rule is broken": a bug's uncaught exception keeps its traceback and exits 3."""
    from cbsite import cli

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli.runs, "cmd_ls", broken)  # the parser is built inside main(): it takes this one
    assert cli.main(["ls", "--runs", "nowhere"]) == cli.INTERNAL_ERROR == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err and "internal error" in err


@pytest.mark.slow
def test_compare_with_a_zero_floor_runs_to_its_verdicts(tmp_path, capsys):
    """`compare --floor 0` failed with a traceback (exit 1, read as "regressed") after its whole session had run."""
    import json

    code = main(["compare", "tests.session_models:mlp", "tests.session_models:mlp", "-B", "width=32", "-H", "width=32",
                 "--floor", "0", "--processes", "2", "--pairs", "2", "--block-time", "0.002", "--budget", "0.01",
                 "--phases", "forward", "--no-step", "--no-progress", "--peak-flops", "1e11", "--peak-bandwidth", "1e10",
                 "--no-calibrate", "--format", "json", "--runs", str(tmp_path / "runs")])
    out = capsys.readouterr()
    assert code == 0 and "Traceback" not in out.err, out.err[-3000:]
    assert json.loads(out.out)  # the diff with its verdicts, as JSON
    from cbsite.diff.comparison import list_comparisons

    (record,) = list_comparisons(tmp_path / "runs")
    assert record["floor"] == 0 and all(c["verdict"]["verdict"] != "unchanged" for c in record["components"])
