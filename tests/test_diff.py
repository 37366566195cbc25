"""cbsite.diff.rundiff: alignment, attribution, classification, noise and the summary.

Property tests draw random component trees (tests/helpers/runfactory.py) and random revisions of them; the
example tests pin exact numbers on a small two-level model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cbsite import format as cfmt
from cbsite.archive import Run, read_run
from cbsite.diff.rundiff import (
    DIFF_METRICS,
    KINDS,
    ComponentDelta,
    RunDiff,
    diff_runs,
    diff_tables,
)
from cbsite.errors import CbsiteError
from cbsite.tree import parent_path
from tests.helpers.runfactory import SyntheticTree, make_run, revisions, trees, write_archive

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ADDITIVE = ("flops", "param_bytes", "bytes_moved", "latency_ms")
EXACT = ("flops", "param_bytes", "bytes_moved")  # integer counts: compared exactly


def approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-6, abs=1e-9)


def root_total(run: Run, phase: str, metric: str) -> float:
    """The root's per-forward total, read straight from the rows (not through diff)."""
    row = run.rows.filter((run.rows["path"] == "") & (run.rows["phase"] == phase)).row(0, named=True)
    per_call = metric in ("flops", "latency_ms", "bytes_moved")
    return row[metric] * max(row["call_count"], 1) if per_call else row[metric]


def by_path(diff: RunDiff, phase: str = "forward") -> dict[str, ComponentDelta]:
    return {c.path: c for c in diff.for_phase(phase)}


def ancestors(path: str) -> list[str]:
    out = []
    while path != "":
        path = parent_path(path)  # type: ignore[assignment]
        out.append(path)
    return out


# --- properties -----------------------------------------------------------------------------------


@PROPERTY
@given(revisions(), st.booleans())
def test_contributions_sum_to_the_total_delta(pair: tuple[SyntheticTree, SyntheticTree], match_moved: bool) -> None:
    base_tree, head_tree = pair
    base, head = base_tree.run(version="v1"), head_tree.run(version="v2")
    diff = diff_runs(base, head, match_moved=match_moved)
    moves = any(c.kind == "moved" for c in diff.components)
    for phase in ("forward", "backward"):
        components = diff.for_phase(phase)
        for metric in ADDITIVE:
            total = diff.totals[phase][metric]
            # The total delta is the roots' difference, read from the rows independently.
            expected = root_total(head, phase, metric) - root_total(base, phase, metric)
            assert total.delta == approx(expected)
            assert sum(c.self_delta[metric] for c in components) == approx(total.delta)
            if total.delta and metric in EXACT:
                assert sum(c.share[metric] for c in components) == approx(1.0)
            elif not total.delta:
                assert all(c.share[metric] is None for c in components)
            # Every component's delta = its children's deltas + its own (a move changes whose
            # children they are, so this holds only without moves; the sum above always does).
            for c in components if not moves else []:
                children = [k for k in components if k.path != "" and parent_path(k.path) == c.path]
                assert c.delta[metric] == approx(sum(k.delta[metric] for k in children) + c.self_delta[metric])


