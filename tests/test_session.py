"""Measurement sessions on small real models: rounds in fresh processes, paired A/B comparisons, raw
samples, verdicts in the gate, contention and hierarchy checks. Never a wall-clock assertion: the
planted slowdowns are several times the noise, and A/A checks allow for the declared error rates."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import polars as pl
import pytest
import torch

from cbsite import archive, review, schema, stats
from cbsite import gate as cgate
from cbsite.collector import CollectConfig, profile
from cbsite.collector.request import CollectRequest
from cbsite.collector.session.compare import CompareConfig, compare
from cbsite.collector.timing.blocks import Block, summarise
from cbsite.diff import comparison
from cbsite.diff.rundiff import diff_runs
from tests.session_models import mlp

# Paired verdicts and warm-up rules on real timings run alone (`make test`'s serial part), never beside other tests:
# those tests carry SERIAL; the others here (records, memory limits, caps, pure statistics) run in the parallel part.
SERIAL = pytest.mark.serial

PROVIDER = "tests.session_models:mlp"
PLANTED = "layers.1.0"


def _config(**kw):
    base = dict(min_run_time=0.02, warmup=1, calibrate=False, peak_flops=1e11, peak_bandwidth=1e10,
                progress=False, num_threads=1)
    base.update(kw)
    return CollectConfig(**base)


@pytest.fixture(scope="module")
def planted_comparison(tmp_path_factory):
    """One small live session: base vs a head with 3x extra matmul work planted in one Linear."""
    cfg = _config()
    base = CollectRequest(provider=PROVIDER, options={}, model_name="mlp", version="base", batches=1, config=cfg)
    head = CollectRequest(provider=PROVIDER, options={"repeat": 3}, model_name="mlp", version="head", batches=1, config=cfg)
    result = compare(base, head, CompareConfig(processes=3, pairs=4, block_s=0.004))
    root = tmp_path_factory.mktemp("archive")
    result.save(root)
    return result, root


def test_a_session_worker_holds_one_capture_group_at_a_time(monkeypatch):
    """A worker of `compare`/`--rounds` follows the collection's memory plan instead of keeping
    every module's inputs for every batch; with an allowance of nothing, each component is its own group."""
    from cbsite.collector import memory
    from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task
    from cbsite.collector.session.worker import run_process

    monkeypatch.setattr(memory, "MIN_ALLOWANCE", 1)
    monkeypatch.setattr(memory, "EXTRA_FRACTION", 1e-12)
    request = CollectRequest(provider=PROVIDER, options={"width": 32, "batch": 4}, model_name="mlp", version="a",
                             batches=2, config=_config())
    paths = ["layers.0", "layers.0.0", "layers.1.0", "layers.2.1"]
    tasks = tuple(Task(key=p, phase=ph, paths=(("a", p),)) for p in paths for ph in ("forward", "backward"))
    job = ProcessJob(session_id="s", process=0, arms=(ArmSpec(arm="a", request=request),), tasks=tasks, pairs=2,
                     block_s=0.001)
    result = run_process(job)
    assert not result.errors, result.errors
    assert {(s["key"], s["phase"]) for s in result.samples} == {(t.key, t.phase) for t in tasks}
    assert result.capture_groups == len(paths)  # a path's forward and backward share its group
    assert 0 < result.largest_capture_bytes <= 2 * 4 * 32 * 4  # one component's input, two batches
    # Every graph is past that allowance: backward differentiates a fresh graph per block of one call, freeing.
    assert {s["calls"] for s in result.samples if s["phase"] == "backward"} == {1}


def test_a_task_past_the_worker_memory_limit_is_out_of_memory_and_the_worker_goes_on():
    """In a worker process (spawned by the session scheduler) an allocation past the job's memory
    limit fails that task with "out of memory"; the other tasks of the worker are measured."""
    from cbsite.collector.session.scheduler import run_jobs
    from cbsite.collector.session.spec import ArmSpec, ProcessJob, Task

    request = CollectRequest(provider="tests.session_models:greedy", options={}, model_name="g", version="a",
                             batches=1, config=_config())
    tasks = tuple(Task(key=p, phase="forward", paths=(("a", p),)) for p in ("0", "1"))
    job = ProcessJob(session_id="s", process=1, arms=(ArmSpec(arm="a", request=request),), tasks=tasks, pairs=2,
                     block_s=0.001, memory_limit=2**30)
    session = run_jobs([job])
    assert not session.died, session.died
    (result,) = session.results
    assert set(result.errors) == {("1", "forward")} and result.errors[("1", "forward")].startswith("out of memory")
    assert {s["key"] for s in result.samples} == {"0"}

    # A worker the kernel kills (SIGKILL, as the OOM killer does) is a recorded death that says so.
    dying = CollectRequest(provider="tests.session_models:killed", options={}, model_name="k", version="a",
                           batches=1, config=_config())
    session = run_jobs([ProcessJob(session_id="s", process=1, arms=(ArmSpec(arm="a", request=dying),), tasks=tasks)])
    assert not session.results and "SIGKILL" in session.died[1] and "OOM killer" in session.died[1]


