"""Studies: grid expansion, labels, -k selection, the study record, and sweeps on the local and submitit executors."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbsite import schema
from cbsite import study as cstudy
from cbsite.errors import CbsiteError
from tests.helpers.sweeps import NANO, runs_by_version

# --- grid and labels ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("dense_features=64,512,4096", [64, 512, 4096]),
        ("top_mlp=[16,1],[32,1]", [[16, 1], [32, 1]]),
        ("interaction=dot,dcn", ["dot", "dcn"]),
        ('name="a,b",c', ["a,b", "c"]),
        ("lr=0.5,1e-3", [0.5, 0.001]),
        ("flag=true,false", [True, False]),
        ("pooling_factors={\"a\": 1},2", [{"a": 1}, 2]),
    ],
)
def test_grid_values_split_at_top_level_commas_and_read_as_json(text, values):
    [axis] = cstudy.parse_grid([text])
    assert axis.key == text.split("=", 1)[0] and list(axis.values) == values


@pytest.mark.parametrize(
    ("texts", "problem"),
    [
        (["dense_features"], "not KEY=V1,V2"),
        (["a=1", "a=2"], "given twice"),
        (["a=1,,2"], "empty value"),
        (["a=1,1"], "repeated"),
        (["9x=1"], "not an option name"),
        ([], "no axis"),
    ],
)
def test_bad_grids_are_refused(texts, problem):
    with pytest.raises(CbsiteError, match=problem):
        cstudy.parse_grid(texts)


def test_every_bad_axis_is_reported_at_once():
    with pytest.raises(CbsiteError) as err:
        cstudy.parse_grid(["a", "b=1,1"])
    assert "'a' is not" in str(err.value) and "repeated" in str(err.value)


def test_cross_product_of_two_axes_varies_the_last_axis_fastest():
    axes = cstudy.parse_grid(["dense_features=64,512,4096", "sparse_features=4,32"])
    points = cstudy.expand(axes)
    assert [p.label for p in points] == [
        "dense_features-64.sparse_features-4", "dense_features-64.sparse_features-32",
        "dense_features-512.sparse_features-4", "dense_features-512.sparse_features-32",
        "dense_features-4096.sparse_features-4", "dense_features-4096.sparse_features-32",
    ]
    assert points[3].options == {"dense_features": 512, "sparse_features": 32} and points[3].index == 3


def test_zip_pairs_the_values_and_needs_equal_lengths():
    axes = cstudy.parse_grid(["batch_size=8,16", "top_mlp=[16,1],[32,1]"])
    assert [p.label for p in cstudy.expand(axes, zip_axes=True)] == ["batch_size-8.top_mlp-16x1", "batch_size-16.top_mlp-32x1"]
    with pytest.raises(CbsiteError, match="as many values"):
        cstudy.expand(cstudy.parse_grid(["a=1,2", "b=1"]), zip_axes=True)


@pytest.mark.parametrize(
    ("grid", "label"),
    [
        (["embedding_dim=8"], "embedding_dim-8"),
        (["lr=0.5"], "lr-0.5"),
        (["flag=true"], "flag-true"),
        (["name=a/b c"], "name-a_b_c"),
        # Too long with whole keys: initials; too long even then: an index and a hash.
        (["a_very_long_option_name_one=12345678", "another_very_long_option_name=[1,2,3]"], "avlono-12345678.avlon-1x2x3"),
        (["bottom_mlp=[1024,1024,1024,1024,1024,1024,1024,1024,1024,1024,1024,1024,1024]"], "p0-"),
    ],
)
def test_labels_are_readable_valid_version_names(grid, label):
    [point] = cstudy.expand(cstudy.parse_grid(grid))
    assert point.label.startswith(label) and schema.NAME_RE.match(point.label)


def test_labels_that_would_clash_are_made_unique():
    points = cstudy.expand(cstudy.parse_grid(['name="a b","a_b"']))
    assert len({p.label for p in points}) == 2 and all(schema.NAME_RE.match(p.label) for p in points)


_values = st.one_of(st.integers(-10**6, 10**6), st.sampled_from(["dot", "cat", "dcn", "a b", "x/y"]),
                    st.lists(st.integers(1, 4096), min_size=1, max_size=4), st.booleans(),
                    st.floats(0.001, 1000, allow_nan=False))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,30}", fullmatch=True),
                       st.lists(_values, min_size=1, max_size=4, unique_by=lambda v: json.dumps(v)), min_size=1, max_size=4),
       st.booleans())
def test_expansion_covers_the_grid_with_unique_valid_labels(grid, zipped):
    axes = [cstudy.Axis(k, tuple(v)) for k, v in grid.items()]
    if zipped:
        n = min(len(a.values) for a in axes)
        axes = [cstudy.Axis(a.key, a.values[:n]) for a in axes]
    points = cstudy.expand(axes, zip_axes=zipped)
    expected = list(zip(*(a.values for a in axes))) if zipped else list(itertools.product(*(a.values for a in axes)))
    assert [tuple(p.options[a.key] for a in axes) for p in points] == expected
    assert len({p.label for p in points}) == len(points)
    assert all(schema.NAME_RE.match(p.label) for p in points)


# --- -k selection ---------------------------------------------------------------------------------

LABELS = [p.label for p in cstudy.expand(cstudy.parse_grid(["dense_features=64,512,4096", "sparse_features=4,32"]))]


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        ("512", [2, 3]),
        ("sparse_features-32", [1, 3, 5]),
        ("512 or 4096", [2, 3, 4, 5]),
        ("4096 and not sparse_features-32", [4]),
        ("not (64 or 512)", [4, 5]),
        ("DENSE_FEATURES-64", [0, 1]),  # case-insensitive, as pytest's -k
        ("not not 64", [0, 1]),
        ("nothing", []),
        ("", [0, 1, 2, 3, 4, 5]),
    ],
)
def test_k_expressions_select_like_pytest(expression, selected):
    points = cstudy.expand(cstudy.parse_grid(["dense_features=64,512,4096", "sparse_features=4,32"]))
    assert [p.index for p in cstudy.select(points, expression)] == selected


@pytest.mark.parametrize("expression", ["64 and", "(64", "64)", "and 64", "64 512", "not"])
def test_bad_k_expressions_are_refused(expression):
    with pytest.raises(CbsiteError, match="-k"):
        cstudy.compile_expression(expression)


@given(st.sampled_from(["64", "512", "4096", "sparse_features-4", "sparse_features-32", "x"]),
       st.sampled_from(["64", "512", "sparse_features-32", "dense"]))
def test_k_algebra(a, b):
    m = {e: cstudy.compile_expression(e) for e in (a, b, f"{a} and {b}", f"{a} or {b}", f"not {a}", f"not ({a} or {b})")}
    for label in LABELS:
        assert m[f"{a} and {b}"](label) == (m[a](label) and m[b](label))
        assert m[f"{a} or {b}"](label) == (m[a](label) or m[b](label))
        assert m[f"not {a}"](label) == (not m[a](label))
        assert m[f"not ({a} or {b})"](label) == (not m[a](label) and not m[b](label))  # De Morgan


# --- the record ----------------------------------------------------------------------------------


def test_record_is_written_atomically_and_read_back(tmp_path):
    study = cstudy.Study.from_grid("s1", "dlrm-synthetic", ["dense_features=64,512"], base_options={"size": "tiny"})
    record = cstudy.new_record(study, study.points[:1], {}, {"executor": "local"})
    assert [p["status"] for p in record["points"]] == ["pending", "deselected"]
    path = cstudy.write_record(tmp_path, record)
    assert path == tmp_path / "_studies" / "s1" / "study.json"
    cstudy.update_point(record, study.points[0].label, status="failed", error="boom")
    cstudy.write_record(tmp_path, record)
    assert cstudy.read_record(tmp_path, "s1")["points"][0]["error"] == "boom"
    assert [f.name for f in path.parent.iterdir()] == ["study.json"]  # no temporary file left
    assert [r["name"] for r in cstudy.list_studies(tmp_path)] == ["s1"]
    again = cstudy.new_record(study, study.points, {study.points[1].label: {"run_id": "r", "path": "p"}}, {}, record)
    assert [p["status"] for p in again["points"]] == ["pending", "done"] and again["sweeps"] == 2
    assert again["created_at"] == record["created_at"]


def test_study_names_and_option_clashes_are_checked():
    with pytest.raises(CbsiteError, match="study"):
        cstudy.Study.from_grid("../x", "dlrm", ["a=1"])
    with pytest.raises(CbsiteError, match="both as -o and as --grid"):
        cstudy.Study.from_grid("s", "dlrm", ["embedding_dim=8,16"], base_options={"embedding_dim": 4})


def test_study_folder_is_not_an_invalid_model_folder(tmp_path):
    from cbsite.archive import invalid_folders, list_runs

    cstudy.write_record(tmp_path, cstudy.new_record(cstudy.Study.from_grid("s", "p", ["a=1"]), [], {}, {}))
    assert invalid_folders(tmp_path) == [] and list_runs(tmp_path) == []


def test_core_study_module_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, cbsite.study, cbsite.throughput; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# --- executors -------------------------------------------------------------------------------------


def test_core_sets_are_disjoint_and_refuse_too_many_workers():
    from cbsite.collector.executors import core_sets

    assert core_sets(2, [0, 1, 2, 3, 4]) == [(0, 1), (2, 3)]
    assert core_sets(1, [3, 1]) == [(1, 3)]
    with pytest.raises(CbsiteError, match="cores of its own"):
        core_sets(3, [0, 1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs os.sched_setaffinity (Linux)")
def test_pool_workers_pin_themselves_to_their_own_cores():
    import concurrent.futures
    import multiprocessing

    from cbsite.collector.executors import _init_worker, core_sets

    cores = sorted(os.sched_getaffinity(0))
    workers = min(2, len(cores))
    ctx = multiprocessing.get_context("spawn")
    slots = ctx.Queue()
    for s in core_sets(workers):
        slots.put((s, None))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                                initargs=(slots, True)) as pool:
        # Enough tasks that every worker takes some; each answers with its own affinity and threads.
        seen = {frozenset(f.result()) for f in [pool.submit(os.sched_getaffinity, 0) for _ in range(8)]}
        threads = {f.result() for f in [pool.submit(os.getenv, "OMP_NUM_THREADS") for _ in range(4)]}
    assert all(len(s) == len(cores) // workers for s in seen)
    assert len(seen) <= workers and all(a.isdisjoint(b) for a, b in itertools.combinations(seen, 2))
    assert threads == {str(len(cores) // workers)}


def test_ray_is_optional_with_a_clear_error(monkeypatch):
    import builtins

    from cbsite.collector import executors

    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("no ray")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(CbsiteError, match="needs ray"):
        executors.run_ray([object()], 1, lambda r: None)


@pytest.mark.slow
def test_local_sweep_pins_workers_records_a_failing_point_and_resumes(tmp_path, capsys):
    from cbsite.cli import main

    runs = tmp_path / "runs"
    common = [*NANO, "--runs", str(runs), "--study", "nano", "--grid", "n_layer=1,2,0"]
    # A first sweep "killed" after some points: here, one that ran only the points -k chose.
    assert main(["sweep", *common, "-k", "not n_layer-2", "--workers", "2"]) == 1  # n_layer=0 fails
    record = cstudy.read_record(runs, "nano")
    status = {p["label"]: p for p in record["points"]}
    assert status["n_layer-1"]["status"] == "done" and status["n_layer-2"]["status"] == "deselected"
    assert status["n_layer-0"]["status"] == "failed" and "n_layer" in status["n_layer-0"]["error"]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # each worker pinned to its own core set, torch threads to match
        assert status["n_layer-1"]["affinity"] in record["executor"]["core_sets"]
        assert status["n_layer-1"]["threads"] == len(cores) // 2
    meta = runs_by_version(runs)["n_layer-1"]
    assert {"study:nano", "point:n_layer-1"} <= set(meta["tags"]) and meta["model"] == "nano"
    assert meta["study"] == {"name": "nano", "point": "n_layer-1", "index": 0, "options": {"n_layer": 1}, "axes": ["n_layer"]}
    assert meta["step"]["train"]["status"] == "measured"
    first_run = status["n_layer-1"]["run_id"]
    capsys.readouterr()

    # The whole grid again: the done point is skipped, the rest run (the failing one fails again, recorded).
    assert main(["sweep", *common, "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "1 already done, 2 to run" in out
    record = cstudy.read_record(runs, "nano")
    status = {p["label"]: p for p in record["points"]}
    assert status["n_layer-1"]["run_id"] == first_run and status["n_layer-2"]["status"] == "done"
    assert status["n_layer-0"]["status"] == "failed" and status["n_layer-0"]["attempts"] == 2
    assert sorted(runs_by_version(runs)) == ["n_layer-1", "n_layer-2"]  # one run per point, none twice
    assert main(["sweep", *common, "--list"]) == 0
    listed = capsys.readouterr().out
    assert "n_layer-1  n_layer=1  (done)" in listed and "n_layer-0  n_layer=0\n" in listed


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["local", "debug"])
def test_submitit_executor_runs_points_as_jobs(tmp_path, cluster):
    pytest.importorskip("submitit")
    from cbsite.cli import main

    runs = tmp_path / "runs"
    grid = "n_layer=1,0" if cluster == "local" else "n_layer=0"  # debug runs in this process: only the cheap failure
    code = main(["sweep", *NANO, "--runs", str(runs), "--study", f"sub-{cluster}", "--grid", grid,
                 "--executor", "submitit", "--executor-option", f"cluster={cluster}", "--executor-option", "timeout_min=10"])
    assert code == 1
    record = cstudy.read_record(runs, f"sub-{cluster}")
    status = {p["label"]: p for p in record["points"]}
    assert record["executor"]["executor"] == "submitit" and record["executor"]["cluster"] == cluster
    assert status["n_layer-0"]["status"] == "failed" and status["n_layer-0"]["job_id"]
    if cluster == "local":
        assert status["n_layer-1"]["status"] == "done"
        assert set(runs_by_version(runs)) == {"n_layer-1"}
        assert (runs / "_studies" / "sub-local" / "submitit").is_dir()  # submitit's logs beside the record