@PROPERTY
@given(trees(), st.data())
def test_a_change_planted_in_one_leaf_is_attributed_to_it_and_its_ancestors(base_tree: SyntheticTree, data: st.DataObject) -> None:
    leaf = data.draw(st.sampled_from(base_tree.leaves))
    metric = data.draw(st.sampled_from(DIFF_METRICS))
    own = base_tree.metrics[leaf]
    if metric == "latency_ms":
        bump: float = own["latency_ms"] * 2 + 1  # far beyond any IQR of the draw (at most 30 %)
    elif metric == "param_bytes":
        bump = 4 * data.draw(st.integers(1, 10**6))
    else:
        bump = data.draw(st.integers(1, 10**6))
    head_tree = base_tree.with_metrics(leaf, **{metric: own[metric] + bump})
    diff = diff_runs(base_tree.run(version="v1"), head_tree.run(version="v2"))
    comps = by_path(diff)
    calls = own["call_count"] if metric in ("flops", "latency_ms", "bytes_moved") else 1  # param_bytes is static
    expected = bump * calls

    planted = comps[leaf]
    assert planted.kind == "increased"
    assert planted.delta[metric] == approx(expected)
    assert planted.self_delta[metric] == approx(expected)
    line = set(ancestors(leaf))
    for path, c in comps.items():
        if path == leaf:
            continue
        if path in line:
            assert c.self_delta[metric] == approx(0), path  # inherited, not its own
            if metric != "peak_memory_bytes":  # a peak grows at most by the leaf's growth
                assert c.delta[metric] == approx(expected), path
                # A measured ancestor's own (wider) latency spread may call the same change noise.
                assert c.kind == ("unchanged" if c.noise[metric] else "increased"), path
        else:
            assert c.delta[metric] == 0 and c.self_delta[metric] == 0, path
            assert c.kind == "unchanged", path
    if metric != "peak_memory_bytes":
        assert diff.totals["forward"][metric].delta == approx(expected)
        assert planted.share[metric] == approx(1.0)
        assert diff.top(metric)[0].path == leaf


@PROPERTY
@given(trees(), trees(max_depth=2), st.data())
def test_added_and_removed_subtrees_are_counted_with_their_whole_value(
    base_tree: SyntheticTree, sub: SyntheticTree, data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from([p for p in base_tree.paths if p != ""]))
    head_tree = base_tree.without(gone)
    assume(head_tree.containers)
    parent = data.draw(st.sampled_from(head_tree.containers))
    head_tree = head_tree.with_subtree(parent, sub, "new")
    base, head = base_tree.run(version="v1"), head_tree.run(version="v2")
    diff = diff_runs(base, head)

    removed = base_tree.subtree(gone)
    added = [f"{parent}.{p}" if parent else p for p in ["new" + ("." + s if s else "") for s in sub.paths]]
    counts = diff.counts()
    assert counts["removed"] == len(removed)
    assert counts["added"] == len(added)
    assert sum(counts.values()) == len(set(base_tree.paths) | set(head_tree.paths))
    comps = by_path(diff)
    for metric in ("flops", "param_bytes"):
        top_added = comps[added[0]]
        assert top_added.kind == "added" and top_added.delta[metric] == approx(
            top_added.head[metric]  # type: ignore[arg-type]
        )
        assert top_added.base[metric] is None and top_added.status_base is None
        top_removed = comps[gone]
        assert top_removed.kind == "removed" and top_removed.delta[metric] == approx(-top_removed.base[metric])  # type: ignore[operator]
        assert diff.totals["forward"][metric].delta == approx(
            root_total(head, "forward", metric) - root_total(base, "forward", metric)
        )
    # Order: head's pre-order, with each removed component where it was in base.
    order = [c.path for c in diff.for_phase("forward")]
    assert [p for p in order if p in set(head_tree.paths)] == head_tree.paths
    assert [p for p in order if p in set(base_tree.paths)] == base_tree.paths


@PROPERTY
@given(trees())
def test_a_run_diffed_with_itself_is_all_unchanged(tree: SyntheticTree) -> None:
    run = tree.run()
    diff = diff_runs(run, run)
    assert diff.counts() == {**dict.fromkeys(KINDS, 0), "unchanged": len(tree.paths)}
    for c in diff.components:
        assert c.kind == "unchanged" and not c.flagged
        for m in DIFF_METRICS:
            assert c.delta[m] == 0 and c.self_delta[m] == 0 and c.share[m] is None and not c.noise[m]
    for phase_totals in diff.totals.values():
        for total in phase_totals.values():
            assert total.delta == 0 and not total.noise
            assert cfmt.change(total.base, total.head) == "±0%"
    assert diff.top("flops") == []