@SERIAL
@pytest.mark.slow
def test_planted_slowdown_is_regressed_and_untouched_components_are_not(planted_comparison):
    result, _ = planted_comparison
    v = result.verdicts
    for phase in ("forward", "backward"):
        planted = v[(PLANTED, phase)]
        assert planted.verdict == "regressed", planted.reason
        assert planted.ratio > 1.5 and planted.ci_low > 1.0
        # Modules that do not contain the planted Linear run identical code on both sides (an A/A
        # inside the session): at alpha 1 % with a 5 % floor none may be called regressed or improved.
        for other in ("layers.0.0", "layers.2.0", "layers.0.1", "layers.2.1"):
            assert v[(other, phase)].verdict in ("unchanged", "inconclusive"), (other, phase, v[(other, phase)])
    assert v[("", "forward")].verdict == "regressed"  # the root contains it


@SERIAL
@pytest.mark.slow
def test_comparison_record_and_samples_are_archived_and_readable_without_cbsite(planted_comparison):
    result, root = planted_comparison
    folder = root / comparison.COMPARISONS_DIR / result.record["comparison_id"]
    record = json.loads((folder / "comparison.json").read_text())
    assert record["base"]["run_id"] == result.base.run_id and record["head"]["run_id"] == result.head.run_id
    assert record["processes"] == 3 and record["layout"] == "interleaved" and record["threads"] == 1
    # The raw samples, read with polars and DuckDB alone: both arms, every process, positions 0 and 1.
    samples = pl.read_parquet(folder / "samples.parquet")
    assert set(samples["arm"]) == {"base", "head"}
    assert set(samples["process"]) == {1, 2, 3}
    assert set(samples["position"]) == {0, 1}
    assert (samples["seconds_per_call"] > 0).all() and (samples["calls"] > 0).all()
    duckdb = pytest.importorskip("duckdb")
    n = duckdb.sql(f"select count(*) from read_parquet('{root}/**/samples.parquet')").fetchall()[0][0]
    assert n >= samples.height  # the comparison's samples plus each run's own
    # The runs' latencies are derived from their samples: round 0 here, rounds 1-3 in the workers.
    head = archive.read_run(result.head.path)
    assert head.meta["rounds"] == 4 and head.samples is not None
    assert set(head.samples["process"]) == {0, 1, 2, 3}


@SERIAL
@pytest.mark.slow
def test_diff_uses_the_comparison_and_the_gate_fails_only_on_the_regression(planted_comparison):
    result, root = planted_comparison
    base, head = archive.read_run(result.base.path), archive.read_run(result.head.path)
    rd = diff_runs(base, head, match_moved=True)
    evidence = comparison.evidence_for(root, base, head, {c.path: c.base_path for c in rd.components if c.base_path})
    assert evidence is not None and evidence.paired
    rules = cgate.parse_rules(["layers.*:latency>+10%"])
    gate = cgate.check(rd, rules, latency=evidence)
    broken = {(b.phase, b.path) for b in gate.breaches}
    assert ("forward", PLANTED) in broken and ("backward", PLANTED) in broken
    assert not any(p in ("layers.0.0", "layers.2.0") for _, p in broken)
    assert all(b.verdict["verdict"] == "regressed" for b in gate.breaches)
    text = review.markdown(rd, gate, latency=evidence)
    assert "regressed" in text and "95 % interval" in text and "unchanged" not in text.split("### Gate")[0].split("| component | phase | verdict")[-1].split("\n\n")[0]


