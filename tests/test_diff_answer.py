"""What the diff page leads with, as data: per phase the latency changes that count, largest own change first with
ancestors folded into their leaf; the icicle's default colouring; and the setup changes with the knob first and
per-entry detail folded (numeric order). The browser view of the same is tests/test_browser_diff_answer.py."""

from __future__ import annotations

import json

from cbsite import archive, provenance
from cbsite.diff import rundiff as cdiff
from cbsite.generator import diffdata, latencydata


def _table(i: int) -> dict:
    return {"table": f"t_{i}", "num_embeddings": 100, "embedding_dim": 8, "lookups": 40 + i}


def test_setup_changes_put_the_study_axis_first_and_fold_per_entry_detail():
    base = {"study": {"axes": ["sparse_features"]},
            "provider": {"options": {"sparse_features": 4, "dense_features": 64, "seed": 0},
                         "details": {"tables": [_table(i) for i in range(4)], "total": 4},
                         "sharding": {f"t_cat_{i}": {"type": "row_wise", "ranks": [0, 1]} for i in range(12)}},
            "config": {"batch_size": 8}}
    head = json.loads(json.dumps(base))
    head["provider"]["options"].update(sparse_features=16, seed=1)
    head["provider"]["details"] = {"tables": [_table(i) for i in range(16)], "total": 16}
    head["provider"]["sharding"] = {f"t_cat_{i}": {"type": "table_wise", "ranks": [i % 2]} for i in range(12)}
    head["config"]["batch_size"] = 16
    rows = provenance.setup_changes(base, head)
    keys = [r["key"] for r in rows]
    assert keys[:2] == ["provider.options.sparse_features", "provider.options.seed"], keys  # the axis, then options
    assert keys[2:4] == ["provider.details.total", "config.batch_size"], keys  # then the rest in group order
    # One row per collection and kind of change, entries named first to last in numeric order ([4] before [10]).
    tables = next(r for r in rows if r["key"].startswith("provider.details.tables"))
    assert tables["key"] == "provider.details.tables[4] \u2026 [15]" and tables["entries"] == 12, tables
    assert tables["base"] is None and tables["head"].startswith("12 added (embedding_dim, lookups"), tables
    sharding = next(r for r in rows if r["key"].startswith("provider.sharding"))
    assert sharding["key"] == "provider.sharding.t_cat_0 \u2026 t_cat_11" and sharding["change"] == "changed", sharding
    assert sharding["base"] == "ranks=[0, 1]; type=row_wise", sharding  # all entries agree on the base side
    assert sharding["head"] == "ranks: 2 values; type=table_wise", sharding
    assert len(rows) == 6, keys


def test_setup_changes_keep_a_few_named_options_apart():
    base = {"provider": {"options": {"a1": 1, "b2": 1, "layers": [1, 2]}}}
    head = {"provider": {"options": {"a1": 2, "b2": 2, "layers": [1, 3]}}}
    assert [r["key"] for r in provenance.setup_changes(base, head)] == [
        "provider.options.a1", "provider.options.b2", "provider.options.layers"]


def _dlrm(demo_runs):
    runs = {r.version: archive.read_run(r.path) for r in archive.list_runs(demo_runs) if r.model == "dlrm"}
    base, head = runs["v1"], runs["v2"]
    rd = cdiff.diff_runs(base, head)
    record = next(json.loads(p.read_text()) for p in (demo_runs / "_comparisons").glob("*/comparison.json"))
    return rd, latencydata.judge(record, base, head, rd)


def test_answer_lists_judged_latency_changes_per_phase_with_ancestors_folded(demo_runs):
    rd, judged = _dlrm(demo_runs)
    answer = {a["phase"]: a for a in diffdata.answer(rd, "dlrm", judged)}
    assert set(answer) == {"forward", "backward"}
    comps = {(c.path, c.phase): c for c in rd.components}
    for phase, a in answer.items():
        assert 0 < len(a["latency"]) <= diffdata.ANSWER_N
        owns = []
        for r in a["latency"]:
            c = comps[(r["label"] if r["label"] != "dlrm" else "", phase)]
            v = judged.get(c.path, phase)
            assert v is not None and v.verdict == r["verdict"] in ("regressed", "improved"), r
            assert r["ratio"] == v.ratio and r["ci_low"] <= r["ratio"] <= r["ci_high"], r
            # Listed on its own change: a container whose change is its children's is not listed again.
            assert abs(c.self_delta["latency_ms"]) >= diffdata.FOLD * abs(c.delta["latency_ms"]), r
            owns.append(abs(c.self_delta["latency_ms"]))
        assert owns == sorted(owns, reverse=True)
        assert set(a["growth"]) == {"flops", "peak_memory_bytes"}, a["growth"]
    assert answer["backward"]["latency"][0]["label"] == "sparse_arch.embedding_bag_collection"


def test_default_colouring_is_the_metric_with_the_largest_change_that_counts(demo_runs):
    import math

    rd, judged = _dlrm(demo_runs)
    metric = diffdata.default_colour(rd, judged).removeprefix("delta_")

    def size(m: str) -> float:
        return max(abs(math.log(t[m].head / t[m].base)) for t in rd.totals.values() if t[m].base and t[m].head)

    # Every total changed here (latency judged regressed in both phases): the colouring is the largest of them.
    assert all(size(metric) >= size(m) for m in ("flops", "param_bytes", "peak_memory_bytes", "latency_ms")), metric


def _dlrm_facts(demo_runs):
    runs = {r.version: archive.read_run(r.path) for r in archive.list_runs(demo_runs) if r.model == "dlrm"}
    rd, judged = _dlrm(demo_runs)
    return rd, judged, diffdata.RunFacts.of(rd, runs["v1"], runs["v2"])


def _page_bounds(demo_site, version: str) -> dict:
    """(path, phase) -> the bound a run page shows (its components.json), for dlrm `version`."""
    page = json.loads(next((demo_site / "runs" / "dlrm" / version).glob("*/components.json")).read_text())
    return {(p, ph): page[ph]["bound"][i] for ph in page["phases"] for i, p in enumerate(page["path"])}


def test_answer_gives_each_listed_component_the_bound_its_run_page_shows(demo_runs, demo_site):
    rd, judged, facts = _dlrm_facts(demo_runs)
    base, head = _page_bounds(demo_site, "v1"), _page_bounds(demo_site, "v2")
    listed = 0
    for a in diffdata.answer(rd, "dlrm", judged, facts):
        for r in a["latency"]:
            key = ("" if r["label"] == "dlrm" else r["label"], a["phase"])
            assert r["bound"] == head[key] and r["bound"] in ("compute", "memory", "overhead", "suspect"), r
            assert r["bound_was"] == (base[key] if base[key] != head[key] else None), r
            listed += 1
    assert listed >= 6
    # Where the label changed both are given: the root's forward went from memory- to compute-bound.
    root = facts.bounds.row(rd.get("", "forward"))
    assert (base[("", "forward")], head[("", "forward")]) == ("memory", "compute")
    assert root == {"bound": "compute", "bound_was": "memory", "bound_text": "memory \u2192 compute"}
    # The verdicts listed under "More" carry the same labels.
    latency = diffdata.with_bounds(latencydata.latency_context(judged, rd, "dlrm"), rd, facts)
    assert latency["listed"] and all(r["bound"] == head[(r["path"], r["phase"])] for r in latency["listed"])