@PROPERTY
@given(trees(), st.data())
def test_a_latency_change_within_the_combined_iqr_is_noise_beyond_it_a_change(
    tree: SyntheticTree, data: st.DataObject
) -> None:
    leaf = data.draw(st.sampled_from(tree.leaves))
    iqr = data.draw(st.floats(0.02, 0.3))
    latency = tree.metrics[leaf]["latency_ms"]
    base_tree = tree.with_metrics(leaf, iqr=iqr)
    # Widths are iqr x latency on each side, so a change d is noise while |d| <= iqr (2 l + d):
    # |d| <= 2 iqr l / (1 - iqr) upwards, 2 iqr l / (1 + iqr) downwards.
    sign = data.draw(st.sampled_from([1, -1]))
    limit = 2 * iqr * latency / (1 - sign * iqr)
    within = data.draw(st.booleans())
    most = 20 if sign > 0 else 0.99 * latency / limit  # a latency stays positive
    factor = data.draw(st.floats(0.05, 0.95) if within else st.floats(1.05, most))
    head_tree = base_tree.with_metrics(leaf, latency_ms=latency + sign * factor * limit)
    diff = diff_runs(base_tree.run(version="v1"), head_tree.run(version="v2"))
    c = by_path(diff)[leaf]
    assert c.delta["latency_ms"] != 0
    if within:
        assert c.noise["latency_ms"] and c.kind == "unchanged"
        assert c not in diff.top("latency_ms")
    else:
        assert not c.noise["latency_ms"] and c.kind == ("increased" if sign > 0 else "decreased")


# --- a small model, exact numbers -----------------------------------------------------------------

B = 128  # batch
SPEC = {"": {"dense_arch": None, "over_arch": {"over_arch.0": None, "over_arch.1": None}}}


def linear(i: int, o: int, latency: float, peak: int) -> dict[str, Any]:
    return {
        "flops": 2 * B * i * o,
        "param_bytes": (i * o + o) * 4,
        "bytes_moved": 4 * (B * i + B * o + i * o + o),
        "latency_ms": latency,
        "peak_memory_bytes": peak,
        "module_type": "torch.nn.modules.linear.Linear",
    }


def dlrm(version: str, width: int, latency0: float, latency1: float, peak0: int, peak1: int, **kw: Any) -> Run:
    metrics = {
        "": {"module_type": "dlrm.DLRM"},
        "dense_arch": linear(13, 64, 0.02, 100_000),
        "over_arch.0": linear(64, width, latency0, peak0),
        "over_arch.1": linear(width, 1, latency1, peak1),
    }
    return make_run(SPEC, model="dlrm", version=version, metrics=metrics, **kw)


def test_widening_an_over_arch_layer() -> None:
    base = dlrm("v1", 256, 0.05, 0.01, 200_000, 50_000)
    head = dlrm("v2", 1024, 0.15, 0.012, 400_000, 60_000)
    diff = diff_runs(base, head)

    flops = diff.totals["forward"]["flops"]
    assert (flops.base, flops.head) == (212_992 + 4_194_304 + 65_536, 212_992 + 16_777_216 + 262_144)
    assert flops.delta == 12_779_520 and cfmt.change(flops.base, flops.head) == "3.9×"
    params = diff.totals["forward"]["param_bytes"]
    assert (params.base, params.head, params.delta) == (71_172, 273_924, 202_752)
    assert diff.totals["backward"]["flops"].delta == 2 * 12_779_520
    assert diff.totals["backward"]["param_bytes"].delta == 202_752  # static: the same in both phases

    c = by_path(diff)
    assert c["over_arch.0"].delta["flops"] == 12_582_912
    assert c["over_arch.0"].share["flops"] == pytest.approx(12_582_912 / 12_779_520)
    assert c["over_arch.1"].share["flops"] == pytest.approx(196_608 / 12_779_520)
    assert c["over_arch"].delta["flops"] == 12_779_520 and c["over_arch"].self_delta["flops"] == 0
    assert c["dense_arch"].kind == "unchanged" and c["dense_arch"].delta["flops"] == 0
    assert [x.path for x in diff.top("flops")] == ["over_arch.0", "over_arch.1"]
    # Peak memory: the leaf owns the growth, the estimated containers above merely inherit it.
    assert c["over_arch.0"].self_delta["peak_memory_bytes"] == 200_000
    assert c["over_arch"].self_delta["peak_memory_bytes"] == 0 and c[""].delta["peak_memory_bytes"] == 200_000
    assert c["over_arch.0"].share["peak_memory_bytes"] == 1.0
    assert diff.counts() == {"added": 0, "removed": 0, "increased": 4, "decreased": 0, "unchanged": 1, "moved": 0}

    assert diff.summary() == (
        "dlrm v2 vs v1: 3.8× parameter memory (+203 kB), 3.9× forward FLOPs (+12.8 MFLOP), "
        "2.0× forward peak memory (+200 kB), "
        "3.9× backward FLOPs (+25.6 MFLOP), 2.0× backward peak memory (+300 kB), "
        "forward and backward latency not judged (single round). "
        "Most of the forward FLOP growth (98%) is in over_arch.0 (Linear); most of the parameter memory growth (98%) "
        "is in over_arch.0 (Linear); the largest own forward peak memory growth is in over_arch.0 (Linear, +200 kB). "
        "Forward components: 4 increased, 1 unchanged."
    )