@SERIAL
@pytest.mark.slow
def test_latency_rules_are_not_judged_on_single_round_runs(planted_comparison):
    result, _ = planted_comparison
    base, head = result.base, result.head
    # Without the comparison record and with one round per run there is no evidence: not judged.
    base_meta = {**base.meta, "rounds": 1}
    evidence = comparison.from_rounds(base.samples, head.samples, {}, base_meta["rounds"], 1)
    assert evidence is None
    rd = diff_runs(base, head)
    gate = cgate.check(rd, cgate.parse_rules(["latency>+1%", "*:latency>+1%", "flops>+1000%"]), latency=None)
    assert gate.passed and not gate.breaches
    assert len(gate.not_judged) == 2 and all("cbsite compare" in line for line in gate.not_judged)
    assert "not judged" in review.markdown(rd, gate)


@pytest.mark.slow
def test_rounds_repeat_timing_in_fresh_processes(tmp_path):
    model, args = mlp(width=64, batch=16)
    run = profile(model, *args, config=_config(rounds=3, phases=("forward",)))
    assert run.meta["rounds"] == 3 and run.meta["session"]["processes"] == 3
    # Where the wall time went: every stage, the rounds' workers among them, and no more than the wall time.
    stages = run.meta["breakdown_s"]
    top = ("preserve_model", "setup_and_capture", "calibration_start", "components", "hierarchy_remeasure", "rounds",
           "calibration_end_and_peak_checks", "step")
    assert set(top) <= set(stages) and stages["rounds"] > 0
    assert sum(stages[k] for k in top) <= run.meta["wall_time_s"] + 1e-3
    # The re-timing of inverted pairs: its timed blocks are part of its stage.
    assert 0 <= stages["hierarchy_remeasure_timed_blocks"] <= stages["hierarchy_remeasure"] + 1e-3
    parts = ("components_timed_blocks", "components_plugins", "components_capture", "components_quiet_waits",
             "components_counting", "components_memory_peaks", "components_backward_graphs", "components_warm_up",
             "components_block_sizing", "components_other")
    assert sum(stages[k] for k in parts) == pytest.approx(stages["components"], abs=8e-3)
    assert min(stages[k] for k in ("components_counting", "components_memory_peaks")) > 0
    assert stages["components_backward_graphs"] == 0  # a forward-only run builds no graphs
    samples = run.samples
    assert set(samples["process"]) == {0, 1, 2}
    # latency_ms is the median over rounds of each round's median of uncontended blocks.
    row = run.table("forward").filter(pl.col("path") == "layers.0.0").to_dicts()[0]
    per_round = (samples.filter((pl.col("path") == "layers.0.0") & ~pl.col("contended"))
                 .group_by("round").agg(pl.col("seconds_per_call").median()))
    assert math.isclose(row["latency_ms"], per_round["seconds_per_call"].median() * 1e3, rel_tol=1e-9)
    assert any(n.startswith("run-to-run spread") for n in row["notes"])
    saved = archive.read_run(run.save(tmp_path))
    assert saved.samples.height == samples.height and saved.meta["samples"]["rows"] == samples.height


def test_rounds_evidence_judges_two_independent_runs():
    def frame(scale, rounds):
        rows = []
        for r in range(rounds):
            for b in range(5):
                rows.append({"path": "a", "phase": "forward", "round": r, "contended": False,
                             "seconds_per_call": scale * (1 + 0.01 * ((r * 7 + b) % 5))})
        return pl.DataFrame(rows)

    ev = comparison.from_rounds(frame(1.0, 4), frame(1.5, 4), {}, 4, 4)
    assert ev.verdict("a", "forward").verdict == "regressed"
    same = comparison.from_rounds(frame(1.0, 4), frame(1.0, 4), {}, 4, 4)
    assert same.verdict("a", "forward").verdict in ("unchanged", "inconclusive")


def test_version_one_runs_migrate_without_inventing_samples(tmp_path):
    model, args = mlp(width=32, batch=4)
    run = profile(model, *args, config=_config(phases=("forward",)))
    folder = run.save(tmp_path)
    meta = json.loads((folder / "run.json").read_text())
    for key in ("samples", "rounds", "noise", "session", "hierarchy"):
        meta.pop(key, None)
    meta["schema_version"] = 1
    (folder / "run.json").write_text(json.dumps(meta))
    (folder / archive.SAMPLES_FILE).unlink()
    old = archive.read_run(folder)
    assert old.meta["schema_version"] == schema.SCHEMA_VERSION and old.meta["samples"] is None and old.samples is None
    assert "no raw timing samples" in old.meta["samples_note"]


def test_contended_blocks_are_left_out_and_too_few_clean_ones_flag_the_row():
    clean = [Block(1e-3, 10, 0.0, 0.0, False) for _ in range(5)]
    waited = [Block(9e-3, 10, 0.0, 0.008, True) for _ in range(5)]
    median, p25, p75, used, flagged = summarise(clean + waited)
    assert median == 1e-3 and not flagged and used == clean
    median, *_, flagged = summarise(clean[:2] + waited)
    assert flagged and median == 9e-3  # reported as measured, and flagged, never silently


def test_the_sizing_run_that_reaches_a_block_is_kept_as_the_first_block(monkeypatch):
    """Sizing runs grow until one lasts a block (within a tenth); that run is the first timed block, not thrown away:
    every run a block long is among the timing's blocks, all blocks have the same calls, and the sizing's seconds leave it out. Only the
    first run has Timer's in-block warm-up statements before it."""
    from cbsite.collector.timing import blocks

    runs = []
    real = blocks.timed_block

    def recording(timer, number, calls_per_stmt, probe=None, warm=None):
        block = real(timer, number, calls_per_stmt, probe, warm)
        runs.append(block)
        return block

    monkeypatch.setattr(blocks, "timed_block", recording)
    # No block counts as contended: a wait for a quiet machine would add Timer's warm-up before the next block.
    monkeypatch.setattr(blocks, "contended", lambda wait_s, wall_s: False)
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    torch.mm(a, b)  # the process's first matmul initialises its library: a warm call that long would size nothing
    made = []

    def statement():
        made.append(1)
        return torch.mm(a, b)

    cfg = blocks.TimingConfig(min_run_time=0.1, warmup=1)
    timing = blocks.time_fn(statement, 1, cfg)
    # One warm-up call, Timer's in-block warm-up before the first run only (every later run follows a run of the same
    # statement), and the runs' own statements: nothing else ran. (A warm call slowed past a block makes the first run a
    # one-call block, which has no in-block warm-up, and the sizing after it none either.)
    assert len(made) == 1 + blocks.in_block_warmup(runs[0].calls) + sum(r.calls for r in runs)
    long_enough = [r for r in runs if r.seconds_per_call * r.calls >= blocks.SIZED_WITHIN * cfg.block_s()]
    assert long_enough and all(any(r is kept for kept in timing.blocks) for r in long_enough)
    assert timing.blocks[0] is runs[len(runs) - len(timing.blocks)]  # the last sizing run, then the loop's blocks
    assert len({blk.calls for blk in timing.blocks}) == 1 and timing.blocks[0].calls > 1
    assert timing.timed_s == pytest.approx(sum(blk.seconds_per_call * blk.calls for blk in timing.blocks))
    # A guess from a warm call of about a tenth of a block starts the sizing near ten statements, not at one.
    assert blocks.first_guess(cfg.block_s() / 10, cfg.block_s()) == 11 and blocks.first_guess(0.0, 1.0) == 1


def test_a_sizing_run_within_a_tenth_of_a_block_is_the_block_and_guesses_learn_how_warm_calls_mislead(monkeypatch):
    """A run at 0.9 of the target is kept, not doubled; a run short of it sizes the next a tenth over. WarmRatios
    scales a guess by how the statements before ran against their warm calls (median of the last 15), never below
    half, so a statement that does not speed up runs at most about twice a block in its sizing."""
    from cbsite.collector.timing import blocks

    numbers = []

    def fake(timer, number, calls_per_stmt, probe=None, warm=None):  # a statement of 1 ms
        numbers.append(number)
        return blocks.Block(1e-3 / calls_per_stmt, number * calls_per_stmt, 0.0, 0.0, False)

    monkeypatch.setattr(blocks, "timed_block", fake)
    assert blocks.sized_block(None, 0.01, first=9)[0] == 9 and numbers == [9]  # 9 ms of a 10 ms target: a block
    numbers.clear()
    assert blocks.sized_block(None, 0.01, first=4)[0] == 11 and numbers == [4, 11]  # 4 ms: 10/4 x 4, a tenth over
    ratios = blocks.WarmRatios()
    assert ratios.ratio("warm call") == 1.0
    for r in (0.7, 0.8, 0.6):
        ratios.note("warm call", 1.0, r)
    assert ratios.ratio("warm call") == pytest.approx(0.7) and ratios.ratio("run before") == 1.0
    for _ in range(20):
        ratios.note("warm call", 1.0, 0.1)
    assert len(ratios.seen["warm call"]) == ratios.KEEP and ratios.ratio("warm call") == ratios.LOWEST
    # A warm call of a fifth of a block, with statements that ran at 0.1 of theirs (held at half): 1.1 / (0.2 x 0.5).
    assert blocks.first_guess(0.2 * ratios.ratio("warm call"), 1.0) == 11