def test_a_module_called_twice_counts_twice_but_its_parameters_once() -> None:
    spec = {"": {"shared": None, "other": None}}
    base = make_run(spec, metrics={"shared": {"flops": 100, "param_bytes": 40, "call_count": 2}})
    head = make_run(spec, metrics={"shared": {"flops": 150, "param_bytes": 80, "call_count": 2}}, version="v2")
    c = by_path(diff_runs(base, head))["shared"]
    assert (c.base["flops"], c.head["flops"], c.delta["flops"]) == (200, 300, 100)
    assert (c.base["param_bytes"], c.head["param_bytes"], c.delta["param_bytes"]) == (40, 80, 40)


def test_the_first_changed_metric_decides_increased_or_decreased() -> None:
    spec = {"": {"a": None, "b": None}}
    base = make_run(spec, metrics={"a": {"flops": 100, "latency_ms": 1.0, "iqr": 0.0}, "b": {"latency_ms": 1.0, "iqr": 0.0}})
    head = make_run(
        spec, version="v2", metrics={"a": {"flops": 200, "latency_ms": 0.5, "iqr": 0.0}, "b": {"latency_ms": 0.5, "iqr": 0.0}}
    )
    c = by_path(diff_runs(base, head))
    assert c["a"].kind == "increased"  # FLOPs up beats latency down
    assert c["a"].delta["latency_ms"] == -0.5
    assert c["b"].kind == "decreased"  # only latency changed, beyond its (zero) spread


def test_a_missing_value_is_never_a_silent_zero() -> None:
    spec = {"": {"a": {"a.x": None, "a.y": None}, "b": None}}
    base = make_run(spec)
    head = make_run(spec, version="v2", metrics={"a.x": {"status": "failed"}})
    diff = diff_runs(base, head)
    c = by_path(diff)
    failed = c["a.x"]
    assert failed.status_head == "failed" and failed.flagged
    assert failed.delta["flops"] is None and failed.self_delta["flops"] is None and failed.share["flops"] is None
    assert set(failed.missing) == {"flops", "latency_ms", "bytes_moved", "peak_memory_bytes"}
    assert failed.delta["param_bytes"] == 0  # static: still known
    # The estimated parent lost the child's share: how much of its change is its own is unknown.
    assert c["a"].self_delta["flops"] is None and c["a"].delta["flops"] is not None
    assert c["b"].self_delta["flops"] == 0
    assert not diff.totals["forward"]["flops"].complete and diff.totals["forward"]["param_bytes"].complete
    assert "lack numbers" in diff.summary() and "a.x" in diff.summary()
    json.dumps(diff.to_dict(), allow_nan=False)