@SERIAL
def test_a_warm_call_slowed_past_a_block_does_not_make_blocks_of_one_quick_call():
    """A warm call that outlasts a block means one call per block, unless the first such block is far shorter than a
    block: the warm call was slowed, not the statement, and the blocks are sized after all (and counted as sizing)."""
    from cbsite.collector.timing import blocks

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    torch.mm(a, b)
    cfg = blocks.TimingConfig(min_run_time=0.1, warmup=1)
    calls = []

    def statement():
        calls.append(1)
        if len(calls) == 1:
            time.sleep(2 * cfg.block_s())  # the warm call, slowed
        return torch.mm(a, b)

    timing = blocks.time_fn(statement, 1, cfg)
    assert timing.blocks[0].calls > 1 and len({blk.calls for blk in timing.blocks}) == 1
    assert len(timing.blocks) < 100 and timing.sizing_s > 0 and timing.warm_up_s >= 2 * cfg.block_s()
    # A statement that really takes a block still runs one call per block, unsized.
    slow = blocks.time_fn(lambda: time.sleep(cfg.block_s()), 1, cfg)
    assert {blk.calls for blk in slow.blocks} == {1}


def test_the_wait_probe_reads_every_thread_from_kept_files_and_lets_ended_threads_go():
    """contention.run_queue_wait_s keeps each thread's schedstat open between reads: it reads what opening the files
    afresh reads (never less: the counters only grow), and the file of a thread that ended is closed."""
    import os
    import threading

    from cbsite.collector.timing import contention

    if not contention.HAVE_SCHEDSTAT:
        pytest.skip("no per-thread schedstat on this kernel")
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    contention.run_queue_wait_s()
    tid = str(thread.native_id)
    assert tid in contention._open
    fresh = 0
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/schedstat") as f:
            fresh += int(f.read().split()[1])
    assert contention.run_queue_wait_s() >= fresh / 1e9
    done.set()
    thread.join()
    # join() returns when the thread has finished its work; the kernel lists its task a moment longer.
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/self/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    contention.run_queue_wait_s()
    assert tid not in contention._open


def _spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 6: pass"])


@SERIAL
def test_busy_neighbours_never_inflate_a_row_silently(monkeypatch):
    """Two processes spin on both cores during the first seconds of a collection: every row stays within
    3x its quiet latency or says it was contended (never a stall saved silently), waiting for a quiet machine
    as a user's collection does."""
    monkeypatch.setenv("CBSITE_QUIET_WAIT_S", "5")
    model, args = mlp(width=128, batch=32)
    cfg = _config(min_run_time=0.05, num_threads=1)
    quiet = {(r["path"], r["phase"]): r["latency_ms"] for r in profile(model, *args, config=cfg).table().to_dicts()
             if r["status"] == "measured"}
    spinners = [_spinner(), _spinner()]
    try:
        time.sleep(0.3)
        busy = profile(model, *args, config=cfg)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    bad = []
    for r in busy.table().to_dicts():
        q = quiet.get((r["path"], r["phase"]))
        if r["status"] != "measured" or q is None:
            continue
        flagged = any("contended" in n for n in r["notes"] or [])
        if r["latency_ms"] > 3 * q and not flagged:
            bad.append((r["path"], r["phase"], q, r["latency_ms"]))
    assert not bad, bad
    contended = busy.samples.filter(pl.col("contended")).height
    assert contended > 0  # the neighbours were seen