def test_single_round_latency_totals_are_not_judged_by_the_within_run_noise() -> None:
    spec = {"": {"a": None}}
    base = make_run(spec, metrics={"": {"status": "measured", "iqr": 0.2}, "a": {"latency_ms": 1.0, "iqr": 0.2}})
    head = make_run(spec, version="v2", metrics={"": {"status": "measured", "iqr": 0.2}, "a": {"latency_ms": 1.1, "iqr": 0.2}})
    diff = diff_runs(base, head)
    total = diff.totals["forward"]["latency_ms"]
    assert total.delta == approx(0.1) and total.noise
    # The within-run IQR stays on the data; the words say what single rounds allow: no judgement.
    assert "forward and backward latency not judged (single round)" in diff.summary()
    assert "within noise" not in diff.summary()
    assert diff.counts()["unchanged"] == 2


def test_moved_components_are_matched_by_structure() -> None:
    base_spec = {"": {"blocks": {"blocks.0": None, "blocks.1": None}, "head": {"head.proj": None}}}
    # blocks -> layers (renamed), head.proj wrapped in head.wrap; blocks.1 also got wider.
    head_spec = {"": {"layers": {"layers.0": None, "layers.1": None}, "head": {"head.wrap": {"head.wrap.proj": None}}}}
    m = {
        "flops": 1000,
        "param_bytes": 400,
        "latency_ms": 0.01,
        "bytes_moved": 100,
        "peak_memory_bytes": 1000,
        "module_type": "torch.nn.modules.linear.Linear",
    }
    base = make_run(base_spec, metrics={"blocks.0": m, "blocks.1": m, "head.proj": {**m, "param_bytes": 800}})
    head = make_run(
        head_spec,
        version="v2",
        metrics={"layers.0": m, "layers.1": {**m, "flops": 3000, "param_bytes": 1200}, "head.wrap.proj": {**m, "param_bytes": 800}},
    )
    plain = diff_runs(base, head)
    assert plain.counts()["added"] == 5 and plain.counts()["removed"] == 4

    diff = diff_runs(base, head, match_moved=True)
    c = by_path(diff)
    assert {p: x.base_path for p, x in c.items() if x.kind == "moved"} == {
        "layers": "blocks",
        "layers.0": "blocks.0",
        "layers.1": "blocks.1",
        "head.wrap.proj": "head.proj",
    }
    assert c["head.wrap"].kind == "added" and c["head.wrap"].self_delta["flops"] == 0  # a wrapper costs nothing
    assert c["layers.1"].delta["flops"] == 2000 and c["layers.1"].self_delta["flops"] == 2000
    assert c["layers.0"].delta["flops"] == 0
    assert diff.counts() == {"added": 1, "removed": 0, "increased": 1, "decreased": 0, "unchanged": 1, "moved": 4}
    for metric in ("flops", "param_bytes"):
        assert sum(x.self_delta[metric] for x in diff.for_phase("forward")) == diff.totals["forward"][metric].delta
        assert c["layers.1"].share[metric] == 1.0


def test_runs_of_different_models_or_phases_are_compared_with_a_warning() -> None:
    spec = {"": {"a": None}}
    base = make_run(spec, model="m1")
    head = make_run(spec, model="m2", version="v2", phases=["forward"])
    diff = diff_runs(base, head)
    assert diff.phases == ["forward"]
    text = diff.summary()
    assert "different models (m1 and m2)" in text and "backward phase is only in the base run" in text
    with pytest.raises(CbsiteError, match="backward phase was not compared"):
        diff.top("flops", "backward")
    with pytest.raises(CbsiteError, match="no phase in common"):
        diff_runs(make_run(spec, phases=["backward"]), head)


def test_user_mistakes_raise_cbsite_errors() -> None:
    run = make_run({"": {"a": None}})
    diff = diff_runs(run, run)
    with pytest.raises(CbsiteError, match="unknown diff metric"):
        diff.top("mfu")
    with pytest.raises(CbsiteError, match="unknown phase"):
        diff.counts("sideways")
    with pytest.raises(CbsiteError, match="lack columns"):
        diff_tables(run.rows.drop("flops"), run.rows)


def test_never_called_container_counts_in_its_parents_estimate() -> None:
    spec = {"": {"layers": {"layers.0": None}}}
    base = make_run(spec, metrics={"layers": {"call_count": 0}, "layers.0": {"flops": 10}})
    head = make_run(spec, version="v2", metrics={"layers": {"call_count": 0}, "layers.0": {"flops": 30}})
    c = by_path(diff_runs(base, head))
    assert c[""].delta["flops"] == c["layers"].delta["flops"] == 20


def test_format_ratio_and_delta() -> None:
    assert cfmt.change(100, 280) == "2.8×"
    assert cfmt.change(100, 139) == "+39%"
    assert cfmt.change(100, 88) == "−12%"
    assert cfmt.change(100, 100) == "±0%"
    assert cfmt.change(100_000, 100_001) == "+0.001%"
    assert cfmt.change(10**9, 10**9 - 1) == "−<0.001%"  # a real change is never shown as ±0%
    assert cfmt.change(0, 5) == "new"
    assert cfmt.change(None, 5) == "n/a"
    assert cfmt.change(100, 1500) == "15×"
    assert cfmt.delta("param_bytes", 12_300_000) == "+12.3 MB"
    assert cfmt.delta("flops", -1_200_000_000) == "−1.2 GFLOP"
    assert cfmt.delta("latency_ms", 0.0123) == "+0.0123 ms"
    assert cfmt.delta("flops", None) == "n/a"


def test_to_dict_is_json_with_a_stable_key_order() -> None:
    base = dlrm("v1", 256, 0.05, 0.01, 200_000, 50_000)
    head = dlrm("v2", 512, 0.08, 0.01, 300_000, 50_000)
    out = diff_runs(base, head).to_dict()
    text = json.dumps(out, allow_nan=False)
    assert json.dumps(diff_runs(base, head).to_dict(), allow_nan=False) == text
    assert list(out) == ["base", "head", "phases", "warnings", "summary", "counts", "totals", "components"]
    first = out["components"][0]
    assert list(first)[:6] == ["path", "base_path", "phase", "module_type", "depth", "kind"]
    assert list(first["delta"]) == list(DIFF_METRICS)
    assert out["base"]["version"] == "v1" and out["totals"]["forward"]["flops"]["delta"] == 2 * B * 64 * 256 + 2 * B * 256


def test_a_diff_of_saved_runs_equals_the_diff_in_memory(tmp_path: Any) -> None:
    base = dlrm("v1", 256, 0.05, 0.01, 200_000, 50_000)
    head = dlrm("v2", 512, 0.08, 0.01, 300_000, 50_000)
    folders = write_archive(tmp_path / "runs", [base, head])
    from_disk = diff_runs(read_run(folders[0]), read_run(folders[1]))
    assert from_disk.to_dict() == diff_runs(base, head).to_dict()


def test_diff_imports_no_torch_and_no_site_library() -> None:
    code = (
        "import sys, cbsite.diff.rundiff\n"
        "bad = [m for m in ('torch', 'jinja2', 'mkdocs', 'altair') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_ancestors_own_share_rounded_on_one_side_only_is_no_change() -> None:
    # The root's own latency (6e-8 ms) rounds to 0 against the head's 63 ms of children but not the base's 21 ms.
    leaf = {"flops": 0, "latency_ms": 10.0, "bytes_moved": 0, "param_bytes": 0, "peak_memory_bytes": 0, "iqr": 0.0,
            "call_count": 2}
    root = {**leaf, "status": "measured", "latency_ms": 5.960464477539063e-08, "call_count": 1}
    base = SyntheticTree(spec={"": {"0": None, "1": None}},
                         metrics={"": root, "0": leaf, "1": {**leaf, "latency_ms": 1.0, "call_count": 1}})
    comps = by_path(diff_runs(base.run(version="v1"), base.with_metrics("0", latency_ms=31.0).run(version="v2")))
    assert comps[""].self_delta["latency_ms"] == 0
    assert comps["0"].self_delta["latency_ms"] == approx(42.0)