@pytest.mark.slow
def test_model_left_as_found_after_rounds():
    model, args = mlp(width=32, batch=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    profile(model, *args, config=_config(rounds=2, phases=("forward", "backward")))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_stats_verdict_on_session_units_matches_scipy():
    units = [0.10, 0.12, 0.09, 0.11, 0.10, 0.13]
    v = stats.paired(units)
    from scipy import stats as st

    p = st.ttest_1samp(units, 0, alternative="greater").pvalue
    assert math.isclose(v.p_regressed, p, rel_tol=1e-9) and v.verdict == "regressed"


@SERIAL
@pytest.mark.slow
def test_base_rev_compares_two_git_revisions_in_abba_processes(tmp_path, monkeypatch):
    """`--base-rev`: the base side imports the package from a worktree of an older commit, in its own
    processes (the two revisions cannot share one), alternating A B B A."""
    repo = tmp_path / "repo"
    (repo / "toypkg").mkdir(parents=True)
    (repo / "toypkg" / "__init__.py").write_text("")
    source = (__import__("pathlib").Path(__file__).parent / "session_models.py").read_text()
    (repo / "toypkg" / "models.py").write_text(source.replace("def mlp(repeat: int = 0,", "def mlp(repeat: int = 0,"))

    def git(*args):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                       env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"})

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "base")
    # The head revision plants 3x extra matmul work in layers.1.0 by default.
    (repo / "toypkg" / "models.py").write_text(source.replace("def mlp(repeat: int = 0,", "def mlp(repeat: int = 3,"))
    git("commit", "-qam", "head")
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(repo))
    monkeypatch.setenv("PYTHONPATH", str(repo))
    from cbsite.cli import main

    runs = tmp_path / "runs"
    code = main(["compare", "toypkg.models:mlp", "toypkg.models:mlp", "--base-rev", "HEAD~1", "--model", "toy",
                 "--runs", str(runs), "--processes", "10", "--pairs", "3", "--block-time", "0.004", "--budget", "0.02",
                 "--no-progress", "--phases", "forward", "--no-step", "--peak-flops", "1e11", "--peak-bandwidth", "1e10",
                 "--no-calibrate", "--fail-on", "layers.*:latency>+20%"])
    assert code == 1  # the planted slowdown breaks the rule
    record = comparison.list_comparisons(runs)[-1]
    assert record["layout"] == "abba" and record["base"]["sys_path"]
    planted = next(c for c in record["components"] if c["key"] == PLANTED)
    # 10 processes in A B B A ... order are 5 units (neighbour pairs). The rule judges a Holm family of ten components
    # at 1 %, so the planted one needs p < 0.1 % across processes, whose spread (each its own interpreter and heap) is
    # far wider than a session's blocks: with 3 units (df = 2) this test failed in 2 of 3 runs at 313c60d on this
    # project's 2-core machine; with 2, df = 1 cannot reach it whatever the effect.
    assert planted["verdict"]["verdict"] == "regressed" and len(planted["units"]) == 5
    samples = pl.read_parquet(next((runs / comparison.COMPARISONS_DIR).glob("*/samples.parquet")))
    order = samples.group_by("process").agg(pl.col("arm").first()).sort("process")["arm"].to_list()
    assert order == ["base", "head", "head", "base"] * 2 + ["base", "head"]
    untouched = next(c for c in record["components"] if c["key"] == "layers.0.0")
    assert untouched["verdict"]["verdict"] != "regressed"
    # The worktree is gone afterwards.
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1


class _Sleepy(torch.nn.Module):
    """A component that takes 0.2 s a call (sleeping: the cap is about wall time, whatever the cause)."""

    def forward(self, x):
        time.sleep(0.2)
        return x * 2


@SERIAL  # blocks that waited for a CPU do not count, so a busy neighbour adds blocks past the cap's few
def test_the_per_component_cap_bounds_a_slow_component_and_the_row_says_so():
    model = torch.nn.Sequential(_Sleepy(), torch.nn.Linear(4, 4))
    cfg = _config(min_run_time=5.0, max_component_s=1.0, phases=("forward",), warmup=1, step=False)
    run = profile(model, torch.randn(2, 4), config=cfg)
    row = run.table("forward").filter(pl.col("path") == "0").to_dicts()[0]
    assert row["status"] == "measured" and any(n.startswith("cut short") for n in row["notes"])
    blocks = run.samples.filter(pl.col("path") == "0")
    # Timing stopped at the cap: a handful of 0.2 s blocks, not the 25 s the budget asked for.
    assert blocks.height <= 8 and (blocks["seconds_per_call"] * blocks["calls"]).sum() < 2.5
